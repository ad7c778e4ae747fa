//! The dead letters of a Kafka consumer: the topic `<topic>-dlt` (feature
//! `kafka`).
//!
//! A dead letter's id is where it is in the dead-letter topic,
//! `partition:offset`. Reading assigns the partitions (no consumer group
//! joins, nothing is committed) and reads each from its start to the end it
//! had when the pass began; the dead letters are listed oldest first by
//! their timestamp, the time they were dead-lettered.
//!
//! # Replays
//!
//! A replay publishes the copy (its record key, payload and headers but the
//! consumer's counts and dead-letter headers, with `x-idem-replays` one
//! more and `x-idem-replayed-from: <dead-letter topic>/<partition>:<offset>`)
//! to the topic it came from (`x-idem-topic`), waits for `acks=all`, and then
//! writes its id to the ledger topic `<dead-letter topic>-replayed` (one
//! partition, created on the first replay; record key the id, value
//! `{"to": "<topic>/<partition>:<offset>", "at_ms": ...}`, with
//! `"edited": true` for an edited replay, and `"copy_of": "<id>"` for a copy
//! removed in place of the dead letter replayed, whose `to` it names). A Kafka topic
//! cannot drop one record, so the ledger is what removes a dead letter:
//! [`list`](DeadLetters::list) leaves the ones in it out,
//! [`show`](DeadLetters::show) says where their copy went
//! ([`DeadLetter::replayed_to`]), and a second replay of one is skipped
//! ([`Skipped`]). A crash between the copy and the ledger leaves a dead
//! letter listed whose copy was published: replayed again, its second copy
//! is a duplicate, which idem's keys are for. The dead-letter topic itself
//! is never written to, so whatever else reads or counts it sees only dead
//! letters.
//!
//! # Purges
//!
//! [`purge`](DeadLetters::purge) of [`Selection::all`] deletes each partition's
//! records up to its end (`DeleteRecords`, Kafka's admin API), and the
//! ledger's with them; a broker without that API answers
//! [`DeadLetterError::Unsupported`]. Any other purge is `Unsupported`: one
//! record cannot be deleted (a replayed dead letter is out of the listing
//! already; the topic's retention removes the rest in time).
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{dead::Selection, kafka::dead::DeadLetters};
//!
//! let name = DeadLetters::default_name("orders"); // orders-dlt
//! let dead = DeadLetters::connect("127.0.0.1:9092", &name).await?;
//! for d in dead.list(&Selection::new().limit(20)).await? {
//!     println!("{} {:?} {:?}", d.id, d.reason, d.origin);
//! }
//! let done = dead.replay(&Selection::new().id("0:4")).await?;
//! println!("{} replayed", done.count());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::BoxError;
use crate::consume::Broker;
use crate::consume::dead::cause::HEADERS;
use crate::consume::dead::{
    CopyOf, DeadLetter, DeadLetterError, Edit, Purged, Replay, Replayed, Selection, Skipped, Take,
    now_ms, payload_digest,
};
use crate::consume::kafka::heard::Heard;
use crate::consume::kafka::settings::Settings;
use crate::consume::kafka::topics;

/// The header of a replayed copy that counts its replays.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::kafka::dead::{REPLAYED_FROM, REPLAYS};
/// assert_eq!((REPLAYS, REPLAYED_FROM), ("x-idem-replays", "x-idem-replayed-from"));
/// ```
pub const REPLAYS: &str = "x-idem-replays";
/// The header of a replayed copy that says which dead letter it is a copy
/// of: `<dead-letter topic>/<partition>:<offset>`.
///
/// # Examples
///
/// See [`REPLAYS`].
pub const REPLAYED_FROM: &str = "x-idem-replayed-from";

