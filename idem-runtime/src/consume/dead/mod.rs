//! The dead letters of the consumers, for operators: list them, show one,
//! replay them into the queue, subject or topic they came from, purge them.
//! One API on each broker, beside its consumer (`rabbitmq::dead`,
//! `nats::dead`, `kafka::dead`, each behind its feature), and the `idem
//! dead` commands of the CLI on top of it. This module holds what they
//! share: the dead letter, the filter, the groups by cause
//! ([`group`](self#groups)), what a replay or a purge did.
//!
//! | broker | dead letters | id | where a replay goes |
//! | --- | --- | --- | --- |
//! | RabbitMQ | the queue `<queue>.idem.dead` | the `x-idem-dead-id` header (a UUID the consumer writes) | the default exchange, routing key `x-idem-queue` |
//! | NATS JetStream | the stream `<stream>_DEAD` | the dead stream's sequence | the subject `Idem-Subject` |
//! | Kafka | the topic `<topic>-dlt` | `partition:offset` in the dead-letter topic | the topic `x-idem-topic` |
//! | RocketMQ | the topic `%DLQ%<group>` | `x-idem-dead-id` (a UUID) | the topic `x-idem-topic` |
//!
//! Each API takes the name of the dead letters itself (a queue, a stream, a
//! topic), so that a consumer whose dead letters are named otherwise is
//! served too; `default_name` derives today's default from the work queue,
//! stream or topic.
//!
//! # A replay
//!
//! A replay publishes a copy of the dead letter to where it came from, waits
//! for the broker to confirm it (RabbitMQ: publisher confirms; JetStream: the
//! publish acknowledgement; Kafka: `acks=all`), and only then removes the
//! dead letter (RabbitMQ: acks it; JetStream: deletes its sequence; Kafka:
//! records it as replayed, see [`kafka`](self#kafka)). A crash in between
//! leaves the message in both places, never in neither: a replay never loses
//! a message, and idem's keys make the second copy harmless.
//!
//! The copy starts afresh: the counts the consumer keeps in the message
//! (`x-idem-failures`, `x-idem-retries`; on JetStream the delivery count is
//! the server's, new for a new message) and the dead-letter headers (reason,
//! origin, last error) are left out, so it gets a whole new set of attempts.
//! It is counted: `x-idem-replays` (NATS: `Idem-Replays`) is the dead
//! letter's count plus one, so a message replayed and dead-lettered again
//! says how often it was.
//!
//! # Groups
//!
//! Beside the reason, the consumer writes the handler, the error's kind,
//! the error alone, the key and the handler's ttl on each dead letter
//! (the headers are listed in [`cause`](self#cause-headers)). [`groups`]
//! puts dead letters of one handler, kind and [`fingerprint`] (the error
//! with numbers and ids taken out) in one [`Group`], with its counts and
//! when it was first and last seen; [`Selection::group`] selects one for
//! a replay or a purge. Copies of one message (the same origin and
//! payload, dead-lettered twice by a consumer killed in between, or sent
//! twice by its producer) count once as messages, and a replay runs each
//! message once: it removes the later copies without publishing them
//! ([`Replayed::copies`]). On Kafka and RocketMQ, whose ledgers remember
//! what was replayed, a copy of a message an earlier replay ran is removed
//! too. A replay's limit counts what it replays: a copy further on than
//! the limit takes it is left for the next replay (which, on RabbitMQ and
//! NATS, publishes it, and its key answers it as a duplicate). An edited
//! replay publishes its dead letter whatever was replayed before.
//!
//! # Expired keys
//!
//! A dead letter older than its handler's ttl is one whose key's record,
//! and that of a copy that took effect meanwhile, may have expired: its
//! replay would run as a new message, not as a duplicate. A replay leaves
//! such a dead letter where it is, saying so in [`Replayed::skipped`],
//! unless the selection says [`Selection::expired`]; `idem dead replay`
//! reports them (`left ID: ...`) and takes `--expired` to replay them
//! anyway.
//!
//! # Edited replays
//!
//! `replay_edited` (on each broker) replays one dead letter with a
//! corrected payload. The copy carries `x-idem-edited` (NATS:
//! `Idem-Edited`), the digest of the payload it replaced, for good (a dead
//! letter of it shows it as [`DeadLetter::edited`]); Kafka's and
//! RocketMQ's ledgers say `edited`. The consumer handles it as any
//! delivery: its key is derived from the new payload, and a handler with a
//! `fingerprint` compares it with the record of that key like any other
//! delivery's, so an edit that changes a fingerprinted field of a key that
//! has a record is refused as `PayloadMismatch`.
//!
//! # Cause headers
//!
//! | header (RabbitMQ, Kafka, RocketMQ) | NATS | holds |
//! | --- | --- | --- |
//! | `x-idem-handler` | `Idem-Handler` | the handler's registered name |
//! | `x-idem-error-kind` | `Idem-Error-Kind` | [`Error::kind`](crate::Error::kind), or `decode`, `panic` |
//! | `x-idem-error` | `Idem-Error` | the error without the handler or key |
//! | `x-idem-key` | `Idem-Key` | the key, as [`Key::shown`](crate::Key::shown) writes it |
//! | `x-idem-ttl-ms` | `Idem-Ttl-Ms` | the handler's ttl, in ms |
//! | `x-idem-edited` | `Idem-Edited` | on an edited replay's copy: the digest of the payload it replaced |
//!
//! # Filters
//!
//! [`Selection`] selects by ids, by a reason's text, by age, by group, at
//! most so many.
//! A replay or a purge must be given a filter that names something, or
//! [`Selection::all`]: an empty filter is [`DeadLetterError::Unfiltered`], so a
//! slip never replays or deletes everything.
//!
//! # Kafka
//!
//! A Kafka topic cannot lose one record: a replay publishes the copy to the
//! original topic and then writes the dead letter's id (`partition:offset`)
//! to a ledger topic `<dead-letter topic>-replayed` (one partition, created
//! on the first replay). Listing reads the ledger and leaves the replayed
//! out, and a second replay of one id is skipped. The dead-letter topic
//! itself is never written to, so the tools and alerts that read it see
//! only dead letters. A purge of everything deletes the records up to the
//! end of each partition (`DeleteRecords`), where the broker supports it,
//! and [`DeadLetterError::Unsupported`] says so where it does not; a purge
//! of some is always `Unsupported`.

