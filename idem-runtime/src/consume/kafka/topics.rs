//! The names of a topic's retry and dead-letter topics, and the headers the
//! consumer reads and writes on their messages.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::message::{Header, Headers, OwnedHeaders};

/// The retry topics' delays, one topic each.
pub use crate::consume::RETRY_DELAYS;

/// The delay of the retry topic a wait of `delay` goes to.
pub(crate) use crate::consume::retry_tier as tier;

/// `<topic>-retry-<delay in ms>`, as Spring Kafka names a retry topic whose
/// delays differ.
pub(crate) fn retry_topic(topic: &str, delay: Duration) -> String {
    format!("{topic}-retry-{}", tier(delay).as_millis())
}

/// `<topic>-dlt`, Spring Kafka's dead-letter topic.
pub(crate) fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}-dlt")
}

/// Failed body runs so far (decimal text).
pub(crate) const FAILURES: &str = "x-idem-failures";
/// Times the message was sent to a retry topic (decimal text).
pub(crate) const RETRIES: &str = "x-idem-retries";
/// Why the message was last retried.
pub(crate) const LAST_ERROR: &str = "x-idem-last-error";
/// When a retry is due, in milliseconds since the Unix epoch (decimal text).
pub(crate) const DUE: &str = "x-idem-due";
/// Why the message was dead-lettered.
pub(crate) const REASON: &str = "x-idem-reason";
/// Where the message was first consumed: topic, partition, offset (text).
pub(crate) const TOPIC: &str = "x-idem-topic";
pub(crate) const PARTITION: &str = "x-idem-partition";
pub(crate) const OFFSET: &str = "x-idem-offset";
/// The first record's timestamp, in milliseconds since the Unix epoch
/// (decimal text): a retry's copy is stamped when it is copied.
pub(crate) const PUBLISHED: &str = "x-idem-published";
/// Spring Kafka's dead-letter headers, in its encodings (strings as UTF-8,
/// the partition a big-endian `i32`, the offset a big-endian `i64`), so the
/// tools that read Spring's dead letters read these.
pub(crate) const DLT_TOPIC: &str = "kafka_dlt-original-topic";
pub(crate) const DLT_PARTITION: &str = "kafka_dlt-original-partition";
pub(crate) const DLT_OFFSET: &str = "kafka_dlt-original-offset";
pub(crate) const DLT_GROUP: &str = "kafka_dlt-original-consumer-group";
pub(crate) const DLT_MESSAGE: &str = "kafka_dlt-exception-message";

/// The headers of one message, as owned name and value pairs, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeaderList(Vec<(String, Option<Vec<u8>>)>);

impl HeaderList {
    pub(crate) fn of(headers: Option<&OwnedHeaders>) -> Self {
        let Some(headers) = headers else {
            return HeaderList::default();
        };
        HeaderList(
            headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect(),
        )
    }

    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    pub(crate) fn number(&self, name: &str) -> Option<u64> {
        self.text(name).and_then(|v| v.trim().parse().ok())
    }

    /// Sets `name` to `value`, replacing what it held.
    pub(crate) fn set(&mut self, name: &str, value: impl AsRef<[u8]>) {
        self.0.retain(|(n, _)| n != name);
        self.0
            .push((name.to_owned(), Some(value.as_ref().to_vec())));
    }

    /// Sets `name` to `value` cut to 4,000 characters (an error message can
    /// be long; a header is no place for all of it).
    pub(crate) fn set_text(&mut self, name: &str, value: &str) {
        let value: String = value.chars().take(4_000).collect();
        self.set(name, value);
    }

    /// Sets `name` to `value` unless it is there already.
    pub(crate) fn keep_or_set(&mut self, name: &str, value: impl AsRef<[u8]>) {
        if !self.0.iter().any(|(n, _)| n == name) {
            self.set(name, value);
        }
    }

    /// The headers as the handler's [`Delivery`](crate::consume::Delivery)
    /// has them (a header without a value as an empty one).
    pub(crate) fn pairs(&self) -> Vec<(String, Vec<u8>)> {
        self.0
            .iter()
            .map(|(n, v)| (n.clone(), v.clone().unwrap_or_default()))
            .collect()
    }

    pub(crate) fn to_owned_headers(&self) -> OwnedHeaders {
        let mut out = OwnedHeaders::new_with_capacity(self.0.len());
        for (key, value) in &self.0 {
            out = out.insert(Header {
                key,
                value: value.as_ref(),
            });
        }
        out
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_goes_to_the_shortest_tier_at_least_as_long() {
        assert_eq!(retry_topic("orders", Duration::ZERO), "orders-retry-100");
        assert_eq!(
            retry_topic("orders", Duration::from_millis(101)),
            "orders-retry-1000"
        );
        assert_eq!(
            retry_topic("orders", Duration::from_secs(5)),
            "orders-retry-5000"
        );
        assert_eq!(
            retry_topic("orders", Duration::from_secs(86_400)),
            "orders-retry-300000"
        );
        assert_eq!(dead_letter_topic("orders"), "orders-dlt");
    }

    #[test]
    fn headers_are_replaced_kept_and_cut() {
        let mut h = HeaderList::default();
        h.set(FAILURES, "1");
        h.set(FAILURES, "2");
        assert_eq!(h.number(FAILURES), Some(2));
        h.keep_or_set(TOPIC, "a");
        h.keep_or_set(TOPIC, "b");
        assert_eq!(h.text(TOPIC), Some("a"));
        h.set_text(REASON, &"x".repeat(10_000));
        assert_eq!(h.text(REASON).map(str::len), Some(4_000));
        let back = HeaderList::of(Some(&h.to_owned_headers()));
        assert_eq!(back.number(FAILURES), Some(2));
        assert_eq!(back.text(TOPIC), Some("a"));
        assert_eq!(h.number(DUE), None);
    }
}
