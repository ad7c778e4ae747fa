//! The stores, and what they share: the record an operator reads back, what
//! an operator asks of a store ([`Inspect`], in [`inspect`]), table name
//! validation and the background sweeper.
//!
//! # Examples
//!
//! Every store can be asked for the record of a key and swept:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{Key, MemoryStore, Sweeper};
//! use std::time::Duration;
//!
//! let store = MemoryStore::new();
//! let key = Key::from_parts(&[&"m-1"])?;
//! assert!(store.record("notify", &key).is_none());
//! let _sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), 1_000);
//! # Ok(()) }
//! ```

pub(crate) mod batch;
pub(crate) mod contract;
pub mod inspect;
pub mod memory;
mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub(crate) mod rules;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod sql;
mod sweep;

pub use crate::key::{InvalidKey, StoredKey};
pub use inspect::{Filter, Forgot, HandlerStats, Inspect, Order, Query, Schema, Stats, Swept};
pub use record::{Record, Status};
pub use rules::LEASE_RAN_OUT;
pub use sweep::{Sweep, Sweeper};
