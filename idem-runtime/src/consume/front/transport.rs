//! What a connection-based broker (RabbitMQ, NATS JetStream) does for the
//! front: connect, open a session that hands over messages, and settle each
//! message as its verdict says. Everything else (the connect loop, the
//! concurrency, the call, the delivery's metrics, shutdown) is the
//! driver's, written once; a broker may report what only it can see (the
//! queue's depth) from its session.

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use crate::BoxError;
use crate::consume::dead::Cause;
use crate::consume::delivery::{Broker, Delivery};
use crate::consume::meter::Meter;
use crate::consume::policy::{Attempts, Policy};
use crate::consume::report::ConsumeError;
use crate::consume::tiers::DUE_SLACK;

/// A broker, as the driver ([`run`](super::driver::run)) sees it.
///
/// The settling methods tell the broker what became of one message; each
/// returns `Err` when that did not happen: the broker could not be told, or
/// refused or returned a copy (a retry or dead-letter queue that is gone).
/// The driver then gives the message back with
/// [`give_back`](Transport::give_back), and the broker delivers it again.
pub(crate) trait Transport: Send + Sync + 'static {
    /// A connection to the broker.
    type Connection: Send;
    /// What a session settles its messages through (a channel, a JetStream
    /// context), shared by the tasks of its messages.
    type Link: Clone + Send + Sync + 'static;
    /// A message as the broker's client hands it over.
    type Message: Send + Sync + 'static;

    /// The broker: the metrics' `broker` label, and its name in logs.
    const BROKER: Broker;

    /// The queue, stream or durable the metrics are labelled with.
    fn queue(&self) -> &str;

    /// Attempts, backoff and concurrency.
    fn policy(&self) -> &Policy;

    /// Refuses settings the broker would refuse or misuse, before anything
    /// connects.
    fn check(&self) -> Result<(), ConsumeError>;

    /// Connects to the broker (the driver retries with a growing pause).
    fn connect(&self) -> impl Future<Output = Result<Self::Connection, BoxError>> + Send;

    /// Declares the topology on `conn` and starts taking messages.
    fn open(
        &self,
        conn: &Self::Connection,
        meter: &Meter,
    ) -> impl Future<Output = Result<Session<Self>, Opening>> + Send;

    /// Closes `conn` once its session is over.
    fn close(&self, conn: Self::Connection) -> impl Future<Output = ()> + Send;

    /// What the broker said about `msg`: its payload, its description for
    /// the handler, its attempts so far, when a retry is due.
    fn read<'m>(&self, msg: &'m Self::Message) -> Read<'m>;

    /// Acknowledges `msg`: it took effect, was a duplicate, or nothing a
    /// redelivery could improve.
    fn ack(
        &self,
        link: &Self::Link,
        msg: &Self::Message,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Hands `msg` back to be delivered again after `retry.after`, with its
    /// counts.
    fn retry(
        &self,
        link: &Self::Link,
        msg: &Self::Message,
        retry: Retry<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Moves `msg` to the dead letters with its reason, and acknowledges it.
    fn dead_letter(
        &self,
        link: &Self::Link,
        msg: &Self::Message,
        dead: Dead<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Hands a retry that came back `left` before it is due on to wait the
    /// rest, without a call. Only a broker whose [`read`](Transport::read)
    /// gives a due time is asked to.
    fn forward(
        &self,
        link: &Self::Link,
        msg: &Self::Message,
        left: Duration,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// How close to its due time a retry that came back early may be and
    /// wait out the rest here, holding its slot, rather than be forwarded:
    /// [`DUE_SLACK`] where the broker's shortest wait is short (RabbitMQ's
    /// tiers); RocketMQ's shortest delay level, where a forward would wait
    /// at least that long.
    fn waits_here(&self) -> Duration {
        DUE_SLACK
    }

    /// Gives `msg` back unsettled, to be delivered again (after `after`,
    /// where the broker can wait).
    fn give_back(
        &self,
        msg: &Self::Message,
        after: Option<Duration>,
    ) -> impl Future<Output = ()> + Send;

    /// How often to tell the broker that a body is still running, if it
    /// would otherwise deliver the message again meanwhile.
    fn keep_alive(&self) -> Option<Duration> {
        None
    }

    /// Tells the broker that `msg`'s body is still running.
    fn still_working(&self, msg: &Self::Message) -> impl Future<Output = ()> + Send {
        let _ = msg;
        async {}
    }
}

/// A session the driver takes messages from.
pub(crate) struct Session<T: Transport + ?Sized> {
    /// The messages, until the session is lost.
    pub(crate) messages: BoxStream<'static, Result<T::Message, BoxError>>,
    /// What the messages are settled through.
    pub(crate) link: T::Link,
    /// Asks the broker to send no more (run once the driver stops taking:
    /// at shutdown, at a stop, or after a lost stream).
    pub(crate) stop_taking: BoxFuture<'static, ()>,
    /// Closes the session once its messages are settled.
    pub(crate) closing: BoxFuture<'static, ()>,
}

/// Why a session could not be opened.
pub(crate) enum Opening {
    /// The broker refused the set-up: a new session would meet the same
    /// answer, so the consumer stops with [`ConsumeError::Setup`].
    Refused(BoxError),
    /// A connection lost while declaring, a timeout, a JetStream still
    /// starting: worth another session.
    Lost(BoxError),
}

/// What the broker said about a message.
pub(crate) struct Read<'m> {
    /// The payload the handler's message is decoded from.
    pub(crate) payload: &'m [u8],
    /// What the handler is told about it.
    pub(crate) delivery: Delivery,
    /// Its failures and retries so far.
    pub(crate) attempts: Attempts,
    /// When a retry is due, in milliseconds since the Unix epoch.
    pub(crate) due: Option<u64>,
    /// Messages waiting behind it, where the broker says (the lag gauge).
    pub(crate) waiting: Option<u64>,
}

/// A retry, as its verdict asked for it.
pub(crate) struct Retry<'a> {
    /// The wait before the redelivery.
    pub(crate) after: Duration,
    /// Failed runs of the body so far, this call's included if it failed.
    pub(crate) failures: u32,
    /// Times handed back, this one included.
    pub(crate) retries: u32,
    /// Why.
    pub(crate) reason: &'a str,
}

/// A dead letter, as its verdict asked for it.
pub(crate) struct Dead<'a> {
    /// Why no retry can pass.
    pub(crate) reason: &'a str,
    /// Failed runs of the body so far, this call's included if it failed.
    pub(crate) failures: u32,
    /// The handler, the error's kind and the error alone, for the cause
    /// headers (`consume::dead`'s groups).
    pub(crate) cause: Option<&'a Cause>,
}