pub(crate) mod cause;
mod group;

use std::collections::HashMap;
use std::time::Duration;

pub(crate) use cause::Cause;
pub use group::{Group, fingerprint, groups};

use super::Broker;
use crate::BoxError;

/// One dead letter, as the broker keeps it.
///
/// | field | RabbitMQ | NATS JetStream | Kafka |
/// | --- | --- | --- | --- |
/// | `id` | `x-idem-dead-id` (older dead letters: a digest of the message) | the dead stream's sequence | `partition:offset` |
/// | `attempts` | `x-idem-failures` | `Idem-Deliveries` | `x-idem-failures` |
/// | `retries` | `x-idem-retries` | `None` | `x-idem-retries` |
/// | `last_error` | `x-idem-last-error` | `None` | `x-idem-last-error` |
/// | `dead_at_ms` | `x-idem-dead-at` | the stream's timestamp | the record's timestamp |
/// | `origin` | `x-idem-queue` | `Idem-Subject` | `x-idem-topic` |
/// | `message_id` | the `message_id` property | `Idem-Original-Msg-Id` | the record key, as text |
/// | `handler`, `error_kind`, `error`, `key`, `ttl`, `edited` | `x-idem-handler`, ... | `Idem-Handler`, ... | `x-idem-handler`, ... |
///
/// (RocketMQ: as Kafka, in its properties; `id` is `x-idem-dead-id`.)
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::Broker;
/// use idem_runtime::consume::dead::DeadLetter;
///
/// let mut d = DeadLetter::new(Broker::Nats, "7", b"{\"id\":1}".to_vec());
/// d.reason = Some("the payload does not decode".into());
/// d.dead_at_ms = Some(1_000);
/// assert_eq!(d.size(), 8);
/// assert_eq!(d.age_ms(61_000), Some(60_000));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The broker it is on.
    pub broker: Broker,
    /// Its id, stable while it is a dead letter: what [`Selection::id`] and
    /// `show` take.
    pub id: String,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// Failed attempts (RabbitMQ, Kafka) or deliveries (JetStream) it had.
    pub attempts: Option<u32>,
    /// Times it was handed back to be retried (RabbitMQ, Kafka).
    pub retries: Option<u32>,
    /// Times it was replayed before (`x-idem-replays`, `Idem-Replays`).
    pub replays: u32,
    /// Why it was last retried.
    pub last_error: Option<String>,
    /// When it was dead-lettered, in ms since the Unix epoch (`None` on a
    /// RabbitMQ dead letter written before `x-idem-dead-at` was).
    pub dead_at_ms: Option<i64>,
    /// The queue, subject or topic it came from, where a replay sends it.
    pub origin: Option<String>,
    /// Its message id (see the table).
    pub message_id: Option<String>,
    /// The handler that dead-lettered it, where the consumer wrote it
    /// (none for a payload that did not decode).
    pub handler: Option<String>,
    /// The error's kind: [`Error::kind`](crate::Error::kind) (`handler_error`,
    /// `failed`, `payload_mismatch`, ...), or `decode`, `panic`.
    pub error_kind: Option<String>,
    /// The error alone, without the handler or the key.
    pub error: Option<String>,
    /// Its key, as [`Key::shown`](crate::Key::shown) writes it.
    pub key: Option<String>,
    /// Its handler's ttl: how long a record of its key lives.
    pub ttl: Option<Duration>,
    /// On a message replayed with a corrected payload: the digest of the
    /// payload it replaced.
    pub edited: Option<String>,
    /// Kafka: the id and place of its replay's copy (`topic/partition:offset`)
    /// when it was replayed already; RocketMQ: `replayed to <topic>` (a
    /// purged one is not shown); elsewhere a replayed dead letter is gone.
    pub replayed_to: Option<String>,
    /// Its headers, values as text, in order.
    pub headers: Vec<(String, String)>,
    /// Its payload, as it is.
    pub payload: Vec<u8>,
}

