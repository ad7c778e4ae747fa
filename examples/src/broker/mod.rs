//! The brokers the `consume` example runs its scenarios on, one module per
//! broker behind its feature. Each gives a queue, stream or topic of the
//! run's own, a publisher that waits for the broker's confirmation, idem's
//! consumer on it, and the removal of everything the run made.

use std::fmt::Display;
use std::future::Future;

use idem_runtime::consume::{ConsumeError, Policy, Report};
use idem_runtime::{Error, Outcome};
use serde::de::DeserializeOwned;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "rocketmq")]
pub mod rocketmq;

/// An error of any kind, as the examples return them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A broker with a destination of the run's own, named after the run.
pub trait Broker: Sized {
    /// The broker's name, as the command line gives it.
    const NAME: &'static str;

    /// Connects and makes the destination `name` (a queue, a stream, a
    /// topic).
    fn open(name: &str) -> impl Future<Output = Result<Self, BoxError>>;

    /// Publishes `payload`, with `key` as its record key where the broker
    /// has one (Kafka partitions by it), and waits until the broker has it.
    fn publish(&self, key: &str, payload: Vec<u8>) -> impl Future<Output = Result<(), BoxError>>;

    /// idem's consumer of the destination, with `policy`, around `handler`,
    /// until `shutdown` is cancelled: a future to spawn.
    fn consume<M, T, E, F, Fut>(
        &self,
        policy: Policy,
        handler: F,
        shutdown: idem_runtime::consume::CancellationToken,
    ) -> impl Future<Output = Result<Report, ConsumeError>> + Send + 'static
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static;

    /// Removes the destination and what the consumer made next to it
    /// (retry and dead-letter queues, streams or topics).
    fn remove(self) -> impl Future<Output = ()>;
}