/// What a replayed copy leaves out: the consumer's counts, origin and
/// dead-letter headers (its own and Spring's), so that it starts afresh
/// and its first consumption is its origin.
const NOT_REPLAYED: [&str; 16] = [
    topics::FAILURES,
    topics::RETRIES,
    topics::LAST_ERROR,
    topics::DUE,
    topics::REASON,
    topics::TOPIC,
    topics::PARTITION,
    topics::OFFSET,
    topics::PUBLISHED,
    topics::DLT_TOPIC,
    topics::DLT_PARTITION,
    topics::DLT_OFFSET,
    topics::DLT_GROUP,
    topics::DLT_MESSAGE,
    REPLAYS,
    REPLAYED_FROM,
];

const BROKER: Broker = Broker::Kafka;

/// A partition and its low and high watermarks.
type Watermarks = (i32, i64, i64);

/// How long one call to the brokers may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The dead letters of one topic; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::kafka::dead::DeadLetters;
/// assert_eq!(DeadLetters::default_name("orders"), "orders-dlt");
/// assert_eq!(DeadLetters::ledger_name("orders-dlt"), "orders-dlt-replayed");
/// ```
#[derive(Debug, Clone)]
pub struct DeadLetters {
    brokers: String,
    topic: String,
    settings: Settings,
}

