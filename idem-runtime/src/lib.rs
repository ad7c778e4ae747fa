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
//! The [`guide`] is the rest of the documentation: a tutorial, a chapter for
//! each subject (the attribute, the modes, keys, failures, batches, each
//! store, the consumers, HTTP routes, operations), the benchmarks, the design
//! decisions and a glossary. Every sample in it is a doctest of the test
//! suite (one whose server is unreachable skips, as the guide's opening says).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, clippy::unwrap_used)]

#[cfg(any(feature = "_sql", feature = "http"))]
mod boxed;
mod call;
#[cfg(any(feature = "rabbitmq", feature = "nats", feature = "kafka"))]
mod client_tls;
pub mod clock;
mod codec;
#[cfg(feature = "_consume")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "rabbitmq", feature = "nats", feature = "kafka")))
)]
pub mod consume;
mod error;
mod final_error;
mod fingerprint;
#[cfg(any(doc, doctest))]
pub mod guide;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod key;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod outbox;
mod outcome;
pub mod registry;
mod retry_after;
pub mod store;
mod telemetry;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod trace;

pub use error::{BoxError, Contention, Error, StoreError};
pub use final_error::FinalError;
pub use fingerprint::fingerprint;
/// Makes an async handler idempotent: a duplicate of a message gets the
/// first delivery's recorded result instead of running the body again.
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
/// The first parameter decides the mode: the store's transaction
/// (`tx: &mut SqliteTx<'_>`) is transaction mode, anything else lease mode
/// ([`guide::modes`]). A parameter `key: &Key` hands the
/// body its derived key. A parameter `msgs: &[M]` makes a batch handler: one
/// call for the whole batch, one answer per message, in input order
/// ([`guide::batches`]):
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
/// Every argument, the handler shapes the macro takes and how it reads
/// them, and what it refuses at compile time: [`guide::attribute`].
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
