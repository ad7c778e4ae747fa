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
/// ```
///
/// | argument | meaning |
/// | --- | --- |
/// | `key` | `part (+ part)*`: field paths of the message (`order_id`, `order.id`, `items.0`) or quoted constants (`'deduct'`) |
/// | `ttl` | how long a completed record suppresses duplicates: `90s`, `30m`, `24h`, `7d`, `1h30m` |
/// | `store` | a built-in store's name (`sqlite`, `postgres`, `mysql`, `redis`, `memory`) or the path of a store type of your own (`"crate::Ledger"`) |
/// | `name` | the handler's namespace in the store; defaults to the function's name |
/// | `lease` | lease mode: how long a claim may stay in progress before another consumer may take it over (default `30s`) |
/// | `crate` | the path of `idem_runtime` when it is renamed |
///
/// The handler returns `Result<T, E>` or any alias of it (`io::Result<T>`,
/// `AppResult<T>`, `type Handled = Result<u64, AppError>`); a return type
/// that is not a `Result` is a compile error on that type.
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
pub use store::contract::{
    Claim, Failure, LeaseStore, Standing, StoreTransaction, TxClaim, TxCommit, TxStore,
};
pub use store::memory::MemoryStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::mysql::{MySqlStore, MySqlTx};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::postgres::{PgStore, PgTx};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use store::sql::ClaimOrder;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use store::sqlite::{SqliteStore, SqliteTx};
pub use store::{Inspect, Record, Status, Sweep, Sweeper};
pub use telemetry::metric;

/// What the generated code names. Not public API: it changes without notice.
#[doc(hidden)]
pub mod __private;