impl DeadLetters {
    /// The dead-letter topic of a consumer of `work_topic` with the default
    /// names: `<work_topic>-dlt`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn default_name(work_topic: &str) -> String {
        topics::Names::new(work_topic).dead_letter_topic()
    }

    /// The ledger of the replayed dead letters of `dead_letter_topic`:
    /// `<dead_letter_topic>-replayed`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn ledger_name(dead_letter_topic: &str) -> String {
        format!("{dead_letter_topic}-replayed")
    }

    /// Connects to `brokers` (`host:port`, comma-separated) for the dead
    /// letters in `topic`, which must exist ([`DeadLetterError::Missing`]).
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn connect(brokers: &str, topic: &str) -> Result<DeadLetters, DeadLetterError> {
        DeadLetters::connect_with(brokers, topic, &[]).await
    }

    /// As [`connect`](Self::connect), over TLS verified with `tls` (its
    /// [`kafka_settings`](crate::tls::Tls::kafka_settings)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{consume::kafka::dead::DeadLetters, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/kafka-ca.pem")?;
    /// let dead = DeadLetters::connect_tls("broker-1:9093", "orders-dlt", &tls).await?;
    /// # let _ = dead;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(
        brokers: &str,
        topic: &str,
        tls: &crate::tls::Tls,
    ) -> Result<DeadLetters, DeadLetterError> {
        tls.warn_if_unverified("Kafka");
        let settings = tls
            .kafka_settings()
            .map_err(|e| DeadLetterError::Unsupported {
                broker: BROKER,
                what: "take these TLS settings".to_owned(),
                why: e.to_string(),
            })?;
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        DeadLetters::connect_with(brokers, topic, &settings).await
    }

    /// As [`connect`](Self::connect), with librdkafka settings for every
    /// client it makes (`security.protocol`, `sasl.*`...).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::kafka::dead::DeadLetters;
    /// let dead = DeadLetters::connect_with(
    ///     "broker-1:9093",
    ///     "orders-dlt",
    ///     &[("security.protocol", "ssl")],
    /// )
    /// .await?;
    /// # let _ = dead;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        brokers: &str,
        topic: &str,
        settings: &[(&str, &str)],
    ) -> Result<DeadLetters, DeadLetterError> {
        let dead = DeadLetters {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            settings: Settings(
                settings
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
        };
        let probe = dead.clone();
        let found = blocking(move || probe.partitions(&probe.topic))
            .await
            .map_err(|source| DeadLetterError::Unreachable {
                broker: BROKER,
                at: brokers.to_owned(),
                source,
            })?;
        if found.is_none() {
            return Err(dead.missing());
        }
        Ok(dead)
    }

    /// The dead-letter topic's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::kafka::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9092", "orders-dlt").await?;
    /// assert_eq!(dead.name(), "orders-dlt");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.topic
    }

    /// How many dead letters the topic holds, not counting the replayed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::kafka::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9092", "orders-dlt").await?;
    /// println!("{} dead letters", dead.count().await?);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<u64, DeadLetterError> {
        let this = self.clone();
        let counted = blocking(move || -> Result<u64, BoxError> {
            let ledger = this.ledger()?;
            let parts = this.partitions(&this.topic)?.unwrap_or_default();
            let all: i64 = parts.iter().map(|(_, low, high)| high - low).sum();
            let replayed = ledger
                .keys()
                .filter_map(|id| split_id(id))
                .filter(|&(p, o)| {
                    parts
                        .iter()
                        .any(|&(at, low, high)| at == p && (low..high).contains(&o))
                })
                .count();
            Ok(u64::try_from(all)
                .unwrap_or(0)
                .saturating_sub(replayed as u64))
        })
        .await;
        counted.map_err(|e| DeadLetterError::broker(BROKER, e))
    }

    /// The dead letters `filter` selects, oldest first, up to its limit;
    /// the replayed are left out.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let now = now_ms();
        let dead = self.read_all().await?;
        let mut found = Vec::new();
        for (d, _) in dead {
            if filter.full(found.len()) {
                break;
            }
            if d.replayed_to.is_none() && filter.matches(&d, now) {
                found.push(d);
            }
        }
        Ok(found)
    }

    /// The dead letter `id` (`partition:offset`), headers and payload; if
    /// it was replayed, [`DeadLetter::replayed_to`] says where its copy
    /// went.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::kafka::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9092", "orders-dlt").await?;
    /// let one = dead.show("0:4").await?;
    /// println!("{:?}: {}", one.reason, String::from_utf8_lossy(&one.payload));
    /// # Ok(()) }
    /// ```
    pub async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
        let (partition, offset) = split_id(id).ok_or_else(|| DeadLetterError::BadId {
            broker: BROKER,
            id: id.to_owned(),
            expected: "partition:offset, such as 0:12",
        })?;
        let this = self.clone();
        let found = blocking(move || -> Result<Option<DeadLetter>, BoxError> {
            let ledger = this.ledger()?;
            let parts = this.partitions(&this.topic)?.unwrap_or_default();
            let Some((_, low, high)) = parts.into_iter().find(|(p, _, _)| *p == partition) else {
                return Ok(None);
            };
            if offset < low || offset >= high {
                return Ok(None);
            }
            let messages = this.read_partition(&this.topic, partition, offset, offset + 1)?;
            Ok(messages
                .iter()
                .find(|m| m.offset() == offset)
                .map(|m| read(m, &ledger)))
        })
        .await
        .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        found.ok_or_else(|| DeadLetterError::NotFound {
            name: self.topic.clone(),
            id: id.to_owned(),
        })
    }

    /// Replays the dead letters `filter` selects (up to its limit) to the
    /// topics they came from, and writes them to the ledger; see the
    /// [module docs](self#replays). `filter` must name something, or be
    /// [`Selection::all`].
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn replay(&self, filter: &Selection) -> Result<Replayed, DeadLetterError> {
        self.replay_with(filter, None).await
    }

    /// Replays the dead letter [`Edit::id`] with the corrected
    /// [`Edit::payload`]; see the [edited replays](crate::consume::dead#edited-replays).
    /// The ledger's entry says `"edited": true`.
    /// [`DeadLetterError::NotFound`] when there is no such dead letter.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Edit, kafka::dead::DeadLetters};
    /// let dead = DeadLetters::connect("127.0.0.1:9092", "orders-dlt").await?;
    /// let fixed = br#"{"order_id":"o-7","sku":"PEAR-1","qty":2}"#.to_vec();
    /// let done = dead.replay_edited(&Edit::new("0:12", fixed)).await?;
    /// assert!(done.replayed.iter().all(|r| r.edited));
    /// # Ok(()) }
    /// ```
    pub async fn replay_edited(&self, edit: &Edit) -> Result<Replayed, DeadLetterError> {
        let done = self
            .replay_with(&edit.selection(), Some(edit.payload()))
            .await?;
        edit.found(done, &self.topic)
    }

    async fn replay_with(
        &self,
        filter: &Selection,
        edit: Option<&[u8]>,
    ) -> Result<Replayed, DeadLetterError> {
        filter.check("replay")?;
        let now = now_ms();
        let dead = self.read_all().await?;
        let mut done = Replayed::default();
        let mut producer: Option<FutureProducer> = None;
        // Where each replayed dead letter's copy went, for its copies' entries.
        let mut copied_to: HashMap<String, String> = HashMap::new();
        for (d, _) in dead.iter() {
            if let Some(to) = &d.replayed_to {
                done.replayed_before(d);
                copied_to.insert(d.id.clone(), to.clone());
            }
        }
        for (d, message) in dead {
            if filter.full(done.count()) {
                break;
            }
            if let Some(to) = &d.replayed_to {
                if filter.matches(&d, now) {
                    done.skipped
                        .push(Skipped::new(d.id, format!("replayed already, to {to}")));
                }
                continue;
            }
            let Some(take) = filter.take(&d, now, ("topic", "x-idem-topic"), &mut done) else {
                continue;
            };
            let producer = match &producer {
                Some(p) => p,
                None => {
                    self.create_ledger().await?;
                    producer.insert(self.producer()?)
                }
            };
            let to = match take {
                Take::Copy { of } => {
                    let to = copied_to.get(&of).cloned().unwrap_or_default();
                    let entry = serde_json::json!({ "to": to, "copy_of": of, "at_ms": now_ms() });
                    self.write_ledger(producer, &d.id, &entry).await?;
                    done.copies.push(CopyOf::new(d.id, of));
                    continue;
                }
                Take::Replay { to } => to,
            };
            let replays = d.replays.saturating_add(1);
            let from = format!("{}/{}", self.topic, d.id);
            let headers = copy_headers(&message, replays, &from, edit.is_some());
            let payload = edit.unwrap_or(message.payload().unwrap_or_default());
            let mut record = FutureRecord::to(&to).payload(payload).headers(headers);
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            let copy = producer
                .send(record, TIMEOUT)
                .await
                .map_err(|(e, _)| DeadLetterError::broker(BROKER, e))?;
            let at = format!("{to}/{}:{}", copy.partition, copy.offset);
            let entry = if edit.is_some() {
                serde_json::json!({ "to": at, "at_ms": now_ms(), "edited": true })
            } else {
                serde_json::json!({ "to": at, "at_ms": now_ms() })
            };
            self.write_ledger(producer, &d.id, &entry).await?;
            copied_to.insert(d.id.clone(), at);
            let mut replay = Replay::new(d.id.clone(), to, replays);
            replay.edited = edit.is_some();
            done.note(&d, replay);
        }
        Ok(done)
    }

    /// Writes `entry` for the dead letter `id` to the ledger.
    async fn write_ledger(
        &self,
        producer: &FutureProducer,
        id: &str,
        entry: &serde_json::Value,
    ) -> Result<(), DeadLetterError> {
        let ledger = DeadLetters::ledger_name(&self.topic);
        let entry = entry.to_string();
        producer
            .send(FutureRecord::to(&ledger).key(id).payload(&entry), TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| DeadLetterError::broker(BROKER, e))
    }

    /// Deletes every dead letter: [`Selection::all`] alone, where the broker
    /// supports `DeleteRecords`; anything else is
    /// [`DeadLetterError::Unsupported`] (see the [module docs](self#purges)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::{DeadLetterError, Selection}, kafka::dead::DeadLetters};
    /// let dead = DeadLetters::connect("127.0.0.1:9092", "orders-dlt").await?;
    /// match dead.purge(&Selection::all()).await {
    ///     Ok(gone) => println!("{} purged", gone.purged),
    ///     Err(DeadLetterError::Unsupported { why, .. }) => println!("not here: {why}"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
        filter.check("purge")?;
        if !filter.is_all() {
            return Err(DeadLetterError::Unsupported {
                broker: BROKER,
                what: "purge some dead letters".into(),
                why: "a Kafka topic cannot delete one record; replay them (a replayed dead letter is no longer listed), purge them all, or let the topic's retention remove them".into(),
            });
        }
        let this = self.clone();
        let ends = blocking(move || this.partitions(&this.topic))
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?
            .ok_or_else(|| self.missing())?;
        let before = self.count().await?;
        self.delete_records(&self.topic, &ends).await?;
        // The ledger's entries name records that are gone now.
        let this = self.clone();
        let ledger = DeadLetters::ledger_name(&self.topic);
        let ledger_ends = blocking(move || this.partitions(&DeadLetters::ledger_name(&this.topic)))
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        if let Some(ledger_ends) = ledger_ends {
            self.delete_records(&ledger, &ledger_ends).await?;
        }
        Ok(Purged {
            purged: before,
            ids: Vec::new(),
        })
    }

    fn missing(&self) -> DeadLetterError {
        DeadLetterError::Missing {
            broker: BROKER,
            kind: "topic",
            name: self.topic.clone(),
        }
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.settings.0 {
            c.set(k, v);
        }
        c
    }

    fn producer(&self) -> Result<FutureProducer, DeadLetterError> {
        let mut c = self.config();
        c.set("acks", "all").set("message.timeout.ms", "30000");
        // The caller's settings win, as in `config`.
        for (k, v) in &self.settings.0 {
            c.set(k, v);
        }
        c.create().map_err(|e| DeadLetterError::broker(BROKER, e))
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>, DeadLetterError> {
        self.config()
            .create()
            .map_err(|e| DeadLetterError::broker(BROKER, e))
    }

    /// Creates the ledger topic if it is missing.
    async fn create_ledger(&self) -> Result<(), DeadLetterError> {
        let name = DeadLetters::ledger_name(&self.topic);
        let new = NewTopic::new(&name, 1, TopicReplication::Fixed(-1));
        let results = self
            .admin()?
            .create_topics([&new], &AdminOptions::new())
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        for result in results {
            if let Err((name, code)) = result
                && code != RDKafkaErrorCode::TopicAlreadyExists
            {
                return Err(DeadLetterError::broker(
                    BROKER,
                    format!("could not create the ledger topic {name}: {code}"),
                ));
            }
        }
        Ok(())
    }

    /// Deletes the records of `topic` before each partition's `high`.
    async fn delete_records(
        &self,
        topic: &str,
        ends: &[Watermarks],
    ) -> Result<(), DeadLetterError> {
        let mut offsets = TopicPartitionList::new();
        for (partition, low, high) in ends {
            if high > low {
                offsets
                    .add_partition_offset(topic, *partition, Offset::Offset(*high))
                    .map_err(|e| DeadLetterError::broker(BROKER, e))?;
            }
        }
        if offsets.count() == 0 {
            return Ok(());
        }
        let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
        let unsupported = |why: String| DeadLetterError::Unsupported {
            broker: BROKER,
            what: "purge all dead letters".into(),
            why: format!(
                "{why}; let the topic's retention remove them, or delete the topic and create it again"
            ),
        };
        let deleted = match self.admin()?.delete_records(&offsets, &options).await {
            Ok(result) => result
                .elements()
                .iter()
                .find_map(|e| e.error().err())
                .map_or(Ok(()), Err),
            Err(e) => Err(e),
        };
        let Err(e) = deleted else {
            return Ok(());
        };
        match code(&e) {
            Some(
                RDKafkaErrorCode::UnsupportedVersion
                | RDKafkaErrorCode::UnsupportedFeature
                | RDKafkaErrorCode::InvalidRequest,
            ) => Err(unsupported(format!(
                "the broker does not delete records (DeleteRecords: {e})"
            ))),
            // A broker that drops the connection on this request alone
            // (tansu 0.6: its storage does not implement it) but answers
            // the others.
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)
                if self.answers().await =>
            {
                Err(unsupported(format!(
                    "the broker closed the connection when asked to delete records ({e}) and answers other requests: it does not support DeleteRecords, or it failed (try again to tell)"
                )))
            }
            _ => Err(DeadLetterError::broker(BROKER, e)),
        }
    }

    /// Whether the brokers answer a metadata request.
    async fn answers(&self) -> bool {
        let this = self.clone();
        blocking(move || this.partitions(&this.topic).map(drop))
            .await
            .is_ok()
    }

    /// Every record of the dead-letter topic with what the ledger says of
    /// it, oldest first.
    async fn read_all(&self) -> Result<Vec<(DeadLetter, OwnedMessage)>, DeadLetterError> {
        let this = self.clone();
        blocking(move || -> Result<_, BoxError> {
            let ledger = this.ledger()?;
            let Some(parts) = this.partitions(&this.topic)? else {
                return Ok(None);
            };
            let mut all = Vec::new();
            for (partition, low, high) in parts {
                if high > low {
                    for m in this.read_partition(&this.topic, partition, low, high)? {
                        all.push((read(&m, &ledger), m));
                    }
                }
            }
            all.sort_by_key(|(d, m)| (d.dead_at_ms, m.partition(), m.offset()));
            Ok(Some(all))
        })
        .await
        .map_err(|e| DeadLetterError::broker(BROKER, e))?
        .ok_or_else(|| self.missing())
    }

    /// The ledger: replayed ids, and where their copies went.
    fn ledger(&self) -> Result<HashMap<String, String>, BoxError> {
        let name = DeadLetters::ledger_name(&self.topic);
        let mut ledger = HashMap::new();
        let Some(parts) = self.partitions(&name)? else {
            return Ok(ledger);
        };
        for (partition, low, high) in parts {
            if high <= low {
                continue;
            }
            for m in self.read_partition(&name, partition, low, high)? {
                let Some(id) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    continue;
                };
                let to = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                    .and_then(|v| v.get("to").and_then(|t| t.as_str()).map(str::to_owned))
                    .unwrap_or_else(|| "?".to_owned());
                ledger.insert(id.to_owned(), to);
            }
        }
        Ok(ledger)
    }

    /// The partitions of `topic` with their low and high watermarks, or
    /// `None` when it does not exist. All topics' metadata is asked for, so
    /// that a broker that creates topics on demand does not create it.
    fn partitions(&self, topic: &str) -> Result<Option<Vec<Watermarks>>, BoxError> {
        let client: BaseConsumer<Heard> = self.config().create_with_context(Heard::default())?;
        let metadata = client
            .fetch_metadata(None, TIMEOUT)
            .map_err(|e| Heard::explain(&client, e))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        if let Some(e) = found.error() {
            let code = RDKafkaErrorCode::from(e);
            if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                return Ok(None);
            }
            return Err(format!("topic {topic}: {code}").into());
        }
        let mut parts = Vec::new();
        for p in found.partitions() {
            let (low, high) = client.fetch_watermarks(topic, p.id(), TIMEOUT)?;
            parts.push((p.id(), low, high));
        }
        parts.sort_unstable();
        Ok(Some(parts))
    }

    /// The records of `topic`'s `partition` from `from` up to `to`
    /// (exclusive), or to the partition's end if it is nearer.
    fn read_partition(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Result<Vec<OwnedMessage>, BoxError> {
        let client: BaseConsumer = self
            .config()
            .set("group.id", "idem-dead-letters")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .create()?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, Offset::Offset(from))?;
        client.assign(&assignment)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            match client.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let next = m.offset() + 1;
                    if m.offset() < to {
                        out.push(m.detach());
                    }
                    if next >= to {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(Box::new(e)),
                None => {}
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "reading {topic} partition {partition} from offset {from} took over 30 s"
                )
                .into());
            }
        }
        Ok(out)
    }
}