impl DeadLetter {
    /// A dead letter of `broker` with `id` and `payload`, and nothing else
    /// known; the brokers' readers fill in the rest.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let d = DeadLetter::new(Broker::Kafka, "0:12", Vec::new());
    /// assert_eq!((d.id.as_str(), d.replays), ("0:12", 0));
    /// ```
    pub fn new(broker: Broker, id: impl Into<String>, payload: Vec<u8>) -> Self {
        DeadLetter {
            broker,
            id: id.into(),
            reason: None,
            attempts: None,
            retries: None,
            replays: 0,
            last_error: None,
            dead_at_ms: None,
            origin: None,
            message_id: None,
            handler: None,
            error_kind: None,
            error: None,
            key: None,
            ttl: None,
            edited: None,
            replayed_to: None,
            headers: Vec::new(),
            payload,
        }
    }

    /// The payload's size in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// assert_eq!(DeadLetter::new(Broker::Nats, "1", vec![0; 5]).size(), 5);
    /// ```
    pub fn size(&self) -> usize {
        self.payload.len()
    }

    /// How long it has been a dead letter at `now_ms` (ms since the epoch),
    /// if known; never negative.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let mut d = DeadLetter::new(Broker::Nats, "1", Vec::new());
    /// assert_eq!(d.age_ms(5_000), None);
    /// d.dead_at_ms = Some(2_000);
    /// assert_eq!(d.age_ms(5_000), Some(3_000));
    /// assert_eq!(d.age_ms(1_000), Some(0));
    /// ```
    pub fn age_ms(&self, now_ms: i64) -> Option<u64> {
        self.dead_at_ms
            .map(|at| u64::try_from(now_ms.saturating_sub(at)).unwrap_or(0))
    }

    /// Whether it is older, at `now_ms`, than its handler's ttl: a record
    /// of its key written before it was dead-lettered has expired, so a
    /// replay runs it as a new message. `false` when its time or ttl is not
    /// known.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// use std::time::Duration;
    /// let mut d = DeadLetter::new(Broker::Nats, "1", Vec::new());
    /// d.dead_at_ms = Some(0);
    /// assert!(!d.expired(10_000));
    /// d.ttl = Some(Duration::from_secs(5));
    /// assert!(d.expired(10_000));
    /// assert!(!d.expired(4_000));
    /// ```
    pub fn expired(&self, now_ms: i64) -> bool {
        match (self.age_ms(now_ms), self.ttl) {
            (Some(age), Some(ttl)) => u128::from(age) >= ttl.as_millis(),
            _ => false,
        }
    }

