//! Consumers on real brokers around any idempotent handler (features
//! `rabbitmq`, `nats`, `kafka` and `rocketmq`): decode the payload, call the handler,
//! and turn what it returned into the broker's ack (Kafka: a commit up to
//! it), delayed retry or dead letter.
//!
//! A consumer is started in a few lines, with a closure that calls the
//! rewritten function with its store ([`Handler`]: the message alone, or
//! the message and its [`Delivery`]): see `rabbitmq`, `nats`, `kafka` and
//! `rocketmq`.
//! Each broker is a folder (its consumer, its topology, its dead letters)
//! around one front (`consume/front/`) that every broker shares.
//!
//! # What happens to a delivery
//!
//! [`Verdict::of`] decides, the same way on every broker:
//!
//! | the call returned | verdict |
//! | --- | --- |
//! | `Executed`, `Duplicate` | ack |
//! | `InProgress { retry_after }` | retry after `retry_after`; not a failed attempt |
//! | `Store` | retry after the backoff; not a failed attempt (the store, not the message, is at fault), contention in a transaction-mode body's transaction included (`StoreError::Contention`) |
//! | `Handler` | retry after the backoff; a failed attempt: the one after the last allowed is dead-lettered with the last error |
//! | `LeaseLost`, `NotRecorded` | ack (a redelivery would run the body again), and an error is logged to alert |
//! | `Failed` (a final error, this delivery's or recorded), `Exhausted` (the handler's `max_attempts` used up) | dead letter at once, with the error: no redelivery can pass |
//! | `PayloadMismatch` | dead letter at once, and an error is logged to alert: one key, two payloads |
//! | `KeyMissing`, `Unrecordable`, `Codec` | dead letter at once: no redelivery can change the outcome |
//! | `Config` | stop the consumer and return the error: the build is wrong |
//! | a payload that does not decode | dead letter at once, with serde's reason |
//!
//! Retries never hold a prefetch slot: the delivery is acked and handed back
//! to the broker with a delay (RabbitMQ: a retry queue whose TTL expires it
//! back into the work queue; JetStream: `Nak` with a delay; Kafka: a retry
//! topic, or, for strict order, a wait in place; RocketMQ: a retry topic
//! at one of the broker's delay levels). The wait is the one the
//! verdict asked for, not rounded up to a retry queue's or topic's delay
//! (see [`RETRY_DELAYS`]).
//!
//! # Topology
//!
//! Each consumer declares what it needs (RabbitMQ: retry and dead-letter
//! queues; NATS: the streams and the durable; Kafka: retry and dead-letter
//! topics; RocketMQ: the topic and its retry topic) when it starts, and on its own with `declare()`, for a producer or
//! a deploy step to run before any message is published. The names and the
//! retry delays are settings of the consumer, with the defaults in each
//! module's topology table.

pub mod dead;
mod delivery;
pub(crate) mod front;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
mod meter;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
mod policy;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
mod report;
#[cfg(feature = "rocketmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rocketmq")))]
pub mod rocketmq;
mod shutdown;
mod tiers;
mod verdict;

pub use delivery::{Broker, Delivery};
pub use front::Handler;
pub(crate) use front::handler::Handled;
pub(crate) use meter::Meter;
pub use policy::{Attempts, Policy, RETRY_DELAYS};
pub use report::{ConsumeError, Report};
pub(crate) use report::{Settled, lock};
pub use shutdown::{CancellationToken, shutdown_on, until_ok};
pub(crate) use verdict::StoreHealth;
pub use verdict::Verdict;
