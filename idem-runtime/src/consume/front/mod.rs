//! The consumer front, shared by every broker: the [`Handler`] shapes a
//! consumer's `run` takes, the one place a message is decoded and its
//! handler called ([`handler`]), and, for the brokers that deliver over a
//! connection (RabbitMQ, NATS JetStream), the driver written once over the
//! small [`Transport`](transport::Transport) trait each of them
//! implements ([`driver`]). Kafka's consumer group drives its partitions
//! itself and calls its handler through the same [`handler::Call`].
//!
//! A new broker is a folder under `consume/` with a `Transport` (or, for a
//! broker that assigns partitions, a driver of its own around
//! [`handler::erase`]) and an entry in the shared broker suite
//! (`tests/tests/common/broker.rs`).

#[cfg(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq"))]
pub(crate) mod driver;
pub(crate) mod handler;
#[cfg(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq"))]
pub(crate) mod transport;

pub use handler::Handler;