    /// The last header named `name` (names compared ignoring case).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let mut d = DeadLetter::new(Broker::RabbitMq, "1", Vec::new());
    /// d.headers.push(("x-tenant".into(), "acme".into()));
    /// assert_eq!(d.header("X-Tenant"), Some("acme"));
    /// assert_eq!(d.header("x-other"), None);
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The header `name` as an owned text, for the fields read from it.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(dead_code))]
    pub(crate) fn text(&self, name: &str) -> Option<String> {
        self.header(name).map(str::to_owned)
    }

    /// The header `name` as a count.
    #[cfg_attr(not(any(feature = "nats", feature = "kafka")), allow(dead_code))]
    pub(crate) fn count(&self, name: &str) -> Option<u32> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }
}

/// Which dead letters an operation takes: ids, a reason's text, an age,
/// groups, together (all must hold), at most [`limit`](Self::limit) of
/// them, oldest first as the broker keeps them.
///
/// A filter that names nothing selects everything when listing, and is
/// refused by a replay or a purge ([`DeadLetterError::Unfiltered`]) unless
/// it is [`Selection::all`].
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::{Broker, dead::{DeadLetter, Selection}};
/// use std::time::Duration;
///
/// let mut d = DeadLetter::new(Broker::Nats, "4", Vec::new());
/// d.reason = Some("the payload does not decode as Order".into());
/// d.dead_at_ms = Some(0);
/// let now = 3_600_000;
///
/// assert!(Selection::new().reason("DOES NOT DECODE").matches(&d, now));
/// assert!(Selection::new().older_than(Duration::from_secs(600)).matches(&d, now));
/// assert!(!Selection::new().older_than(Duration::from_secs(7_200)).matches(&d, now));
/// assert!(Selection::new().id("4").id("5").matches(&d, now));
/// assert!(!Selection::new().id("5").reason("decode").matches(&d, now));
/// assert!(!Selection::new().is_selective() && Selection::all().is_selective());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    all: bool,
    ids: Vec<String>,
    reason: Option<String>,
    older_than: Option<Duration>,
    groups: Vec<String>,
    expired: bool,
    /// An edited replay's: its one dead letter is published with its new
    /// payload, never removed as a copy.
    edit: bool,
    limit: Option<usize>,
}

impl Selection {
    /// A filter that names nothing: everything, for a listing.
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::new();
    /// assert!(!f.is_selective());
    /// ```
    pub fn new() -> Self {
        Selection::default()
    }

    /// Every dead letter, for a replay or a purge of all of them.
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::all();
    /// assert!(f.is_selective() && f.is_all());
    /// ```
    pub fn all() -> Self {
        Selection {
            all: true,
            ..Selection::default()
        }
    }

