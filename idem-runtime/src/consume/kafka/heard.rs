//! Why librdkafka could not reach a broker: its calls fail with a bare
//! code (`BrokerTransportFailure`), and the reason (a refused connection,
//! a TLS handshake that failed and why) reaches only its error callback.
//! [`Heard`] keeps the last one, so a failure can say it.

use std::sync::Mutex;

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::KafkaError;

use crate::BoxError;

/// A client context that remembers the last failure of a broker
/// connection librdkafka logged, and the last error it reported.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    failed: Mutex<Option<String>>,
    error: Mutex<Option<String>>,
}

impl ClientContext for Heard {
    /// librdkafka's log, as tracing events (target `librdkafka`); a
    /// broker's failure (facility `FAIL`, logged from librdkafka's own
    /// threads as it happens) is kept.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{message}");
            }
            L::Warning => tracing::warn!(target: "librdkafka", facility = fac, "{message}"),
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{message}")
            }
            L::Debug => tracing::debug!(target: "librdkafka", facility = fac, "{message}"),
        }
        if fac == "FAIL" {
            keep(&self.failed, message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", "{error}: {reason}");
        keep(&self.error, reason);
    }
}

impl ConsumerContext for Heard {}

/// librdkafka's log line as a tracing event (target `librdkafka`), at its
/// level.
pub(crate) fn trace(level: RDKafkaLogLevel, fac: &str, message: &str) {
    use RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", facility = fac, "{message}");
        }
        L::Warning => tracing::warn!(target: "librdkafka", facility = fac, "{message}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", facility = fac, "{message}"),
        L::Debug => tracing::debug!(target: "librdkafka", facility = fac, "{message}"),
    }
}

fn keep(slot: &Mutex<Option<String>>, reason: &str) {
    if let Ok(mut last) = slot.lock() {
        *last = Some(reason.to_owned());
    }
}

fn take(slot: &Mutex<Option<String>>) -> Option<String> {
    slot.lock().ok().and_then(|mut last| last.take())
}

impl Heard {
    /// `e`, a failure of `client`, with the last reason librdkafka gave
    /// when there was one. Its log and errors wait in the client's queue
    /// (rust-rdkafka sets `log.queue`): they are served here first.
    pub(crate) fn explain(client: &BaseConsumer<Heard>, e: impl Into<BoxError>) -> BoxError {
        let e = e.into();
        for _ in 0..10 {
            if client.poll(Duration::from_millis(20)).is_none() {
                break;
            }
        }
        let heard = client.context();
        // a connection's failure says why; "all brokers are down" only that
        match take(&heard.failed).or_else(|| take(&heard.error)) {
            Some(reason) => format!("{e}: {reason}").into(),
            None => e,
        }
    }
}