/// Runs a blocking librdkafka call off the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BoxError> + Send + 'static,
) -> Result<T, BoxError> {
    tokio::task::spawn_blocking(f).await?
}

/// The librdkafka error code of `e`, where it has one.
fn code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::AdminOp(code) => Some(*code),
        e => e.rdkafka_error_code(),
    }
}

/// `partition:offset`.
fn split_id(id: &str) -> Option<(i32, i64)> {
    let (p, o) = id.trim().split_once(':')?;
    let (p, o) = (p.parse::<i32>().ok()?, o.parse::<i64>().ok()?);
    (p >= 0 && o >= 0).then_some((p, o))
}

/// A header value as text: printable UTF-8 as it is, anything else
/// (Spring's binary partition and offset) as hex.
fn shown(value: Option<&[u8]>) -> String {
    match value {
        None => String::new(),
        Some(v) => match std::str::from_utf8(v) {
            Ok(text) if !text.chars().any(|c| c.is_control() && !c.is_whitespace()) => {
                text.to_owned()
            }
            _ => {
                let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                format!("0x{hex}")
            }
        },
    }
}

/// A dead letter as the topic holds it, with its replay from `ledger`.
fn read(m: &OwnedMessage, ledger: &HashMap<String, String>) -> DeadLetter {
    let headers: Vec<(String, String)> = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), shown(h.value)))
                .collect()
        })
        .unwrap_or_default();
    let id = format!("{}:{}", m.partition(), m.offset());
    let mut dead = DeadLetter::new(BROKER, id, m.payload().unwrap_or_default().to_vec());
    dead.headers = headers;
    dead.reason = dead.text(topics::REASON);
    dead.attempts = dead.count(topics::FAILURES);
    dead.retries = dead.count(topics::RETRIES);
    dead.replays = dead.count(REPLAYS).unwrap_or(0);
    dead.last_error = dead.text(topics::LAST_ERROR);
    dead.dead_at_ms = m.timestamp().to_millis();
    dead.origin = dead.text(topics::TOPIC);
    dead.message_id = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
    dead.replayed_to = ledger.get(&dead.id).cloned();
    dead.read_cause(HEADERS);
    dead
}