    /// Also the dead letter `id` (ids add up: any of them).
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::new().id("0:3").id("1:7");
    /// assert_eq!(f.ids(), ["0:3", "1:7"]);
    /// ```
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.ids.push(id.into());
        self
    }

    /// Only those whose reason holds `text` (ignoring case).
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::new().reason("out of stock");
    /// assert!(f.is_selective());
    /// ```
    pub fn reason(mut self, text: impl Into<String>) -> Self {
        self.reason = Some(text.into());
        self
    }

    /// Only those dead-lettered at least `age` ago (one whose time is not
    /// known is not taken).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let f = idem_runtime::consume::dead::Selection::new().older_than(Duration::from_secs(600));
    /// assert!(f.is_selective());
    /// ```
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Also the dead letters of the group `id` ([`Group::id`]; groups add
    /// up: any of them).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::{DeadLetter, Selection}};
    /// let mut d = DeadLetter::new(Broker::Nats, "1", Vec::new());
    /// d.error = Some("out of stock for o-1".into());
    /// assert!(Selection::new().group(d.group()).matches(&d, 0));
    /// assert!(!Selection::new().group("000000000000").matches(&d, 0));
    /// ```
    pub fn group(mut self, id: impl Into<String>) -> Self {
        self.groups.push(id.into());
        self
    }

    /// Lets a replay take dead letters older than their handler's ttl
    /// ([`DeadLetter::expired`]), which it otherwise leaves, saying why.
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::all().expired();
    /// assert!(f.takes_expired());
    /// ```
    pub fn expired(mut self) -> Self {
        self.expired = true;
        self
    }

    /// Whether a replay takes dead letters older than their handler's ttl.
    ///
    /// # Examples
    ///
    /// See [`Selection::expired`].
    pub fn takes_expired(&self) -> bool {
        self.expired
    }

    /// At most `n` of them, the oldest first.
    ///
    /// # Examples
    ///
    /// ```
    /// let f = idem_runtime::consume::dead::Selection::all().limit(10);
    /// assert_eq!(f.max(), Some(10));
    /// ```
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// The ids named.
    ///
    /// # Examples
    ///
    /// See [`Selection::id`].
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The limit, if any.
    ///
    /// # Examples
    ///
    /// See [`Selection::limit`].
    pub fn max(&self) -> Option<usize> {
        self.limit
    }

    /// Whether this is [`Selection::all`] with nothing else (no id, reason,
    /// age, group or limit): every dead letter.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::dead::Selection;
    /// assert!(Selection::all().is_all());
    /// assert!(!Selection::all().limit(3).is_all());
    /// assert!(!Selection::new().is_all());
    /// ```
    pub fn is_all(&self) -> bool {
        self.all
            && self.ids.is_empty()
            && self.reason.is_none()
            && self.older_than.is_none()
            && self.groups.is_empty()
            && self.limit.is_none()
    }

    /// Whether it names something (ids, a reason, an age, a group) or is
    /// [`Selection::all`]: what a replay or a purge needs.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::dead::Selection;
    /// assert!(Selection::new().id("3").is_selective());
    /// assert!(!Selection::new().limit(3).is_selective());
    /// ```
    pub fn is_selective(&self) -> bool {
        self.all
            || !self.ids.is_empty()
            || self.reason.is_some()
            || self.older_than.is_some()
            || !self.groups.is_empty()
    }

    /// Whether `dead` is selected at `now_ms` (ms since the epoch); the
    /// limit is the caller's to count.
    ///
    /// # Examples
    ///
    /// See [`Selection`].
    pub fn matches(&self, dead: &DeadLetter, now_ms: i64) -> bool {
        if !self.ids.is_empty() && !self.ids.contains(&dead.id) {
            return false;
        }
        if let Some(text) = &self.reason {
            let reason = dead.reason.as_deref().unwrap_or_default().to_lowercase();
            if !reason.contains(&text.to_lowercase()) {
                return false;
            }
        }
        if let Some(age) = self.older_than {
            let at_least = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
            if dead.age_ms(now_ms).is_none_or(|a| a < at_least) {
                return false;
            }
        }
        if !self.groups.is_empty() && !self.groups.contains(&dead.group()) {
            return false;
        }
        true
    }

    /// `Err(Unfiltered)` unless [`is_selective`](Self::is_selective).
    #[cfg_attr(not(feature = "_consume"), allow(dead_code))]
    pub(crate) fn check(&self, operation: &'static str) -> Result<(), DeadLetterError> {
        if self.is_selective() {
            Ok(())
        } else {
            Err(DeadLetterError::Unfiltered { operation })
        }
    }

    /// Whether `taken` reached the limit.
    #[cfg_attr(not(feature = "_consume"), allow(dead_code))]
    pub(crate) fn full(&self, taken: usize) -> bool {
        self.limit.is_some_and(|n| taken >= n)
    }

    /// What a replay does with `dead` at `now_ms`, given what it did so
    /// far (`done`): nothing when this selection does not take it; remove
    /// it as a copy of a message this replay replayed; publish it back to
    /// its origin. One taken but left (it names no `place` to go back to,
    /// its `header` is missing; it is older than its handler's ttl) is
    /// noted in `done` as skipped.
    #[cfg_attr(not(feature = "_consume"), allow(dead_code))]
    pub(crate) fn take(
        &self,
        dead: &DeadLetter,
        now_ms: i64,
        (place, header): (&str, &str),
        done: &mut Replayed,
    ) -> Option<Take> {
        if !self.matches(dead, now_ms) {
            return None;
        }
        if let Some(of) = done.replayed_as.get(&dead.message_digest())
            && !self.edit
        {
            return Some(Take::Copy { of: of.clone() });
        }
        let Some(origin) = dead.origin.clone() else {
            done.skipped.push(Skipped::new(
                dead.id.clone(),
                format!("it names no {place} to go back to ({header})"),
            ));
            return None;
        };
        if dead.expired(now_ms) && !self.expired {
            let ttl = dead.ttl.unwrap_or_default();
            done.skipped.push(Skipped::new(
                dead.id.clone(),
                format!(
                    "it is older than its handler's ttl ({}s): a record of its key may have expired, and a replay would run it as a new message; replay it with --expired (Selection::expired) to run it anyway",
                    ttl.as_secs()
                ),
            ));
            return None;
        }
        Some(Take::Replay { to: origin })
    }
}

