//! # idem: idempotent message handlers by declaration
//!
//! Brokers deliver at least once. A consumer that crashes before its ack, a
//! rebalance or a producer retry hands the same message to a handler again.
//! `#[idempotent]` makes the handler take effect once per business key:
//!
//! ```standalone_crate
//! use idem_runtime::{idempotent, Outcome, SqliteStore, SqliteTx};
//!
//! #[derive(serde::Deserialize)]
//! struct OrderPlaced { order_id: u64, sku: String, qty: i64 }
//!
//! #[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
//! async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<i64, sqlx::Error> {
//!     sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
//!         .bind(msg.qty)
//!         .bind(&msg.sku)
//!         .fetch_one(&mut **tx)
//!         .await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("shop.db")).await?;
//! store.migrate().await?;
//! # sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)").execute(store.pool()).await?;
//! # sqlx::query("INSERT INTO inventory VALUES ('apple', 10)").execute(store.pool()).await?;
//! let msg = OrderPlaced { order_id: 1, sku: "apple".into(), qty: 3 };
//! for _ in 0..5 {
//!     // delivered five times, deducted once
//!     let left = deduct_stock(&store, &msg).await?.into_inner();
//!     assert_eq!(left, 7);
//! }
//! # Ok(()) }
//! ```
//!
//! The attribute rewrites the function: it takes the store where the
//! transaction parameter was, derives the key from the message, claims it,
//! runs the body, records the result and returns an [`Outcome`]: `Executed`
//! the first time, `Duplicate` with the recorded result afterwards.
//!
//! * **Transaction mode** (the first parameter is the store's transaction):
//!   claim, body writes and recorded outcome commit together or not at all.
//! * **Lease mode** (no transaction parameter, or a store without
//!   transactions): the claim is a lease with a fencing token, kept alive
//!   while the body runs; for bodies whose effects leave the database (an
//!   SMS, an HTTP call).
//!
//! What a message that keeps failing, or comes back changed, gets is
//! declared too: `fingerprint = "qty + price"` turns a delivery of a known
//! key with another payload away ([`Error::PayloadMismatch`]),
//! `max_attempts = 5` counts failed deliveries in the store and stops the
//! sixth ([`Error::Exhausted`]), and an error type implementing
//! [`FinalError`] records its final errors for duplicates
//! ([`Error::Failed`]). [`Record`] is what an operator reads back, on every
//! store.
//!
//! A store of your own implements the traits of [`store`], whose page is
//! the contract with a store written in full.
//!
//! See the README for the attribute's arguments, the stores and the design
//! decisions.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, clippy::unwrap_used)]

mod call;
pub mod clock;
mod codec;
#[cfg(feature = "_consume")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "rabbitmq", feature = "nats"))))]
pub mod consume;
mod error;
mod final_error;
mod fingerprint;
#[cfg(any(doc, doctest))]
pub mod guide;
mod key;
mod outcome;
pub mod registry;
mod retry;
pub mod store;
mod telemetry;