/// The headers of `m`'s replayed copy (`edited`: with another payload).
fn copy_headers(m: &OwnedMessage, replays: u32, from: &str, edited: bool) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    if edited {
        let replaced = payload_digest(m.payload().unwrap_or_default());
        out = out.insert(Header {
            key: HEADERS.edited,
            value: Some(replaced.as_bytes()),
        });
    }
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            let dropped = edited && h.key == HEADERS.edited;
            if !NOT_REPLAYED.contains(&h.key)
                && !HEADERS.not_replayed().contains(&h.key)
                && !dropped
            {
                out = out.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
    }
    let replays = replays.to_string();
    out.insert(Header {
        key: REPLAYS,
        value: Some(replays.as_bytes()),
    })
    .insert(Header {
        key: REPLAYED_FROM,
        value: Some(from.as_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_partition_and_offset() {
        assert_eq!(split_id("0:12"), Some((0, 12)));
        assert_eq!(split_id(" 3:0 "), Some((3, 0)));
        assert_eq!(split_id("12"), None);
        assert_eq!(split_id("-1:4"), None);
        assert_eq!(split_id("a:b"), None);
    }

    #[test]
    fn binary_header_values_show_as_hex() {
        assert_eq!(shown(Some(b"orders")), "orders");
        assert_eq!(shown(Some(&7i32.to_be_bytes())), "0x00000007");
        assert_eq!(shown(None), "");
    }

    #[test]
    fn error_codes_are_read_from_admin_and_partition_errors() {
        let admin = KafkaError::AdminOp(RDKafkaErrorCode::UnsupportedVersion);
        assert_eq!(code(&admin), Some(RDKafkaErrorCode::UnsupportedVersion));
        let partition = KafkaError::OffsetFetch(RDKafkaErrorCode::BrokerTransportFailure);
        assert_eq!(
            code(&partition),
            Some(RDKafkaErrorCode::BrokerTransportFailure)
        );
        assert_eq!(code(&KafkaError::Canceled), None);
    }
}