/// What a replay does with one dead letter [`Selection::take`] takes.
#[cfg_attr(not(feature = "_consume"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// Publish a copy to `to`, then remove it (or note it replayed).
    Replay {
        /// The queue, subject or topic it came from.
        to: String,
    },
    /// Remove it without publishing: a copy of the dead letter `of`, which
    /// this replay replayed.
    Copy {
        /// The dead letter replayed.
        of: String,
    },
}

/// One dead letter replayed: its id, where its copy went, and the copy's
/// replay count.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::Replay;
/// let r = Replay::new("0:4", "orders", 1);
/// assert_eq!((r.id.as_str(), r.to.as_str(), r.replays), ("0:4", "orders", 1));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replay {
    /// The dead letter's id.
    pub id: String,
    /// The queue, subject or topic the copy was published to.
    pub to: String,
    /// The copy's `x-idem-replays` (`Idem-Replays`).
    pub replays: u32,
    /// Whether the copy carries a corrected payload (`replay_edited`).
    pub edited: bool,
}

impl Replay {
    /// A replay of `id` to `to`, the `replays`-th.
    ///
    /// # Examples
    ///
    /// See [`Replay`].
    pub fn new(id: impl Into<String>, to: impl Into<String>, replays: u32) -> Self {
        Replay {
            id: id.into(),
            to: to.into(),
            replays,
            edited: false,
        }
    }
}

/// A dead letter a replay left where it is, and why (no origin to send it
/// to; Kafka: replayed already).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::Skipped;
/// let s = Skipped::new("3", "it names no origin (Idem-Subject)");
/// assert!(s.why.contains("origin"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// The dead letter's id.
    pub id: String,
    /// Why it was not replayed.
    pub why: String,
}

impl Skipped {
    /// `id`, left because `why`.
    ///
    /// # Examples
    ///
    /// See [`Skipped`].
    pub fn new(id: impl Into<String>, why: impl Into<String>) -> Self {
        Skipped {
            id: id.into(),
            why: why.into(),
        }
    }
}

/// A dead letter a replay removed without publishing it: a copy of one
/// it replayed (the same origin and payload, see [`groups`]).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::CopyOf;
/// let c = CopyOf::new("0:7", "0:3");
/// assert_eq!((c.id.as_str(), c.of.as_str()), ("0:7", "0:3"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyOf {
    /// The copy's id.
    pub id: String,
    /// The id of the dead letter replayed in its place.
    pub of: String,
}

impl CopyOf {
    /// `id`, a copy of `of`.
    ///
    /// # Examples
    ///
    /// See [`CopyOf`].
    pub fn new(id: impl Into<String>, of: impl Into<String>) -> Self {
        CopyOf {
            id: id.into(),
            of: of.into(),
        }
    }
}

/// What a replay did.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::{Replay, Replayed, Skipped};
/// let mut done = Replayed::default();
/// done.replayed.push(Replay::new("1", "orders.placed", 1));
/// done.skipped.push(Skipped::new("2", "no origin"));
/// assert_eq!((done.count(), done.skipped.len()), (1, 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replayed {
    /// The dead letters replayed, in the order they were.
    pub replayed: Vec<Replay>,
    /// The ones removed as copies of a message replayed (each message runs
    /// once).
    pub copies: Vec<CopyOf>,
    /// The ones selected but left.
    pub skipped: Vec<Skipped>,
    /// The message digests replayed, with the dead letter each was
    /// replayed as.
    replayed_as: HashMap<String, String>,
}

