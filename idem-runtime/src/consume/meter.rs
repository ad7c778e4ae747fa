//! What a consumer reports as it goes: its metrics (named in
//! [`metric`](crate::metric)), through the `metrics` facade, labelled with
//! the broker, the queue (stream, topic) and the handler; and what it saw of
//! its store's health, which its store faults' backoff follows.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::delivery::{Broker, Delivery};
use super::{Handled, Settled, StoreHealth};
use crate::telemetry::{Throttle, metric};

/// The metrics of one consumer.
#[derive(Clone)]
pub(crate) struct Meter {
    broker: &'static str,
    queue: Arc<str>,
    /// Warnings that repeat under an outage (settling fails while the
    /// broker is away) are summarised.
    #[cfg_attr(
        not(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq")),
        allow(dead_code)
    )]
    settle_failed: Arc<Throttle>,
    /// Since when calls have been failing in the store.
    pub(crate) store: StoreHealth,
}

/// One delivery being handled: `in_flight` counts it until it is dropped.
pub(crate) struct InFlight {
    broker: &'static str,
    queue: Arc<str>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(metric::CONSUMER_IN_FLIGHT, "broker" => self.broker, "queue" => self.queue.to_string())
            .decrement(1.0);
    }
}

impl Meter {
    pub(crate) fn new(broker: Broker, queue: &str) -> Meter {
        Meter {
            broker: broker.as_str(),
            queue: Arc::from(queue),
            settle_failed: Arc::new(Throttle::new()),
            store: StoreHealth::default(),
        }
    }

    fn queue(&self) -> String {
        self.queue.to_string()
    }

    /// A delivery arrived: counted.
    pub(crate) fn delivered(&self, delivery: &Delivery) {
        let (broker, queue) = (self.broker, self.queue());
        metrics::counter!(metric::CONSUMER_DELIVERIES, "broker" => broker, "queue" => queue.clone())
            .increment(1);
        if delivery.redelivered || delivery.retries > 0 {
            metrics::counter!(metric::CONSUMER_REDELIVERIES, "broker" => broker, "queue" => queue)
                .increment(1);
        }
    }

    /// A delivery is being handled until the guard drops.
    pub(crate) fn in_flight(&self) -> InFlight {
        metrics::gauge!(metric::CONSUMER_IN_FLIGHT, "broker" => self.broker, "queue" => self.queue())
            .increment(1.0);
        InFlight {
            broker: self.broker,
            queue: Arc::clone(&self.queue),
        }
    }

    /// The handler ran (or the payload failed to decode) in `since`.
    pub(crate) fn handled(&self, handled: &Handled, since: Instant) {
        metrics::histogram!(metric::CONSUMER_HANDLE_SECONDS, "broker" => self.broker, "queue" => self.queue(), "handler" => handled.handler)
            .record(since.elapsed().as_secs_f64());
    }

    /// How the delivery ended with the broker.
    pub(crate) fn settled(
        &self,
        handled: &Handled,
        settled: &Settled,
        published_at: Option<SystemTime>,
    ) {
        let (broker, queue, handler, cause) =
            (self.broker, self.queue(), handled.handler, handled.cause);
        let last = match settled {
            Settled::Acked { .. } => {
                metrics::counter!(metric::CONSUMER_ACKS, "broker" => broker, "queue" => queue.clone(), "handler" => handler, "result" => cause)
                    .increment(1);
                true
            }
            Settled::Retried => {
                metrics::counter!(metric::CONSUMER_RETRIES, "broker" => broker, "queue" => queue.clone(), "handler" => handler, "reason" => cause)
                    .increment(1);
                false
            }
            Settled::DeadLettered => {
                metrics::counter!(metric::CONSUMER_DEAD_LETTERS, "broker" => broker, "queue" => queue.clone(), "handler" => handler, "reason" => cause)
                    .increment(1);
                true
            }
            Settled::Unsettled => {
                metrics::counter!(metric::CONSUMER_UNSETTLED, "broker" => broker, "queue" => queue.clone())
                    .increment(1);
                false
            }
            // Not a handler call: consumers do not meter forwards.
            Settled::Stop(_) | Settled::Forwarded => false,
        };
        if !matches!(
            settled,
            Settled::Unsettled | Settled::Stop(_) | Settled::Forwarded
        ) {
            let now = SystemTime::now();
            let unix = now.duration_since(UNIX_EPOCH).unwrap_or_default();
            metrics::gauge!(metric::CONSUMER_LAST_SETTLE, "broker" => broker, "queue" => queue.clone())
                .set(unix.as_secs_f64());
            if let (true, Some(at)) = (last, published_at) {
                let age = now.duration_since(at).unwrap_or_default();
                metrics::histogram!(metric::CONSUMER_END_TO_END_SECONDS, "broker" => broker, "queue" => queue, "handler" => handler)
                    .record(age.as_secs_f64());
            }
        }
    }

    /// Settling failed (the connection went): a warning, summarised when
    /// they repeat.
    #[cfg_attr(
        not(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq")),
        allow(dead_code)
    )]
    pub(crate) fn settle_failed(&self, error: &dyn std::fmt::Display) {
        if let Some(more) = self.settle_failed.admit() {
            tracing::warn!(
                broker = self.broker,
                queue = %self.queue,
                error = %error,
                held_back = more,
                "could not settle a delivery; it comes back from the broker"
            );
        } else {
            tracing::debug!(broker = self.broker, queue = %self.queue, error = %error, "could not settle a delivery");
        }
    }

    /// The consumer reconnected to the broker.
    pub(crate) fn reconnected(&self) {
        metrics::counter!(metric::CONSUMER_RECONNECTS, "broker" => self.broker, "queue" => self.queue())
            .increment(1);
    }

    /// Kafka: the group assigned this consumer partitions.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn rebalanced(&self) {
        metrics::counter!(metric::CONSUMER_REBALANCES, "broker" => self.broker, "queue" => self.queue())
            .increment(1);
    }

    /// Messages waiting for this consumer, as the broker last said.
    pub(crate) fn lag(&self, waiting: u64) {
        metrics::gauge!(metric::CONSUMER_LAG, "broker" => self.broker, "queue" => self.queue())
            .set(waiting as f64);
    }
}
