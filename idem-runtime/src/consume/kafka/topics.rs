//! The names of a topic's retry and dead-letter topics, and the headers the
//! consumer reads and writes on their messages.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::message::{Header, Headers, OwnedHeaders};

/// The retry topics' default delays, one topic each.
pub use crate::consume::RETRY_DELAYS;

use crate::consume::tiers;

/// The names of a topic's retry and dead-letter topics, and the retry
/// delays.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    topic: String,
    /// `None`: `<topic>-dlt`.
    pub(crate) dead: Option<String>,
    /// `None`: `<topic>-retry-{ms}`.
    pub(crate) retry_names: Option<String>,
    /// Sorted, whole milliseconds, each once; empty is refused at start.
    pub(crate) delays: Vec<Duration>,
}

impl Names {
    pub(crate) fn new(topic: &str) -> Self {
        Names {
            topic: topic.to_owned(),
            dead: None,
            retry_names: None,
            delays: tiers::normalize(RETRY_DELAYS),
        }
    }

    /// `<topic>-dlt`, Spring Kafka's dead-letter topic, unless named.
    pub(crate) fn dead_letter_topic(&self) -> String {
        match &self.dead {
            Some(name) => name.clone(),
            None => format!("{}-dlt", self.topic),
        }
    }

    /// The tier a wait of `wait` goes to (without tiers, which the consumer
    /// refuses at start, the wait itself).
    pub(crate) fn tier(&self, wait: Duration) -> Duration {
        tiers::tier(&self.delays, wait).unwrap_or(wait)
    }

    /// The retry topic of the tier a wait of `wait` goes to:
    /// `<topic>-retry-<delay in ms>`, as Spring Kafka names a retry topic
    /// whose delays differ, unless named.
    pub(crate) fn retry_topic(&self, wait: Duration) -> String {
        let tier = self.tier(wait);
        match &self.retry_names {
            Some(template) => tiers::expand(template, tier),
            None => format!("{}-retry-{}", self.topic, tier.as_millis()),
        }
    }

    /// Every retry topic, shortest delay first.
    pub(crate) fn retry_topics(&self) -> Vec<String> {
        self.delays.iter().map(|d| self.retry_topic(*d)).collect()
    }

    /// The delay of the retry topic `topic`, if it is one.
    pub(crate) fn tier_of(&self, topic: &str) -> Option<Duration> {
        self.delays
            .iter()
            .copied()
            .find(|d| self.retry_topic(*d) == topic)
    }

    /// Why the topology cannot be declared, if it cannot: no retry delays,
    /// names Kafka refuses, or two roles sharing a topic.
    pub(crate) fn check(&self) -> Result<(), String> {
        tiers::check(&self.delays)?;
        if let Some(template) = &self.retry_names {
            tiers::check_template("retry topic", template)?;
        }
        check_topic("topic", &self.topic)?;
        let dead = self.dead_letter_topic();
        check_topic("dead-letter topic", &dead)?;
        if dead == self.topic {
            return Err(format!(
                "the dead-letter topic {dead:?} is the consumed topic: dead letters would come back"
            ));
        }
        for retry in self.retry_topics() {
            check_topic("retry topic", &retry)?;
            if retry == self.topic || retry == dead {
                return Err(format!(
                    "the retry topic {retry:?} is the consumed topic or the dead-letter topic"
                ));
            }
        }
        Ok(())
    }
}

/// Why Kafka would refuse `name` as a topic's, if it would: empty, `.` or
/// `..`, more than 249 characters, or a character other than ASCII
/// letters, digits, `.`, `_` and `-`.
fn check_topic(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!(
            "the {what} name {name:?} is not a topic name Kafka accepts"
        ));
    }
    if name.len() > 249 {
        return Err(format!(
            "the {what} name {name:?} is longer than Kafka's 249 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "the {what} name {name:?} holds {c:?}: Kafka topic names hold ASCII letters, digits, `.`, `_` and `-` only"
        ));
    }
    Ok(())
}

/// The producer's message id: what [`Delivery::id`](crate::consume::Delivery::id)
/// reads on Kafka, which has no field of its own for one (an outbox relay
/// writes it).
pub(crate) const MESSAGE_ID: &str = "x-idem-message-id";
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
    fn a_wait_goes_to_the_longest_tier_not_longer() {
        let names = Names::new("orders");
        assert_eq!(names.retry_topic(Duration::ZERO), "orders-retry-100");
        assert_eq!(
            names.retry_topic(Duration::from_millis(1_200)),
            "orders-retry-1000"
        );
        assert_eq!(
            names.retry_topic(Duration::from_secs(5)),
            "orders-retry-5000"
        );
        assert_eq!(
            names.retry_topic(Duration::from_secs(86_400)),
            "orders-retry-300000"
        );
        assert_eq!(names.dead_letter_topic(), "orders-dlt");
        assert_eq!(
            names.tier_of("orders-retry-5000"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(names.tier_of("orders"), None);
        assert!(names.check().is_ok());
    }

    #[test]
    fn names_kafka_refuses_are_refused() {
        let with = |f: fn(&mut Names)| {
            let mut n = Names::new("orders");
            f(&mut n);
            n.check().unwrap_err()
        };
        assert!(with(|n| n.delays.clear()).contains("at least one"));
        assert!(with(|n| n.retry_names = Some("orders-wait".into())).contains("{ms}"));
        assert!(with(|n| n.dead = Some("orders dead".into())).contains("' '"));
        assert!(with(|n| n.dead = Some("orders".into())).contains("consumed topic"));
        assert!(with(|n| n.dead = Some("..".into())).contains("not a topic name"));
        assert!(with(|n| n.dead = Some("x".repeat(250))).contains("249"));
        assert!(Names::new("a/b").check().unwrap_err().contains("'/'"));
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
