//! The `Idempotency-Key` header on HTTP routes: a tower layer (so an axum
//! `route_layer`) that gives a client's retry the first request's response
//! instead of running it again, on every idem store, after the IETF
//! httpapi draft "The Idempotency-Key HTTP Header Field".
//!
//! **Keys are scoped by the caller.** [`Idempotency::scoped_by`] takes the
//! function that names who sent the request (the authenticated principal,
//! a tenant); a key is only ever matched within its caller's scope, so one
//! client can never be handed another's response. [`Idempotency::unscoped`]
//! shares one namespace between all callers, for internal services.
//!
//! Two modes, as for message handlers:
//!
//! * **Transaction mode** ([`Idempotency::transaction`], SQLite,
//!   PostgreSQL, MySQL): the layer opens the store's transaction and claims
//!   the key in it; the handler writes through the request's
//!   [`RequestTx`]; the response is recorded in that transaction. The
//!   handler's writes and its recorded response commit together or not at
//!   all: a server killed between them leaves neither, and the retry runs
//!   again; killed after the commit, the retry gets the recorded response.
//! * **Lease mode** ([`Idempotency::lease`], every store): the key is
//!   claimed with a lease, the handler runs, its response is recorded.
//!   For handlers whose effects leave the database: pass
//!   [`IdempotencyKey::downstream`] on to the payment provider or the SMS
//!   gateway, so that a handler run again after a crash is deduplicated
//!   there. It holds the caller's scope with the sent key: two callers who
//!   send the same key must not share one key at a provider the server
//!   calls under one account, so not [`IdempotencyKey::sent`].
//!
//! # What a request gets
//!
//! | case | status | recorded |
//! | --- | --- | --- |
//! | a method the route does not take a key on (GET by default) | the handler's | no |
//! | no key, the route requires one | `400`, problem+json | no |
//! | no key, the route does not require one | the handler's | no |
//! | … and the handler takes `IdempotencyKey` or `RequestTx` (not an `Option` of them) | `400`, problem+json ([`NoKey::NotSent`]) | no |
//! | a malformed key (not an sf-string or a token, empty, over 255 characters, two headers) | `400` | no |
//! | the scope function names no caller | `401` | no |
//! | a body over [`max_request_body`](Idempotency::max_request_body) | `413` | no |
//! | the store cannot be reached before the handler runs | `503`, `Retry-After: 1` | no |
//! | a fresh key: the handler's 2xx, 3xx, 4xx (not 408, 409, 425, 429) | the handler's | yes |
//! | a fresh key: the handler's 5xx, 408, 409, 425, 429, or a failed response body | the handler's | no: released, and in transaction mode rolled back |
//! | … with [`recorded_with_server_errors`]: the handler's 5xx but 503 | the handler's | yes; in transaction mode without the handler's writes, which roll back |
//! | the key again with the same request, once recorded | the recorded one, `idempotent-replayed: true` | — |
//! | … recorded without its body (over [`max_stored_body`](Idempotency::max_stored_body)) | the recorded status and headers, empty body, `idempotent-replayed: body-not-stored` | — |
//! | the key again with another request (method, path, query, body by default) | `422` | no |
//! | the key again while the first request runs | `409` with `Retry-After` ([`InFlight::Conflict`]), or the first's response after a wait ([`InFlight::Wait`]) | no |
//! | transaction mode, the commit failed | `503` (nothing of the handler's was committed) | no |
//!
//! The statuses recorded are set per route with
//! [`Idempotency::recorded`]; the default ([`recorded_by_default`]) follows
//! Stripe for what the handler produced (its 4xx are its answer to this
//! request, so a retry gets them again) but releases its 5xx: a server
//! error is taken for a passing one, and in transaction mode nothing of it
//! is committed, so a retry may run. [`recorded_with_server_errors`]
//! records them too, as Stripe does, for APIs whose clients must not run
//! a request again once it failed on the server; in transaction mode such
//! a record keeps the response, not the handler's writes. What failed
//! before the handler ran (every row of the layer's own answers) releases
//! the key.
//!
//! The layer reads the request body whole (to fingerprint it) and the
//! response body whole (to record it): it is for API calls, not for
//! streams.
//!
//! **The claim order decides whether a retry runs its handler.** A
//! transaction-mode route follows its store's claim order: under
//! PostgreSQL's and MySQL's default, `ClaimOrder::Checked`, a retry of a
//! recorded key is answered before the handler; claiming last
//! (`ClaimOrder::Last`), it runs the handler and rolls its writes back
//! before it gets the recorded response; SQLite always claims first. The
//! guide's [HTTP chapter](crate::guide::http) says what each
//! order does to a retry that races the first request.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_runtime::MemoryStore;
//! use idem_runtime::http::Idempotency;
//!
//! let layer = Idempotency::scoped_by("http_send_sms", Duration::from_secs(86_400), |parts| {
//!     parts.headers.get("x-account")?.to_str().ok().map(str::to_owned)
//! })
//! .lease(MemoryStore::new())?;
//! // axum: Router::new().route("/sms", post(send_sms)).route_layer(layer)
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! The guide's [HTTP chapter](crate::guide::http) has a whole server.

mod config;
mod detached;
#[cfg(feature = "axum")]
mod extract;
mod header;
mod lease;
mod problem;
mod service;
mod stored;
mod tx;

pub use config::{
    DEFAULT_GRACE, Fingerprint, Idempotency, InFlight, recorded_by_default,
    recorded_with_server_errors,
};
pub use detached::RunningCalls;
#[cfg(feature = "axum")]
pub use extract::{NoKey, NotBehindTheLayer};
pub use header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, MAX_HEADER_KEY_LEN};
pub use lease::Lease;
pub use service::{
    IdempotencyKey, IdempotencyLayer, IdempotencyService, IdempotentBody, RouteMode,
};
pub use tx::{RequestTx, Transaction, TransactionOver, TxGuard};