impl Replayed {
    /// Notes that `dead` was replayed as `replay`.
    pub(crate) fn note(&mut self, dead: &DeadLetter, replay: Replay) {
        self.replayed_before(dead);
        self.replayed.push(replay);
    }

    /// Notes that `dead` was replayed by an earlier replay (Kafka's and
    /// RocketMQ's ledgers keep them), so that a copy of it left behind is
    /// removed rather than run again.
    pub(crate) fn replayed_before(&mut self, dead: &DeadLetter) {
        self.replayed_as
            .entry(dead.message_digest())
            .or_insert_with(|| dead.id.clone());
    }

    /// How many were replayed.
    ///
    /// # Examples
    ///
    /// See [`Replayed`].
    pub fn count(&self) -> usize {
        self.replayed.len()
    }
}

/// One dead letter to replay with a corrected payload, for
/// `replay_edited` on each broker (see the [module docs](self#edited-replays)).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::Edit;
/// let edit = Edit::new("0:4", br#"{"id":"o-7","qty":2}"#.to_vec());
/// assert_eq!(edit.id(), "0:4");
/// assert!(!edit.selection().takes_expired());
/// assert!(edit.expired().selection().takes_expired());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    id: String,
    payload: Vec<u8>,
    expired: bool,
}

impl Edit {
    /// The dead letter `id`, to be replayed with `payload` instead of its
    /// own.
    ///
    /// # Examples
    ///
    /// See [`Edit`].
    pub fn new(id: impl Into<String>, payload: Vec<u8>) -> Self {
        Edit {
            id: id.into(),
            payload,
            expired: false,
        }
    }

    /// Replays it even when it is older than its handler's ttl
    /// ([`Selection::expired`]).
    ///
    /// # Examples
    ///
    /// See [`Edit`].
    pub fn expired(mut self) -> Self {
        self.expired = true;
        self
    }

    /// The dead letter's id.
    ///
    /// # Examples
    ///
    /// See [`Edit`].
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The corrected payload.
    ///
    /// # Examples
    ///
    /// ```
    /// let edit = idem_runtime::consume::dead::Edit::new("3", b"{}".to_vec());
    /// assert_eq!(edit.payload(), b"{}");
    /// ```
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The selection of its dead letter: its id, one at most.
    ///
    /// # Examples
    ///
    /// See [`Edit`].
    pub fn selection(&self) -> Selection {
        let mut one = Selection::new().id(self.id.clone()).limit(1);
        one.edit = true;
        if self.expired { one.expired() } else { one }
    }

    /// `done`, or [`DeadLetterError::NotFound`] when the replay found no
    /// dead letter `id` in `name`.
    #[cfg_attr(not(feature = "_consume"), allow(dead_code))]
    pub(crate) fn found(&self, done: Replayed, name: &str) -> Result<Replayed, DeadLetterError> {
        if done.replayed.is_empty() && done.skipped.is_empty() && done.copies.is_empty() {
            return Err(DeadLetterError::NotFound {
                name: name.to_owned(),
                id: self.id.clone(),
            });
        }
        Ok(done)
    }
}

/// How a payload an edited replay replaced is named in `x-idem-edited`:
/// `sha256:` and 16 hex digits of its SHA-256.
///
/// # Examples
///
/// ```
/// let named = idem_runtime::consume::dead::payload_digest(b"{}");
/// assert!(named.starts_with("sha256:") && named.len() == 23);
/// ```
pub fn payload_digest(payload: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    let hash = Sha256::digest(payload);
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// What a purge did: how many dead letters it removed, and their ids when
/// it took them one by one (a purge of everything at once, by the broker's
/// own purge, knows only the count).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::Purged;
/// let p = Purged::default();
/// assert_eq!((p.purged, p.ids.len()), (0, 0));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purged {
    /// How many were removed.
    pub purged: u64,
    /// Their ids, when known.
    pub ids: Vec<String>,
}