pub use error::{BoxError, Error, StoreError};
pub use final_error::FinalError;
pub use fingerprint::fingerprint;
pub use idem_grammar::{format_duration, parse_duration};
/// Makes an async handler idempotent; see the crate docs and the README.
///
/// ```text
/// #[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
/// #[idempotent(key = "message_id", ttl = "7d", store = "memory", lease = "30s", name = "points")]
/// #[idempotent(key = "order_id", ttl = "1d", store = "postgres", fingerprint = "qty + price", max_attempts = 5)]
/// ```
///
/// | argument | meaning |
/// | --- | --- |
/// | `key` | `part (+ part)*`: field paths of the message (`order_id`, `order.id`, `items.0`) or quoted constants (`'deduct'`) |
/// | `ttl` | how long a completed record suppresses duplicates: `90s`, `30m`, `24h`, `7d`, `1h30m` |
/// | `store` | a built-in store's name (`sqlite`, `postgres`, `mysql`, `redis`, `memory`) or the path of a store type of your own (`"crate::Ledger"`) |
/// | `name` | the handler's namespace in the store; defaults to the function's name |
/// | `lease` | lease mode: how long a claim may stay in progress before another consumer may take it over (default `30s`) |
/// | `fingerprint` | what must not change between deliveries of one key: parts in the key's grammar (`qty + price`), of any `serde::Serialize` type, or `"*"` for the whole message; another payload under a recorded key is [`Error::PayloadMismatch`] |
/// | `max_attempts` | an integer from 1 to `u32::MAX`: how many deliveries of one key may fail; the next one gets [`Error::Exhausted`] without running the body; not on a batch handler |
/// | `crate` | the path of `idem_runtime` when it is renamed |
///
/// The handler returns `Result<T, E>` or any alias of it (`io::Result<T>`,
/// `AppResult<T>`, `type Handled = Result<u64, AppError>`); a return type
/// that is not a `Result` is a compile error on that type.
///
/// # Payload fingerprint and attempts
///
/// `fingerprint = "qty + price"` compares deliveries of one key: the parts
/// are read as the key's are (the same paths and roots, checked against the
/// message's fields at compile time), but may be of any `serde::Serialize`
/// type, floats included, and an `Option` part that is `None` is simply a
/// value. `fingerprint = "*"` takes the whole message (a handler with
/// several messages names its parts instead). The digest of the parts (see
/// [`fingerprint()`](crate::fingerprint())) is recorded with the key; a
/// delivery whose digest differs gets [`Error::PayloadMismatch`] and does
/// not run the body: the same key named two different messages.
///
/// `max_attempts = N` counts a key's failed deliveries in its record (with
/// the last error's text); after the `N`-th failure, every delivery of the
/// key, until the ttl has run from that failure, gets [`Error::Exhausted`]
/// without running the body.
/// An error type that implements [`FinalError`] records its final errors
/// whatever `max_attempts` says: they are replayed as [`Error::Failed`].
///
/// Both cost nothing to a handler that does not ask for them: without
/// `fingerprint` nothing is serialized or hashed, and without `max_attempts`
/// a failed delivery leaves nothing behind.
///
/// # Batch handlers
///
/// A handler whose key reads a slice parameter, `msgs: &[M]`, takes a whole
/// batch (a Kafka poll, a prefetch window): the key and the fingerprint are
/// checked against `M`'s fields and derived for each message, the batch's
/// keys are claimed at once, the body runs once, and every outcome is
/// recorded at once. Its `Ok` type is a `Vec<T>`, and the rewritten function
/// returns `Result<Vec<Result<Outcome<T>, Error<E>>>, Error<E>>`: one answer
/// per message, in input order, each what a single call would answer.
///
/// * The body is given only the fresh messages, in input order, through the
///   same parameter, and returns one value per message it was given, in the
///   same order (another number is [`Error::OutcomeCount`]). `M` must be
///   `Clone`: the fresh messages are cloned out of the batch unless all are
///   fresh.
/// * A key the batch holds twice runs once; the later message gets a
///   `Duplicate` of the first's value (or [`Error::PayloadMismatch`] when a
///   declared fingerprint differs). A message whose key has a `None` part
///   gets [`Error::KeyMissing`]; the others run.
/// * A body error fails the whole batch (the outer [`Error::Handler`]) and
///   records nothing, so every message runs again when redelivered. It is
///   never recorded as final ([`FinalError`] is not consulted), and
///   `max_attempts` is a compile error: a failure belongs to no one message.
/// * In transaction mode the body may run again, over the messages still
///   fresh, when another delivery records one of the batch's keys before it
///   commits: parameters beside the batch are taken by reference, or by value
///   when `Copy`. A `&Key` parameter is refused (each message has its own).
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, Error, MemoryStore, Outcome};
///
/// #[derive(Clone)]
/// struct OrderShipped { order_id: u64, region: Option<String> }
///
/// #[idempotent(key = "order_id + region", ttl = "1d", store = "memory")]
/// async fn notify(msgs: &[OrderShipped]) -> Result<Vec<u64>, std::io::Error> {
///     // only the fresh messages, in input order: one value each
///     Ok(msgs.iter().map(|m| m.order_id * 10).collect())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let eu = |order_id| OrderShipped { order_id, region: Some("eu".into()) };
/// notify(&store, &[eu(3)]).await?;
///
/// let batch = [eu(1), eu(2), eu(1), eu(3), OrderShipped { order_id: 4, region: None }];
/// let answers = notify(&store, &batch).await?;
/// assert_eq!(answers[0].as_ref().unwrap(), &Outcome::Executed(10));
/// assert_eq!(answers[1].as_ref().unwrap(), &Outcome::Executed(20));
/// assert_eq!(answers[2].as_ref().unwrap(), &Outcome::Duplicate(10)); // twice in the batch
/// assert_eq!(answers[3].as_ref().unwrap(), &Outcome::Duplicate(30)); // recorded before
/// assert!(matches!(answers[4], Err(Error::KeyMissing { part: "region", .. })));
/// # Ok(()) }
/// ```
///
/// # The key parameter
///
/// A parameter `&Key` lets the body read its derived key. The macro sees
/// paths, not types, so it decides which parameter that is by how it is
/// written:
///
/// * `&idem_runtime::Key` (or `&<crate>::Key` with `crate = "..."`) is always
///   the key parameter;
/// * a bare `&Key` is the key parameter only when no parameter is written
///   `&idem_runtime::Key`, another parameter can be the message, and no key
///   path starts with its name; otherwise it is a message, so an
///   application's own type named `Key` works as the only parameter;
/// * `&some::path::Key` with any other path is a message.
///
/// A bare `&Key` taken for the key parameter that names the application's
/// own type is a compile error on that type, saying to write it with a path
/// (`&crate::Key`).
///
/// # Examples
///
/// Lease mode on the memory store, with its own name and lease, and a body that
/// reads its key to pass it on (here, as an SMS gateway's idempotency key):
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, Key, MemoryStore, Outcome};
///
/// #[derive(serde::Deserialize)]
/// struct OrderShipped { order_id: u64, phone: String }
///
/// #[idempotent(key = "'shipped' + order_id", ttl = "3d", store = "memory", lease = "10s", name = "sms")]
/// async fn notify(msg: &OrderShipped, key: &Key) -> Result<String, std::io::Error> {
///     Ok(format!("sent to {} with idempotency key {}", msg.phone, key.as_str()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let msg = OrderShipped { order_id: 17, phone: "+15550100".into() };
/// // the rewritten function takes the store first
/// let sent = notify(&store, &msg).await?;
/// assert_eq!(sent, Outcome::Executed("sent to +15550100 with idempotency key 7:shipped|2:17".into()));
/// assert!(notify(&store, &msg).await?.is_duplicate());
/// # Ok(()) }
/// ```
///
/// A fingerprint and an attempt limit: a redelivery with another price is
/// refused, and a body that keeps failing runs twice at most:
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, Error, MemoryStore, Outcome};
///
/// #[derive(serde::Serialize)]
/// struct OrderPlaced { order_id: u64, qty: u32, price: f64, coupon: Option<String> }
///
/// #[idempotent(key = "order_id", ttl = "1d", store = "memory", fingerprint = "qty + price")]
/// async fn bill(msg: &OrderPlaced) -> Result<f64, std::io::Error> {
///     Ok(f64::from(msg.qty) * msg.price)
/// }
///
/// #[idempotent(key = "order_id", ttl = "1d", store = "memory", fingerprint = "*", max_attempts = 2)]
/// async fn ship(msg: &OrderPlaced) -> Result<(), std::io::Error> {
///     Err(std::io::Error::other("carrier down"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let msg = OrderPlaced { order_id: 7, qty: 2, price: 9.5, coupon: None };
/// assert_eq!(bill(&store, &msg).await.unwrap(), Outcome::Executed(19.0));
/// assert_eq!(bill(&store, &msg).await.unwrap(), Outcome::Duplicate(19.0));
/// // the same key with another price: refused, the body does not run
/// let repriced = OrderPlaced { price: 9.75, ..msg };
/// assert!(matches!(bill(&store, &repriced).await, Err(Error::PayloadMismatch { .. })));
///
/// assert!(matches!(ship(&store, &repriced).await, Err(Error::Handler { .. })));
/// assert!(matches!(ship(&store, &repriced).await, Err(Error::Handler { .. })));
/// match ship(&store, &repriced).await {
///     Err(Error::Exhausted { failures, last_error, .. }) => {
///         assert_eq!(failures, 2);
///         assert_eq!(last_error.as_deref(), Some("carrier down"));
///     }
///     other => panic!("{other:?}"),
/// }
/// # }
/// ```
///
/// Misuse is a compile error on the offending token:
///
/// ```compile_fail
/// #[derive(serde::Deserialize)]
/// struct Payment { amount: f64 }
///
/// // floats are not key parts: equal amounts can print differently
/// #[idem_runtime::idempotent(key = "amount", ttl = "1h", store = "memory")]
/// async fn pay(msg: &Payment) -> Result<(), std::io::Error> { Ok(()) }
/// ```
pub use idem_macros::idempotent;
pub use key::{Key, KeyBuilder, KeyMissing, KeyPart, MAX_KEY_LEN, PartWriter};
pub use outcome::Outcome;
pub use store::memory::MemoryStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::sql::mysql::{MySqlStore, MySqlTx};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::sql::postgres::{PgStore, PgTx};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use store::sql::sqlite::{SqliteStore, SqliteTx};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use store::sql::{ClaimOrder, RoundTrips};
pub use store::sweep::Sweeper;
pub use store::{Record, Status};
pub use telemetry::metric;

/// What the generated code names. Not public API: it changes without notice.
#[doc(hidden)]
pub mod __private;