/// Why a dead-letter operation failed.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::{DeadLetterError, Selection};
/// let e = DeadLetterError::Unfiltered { operation: "replay" };
/// assert!(e.to_string().contains("Selection::all"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// The broker could not be reached.
    #[error("cannot reach {broker} at {at}: {source}")]
    Unreachable {
        /// Which broker.
        broker: Broker,
        /// Its address, without a password.
        at: String,
        /// What the client said.
        #[source]
        source: BoxError,
    },
    /// The dead-letter queue, stream or topic does not exist.
    #[error("{broker} has no {kind} `{name}`")]
    Missing {
        /// Which broker.
        broker: Broker,
        /// `queue`, `stream` or `topic`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// No dead letter has that id.
    #[error("no dead letter `{id}` in `{name}`")]
    NotFound {
        /// The dead letters' queue, stream or topic.
        name: String,
        /// The id asked for.
        id: String,
    },
    /// The id is not of the broker's form (JetStream: a sequence; Kafka:
    /// `partition:offset`).
    #[error("`{id}` is not a dead-letter id of {broker}: {expected}")]
    BadId {
        /// Which broker.
        broker: Broker,
        /// The id given.
        id: String,
        /// What an id looks like there.
        expected: &'static str,
    },
    /// A replay or purge with a filter that names nothing.
    #[error(
        "a {operation} needs a filter that names something (ids, a reason, an age) or Selection::all()"
    )]
    Unfiltered {
        /// `replay` or `purge`.
        operation: &'static str,
    },
    /// The broker cannot do it (Kafka: removing one record; a broker
    /// without `DeleteRecords`).
    #[error("{broker} cannot {what}: {why}")]
    Unsupported {
        /// Which broker.
        broker: Broker,
        /// What was asked.
        what: String,
        /// Why not, and what to do instead.
        why: String,
    },
    /// The broker failed the operation.
    #[error("{broker}: {source}")]
    Broker {
        /// Which broker.
        broker: Broker,
        /// What the client said.
        #[source]
        source: BoxError,
    },
}

impl DeadLetterError {
    #[cfg_attr(not(feature = "_consume"), allow(dead_code))]
    pub(crate) fn broker(broker: Broker, source: impl Into<BoxError>) -> Self {
        DeadLetterError::Broker {
            broker,
            source: source.into(),
        }
    }
}

/// `url` without the password of its user part.
#[cfg_attr(not(any(feature = "rabbitmq", feature = "nats")), allow(dead_code))]
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            // A user part without a colon may be a token (`nats://TOKEN@host`).
            let kept = user.find(':').map_or("", |colon| &user[..=colon]);
            format!("{}{kept}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Milliseconds since the Unix epoch, now.
#[cfg_attr(not(feature = "_consume"), allow(dead_code))]
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_left_out_of_addresses() {
        assert_eq!(
            redacted("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redacted("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redacted("nats://s3cret@host"), "nats://***@host");
    }

    #[test]
    fn a_limit_alone_selects_nothing_to_replay() {
        assert!(Selection::new().limit(5).check("replay").is_err());
        assert!(Selection::all().check("purge").is_ok());
        assert!(Selection::new().reason("x").check("purge").is_ok());
        assert!(Selection::new().limit(2).full(2));
        assert!(!Selection::new().full(1_000_000));
    }

    #[test]
    fn an_edited_replay_is_never_taken_for_a_copy() {
        let mut a = DeadLetter::new(Broker::Kafka, "0:1", b"{}".to_vec());
        a.origin = Some("orders".into());
        let b = DeadLetter {
            id: "0:2".into(),
            ..a.clone()
        };
        let mut done = Replayed::default();
        done.replayed_before(&a);
        let place = ("topic", "x-idem-topic");
        assert_eq!(
            Selection::all().take(&b, 0, place, &mut done),
            Some(Take::Copy { of: "0:1".into() })
        );
        assert_eq!(
            Edit::new("0:2", b"{\"fixed\":1}".to_vec())
                .selection()
                .take(&b, 0, place, &mut done),
            Some(Take::Replay {
                to: "orders".into()
            })
        );
    }

    #[test]
    fn an_unknown_time_is_not_old() {
        let d = DeadLetter::new(Broker::RabbitMq, "a", Vec::new());
        assert!(
            !Selection::new()
                .older_than(Duration::from_secs(1))
                .matches(&d, i64::MAX)
        );
        assert!(Selection::new().matches(&d, 0));
    }
}
