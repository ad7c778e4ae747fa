//! The dead letters of a RocketMQ consumer: the topic `%DLQ%<group>`
//! (feature `rocketmq`).
//!
//! A dead letter's id is the `x-idem-dead-id` property the consumer writes
//! (a UUID); a message in the topic without one (the broker's own transfer
//! after `maxReconsumeTimes`, from a consumer other than idem's) has its
//! message id instead. Reading pulls each queue of the topic from its first
//! offset to the end it had when the read began; no consumer group joins
//! and nothing is committed.
//!
//! # The ledger
//!
//! A RocketMQ topic cannot drop one message. What was replayed or purged is
//! written to a ledger topic, `<dead-letter topic without %>-settled`
//! (`DLQidem-orders-settled` for `%DLQ%idem-orders`): one message a dead
//! letter, its id in the `KEYS`, the property `x-idem-settled` saying
//! `replayed to <topic>` or `purged`. [`list`](DeadLetters::list) and
//! [`count`](DeadLetters::count) leave what it names out,
//! [`show`](DeadLetters::show) says where a replayed one's copy went
//! ([`DeadLetter::replayed_to`]), and a second replay of one is skipped.
//! The dead-letter topic itself is only read, so whatever else reads it
//! sees only dead letters; its retention (the broker's `fileReservedTime`)
//! removes them in time.
//!
//! # Replays
//!
//! A replay sends a copy (the body, `KEYS`, `TAGS` and user properties,
//! but not the consumer's counts and dead-letter properties; with
//! `x-idem-replays` one more and `x-idem-replayed-from: <dead-letter
//! topic>/<id>`) to the topic it came from (`x-idem-topic`), waits for the
//! broker to store it, and then writes the ledger. A crash in between
//! leaves the dead letter listed and its copy sent: replayed again, the
//! second copy is a duplicate, which idem's keys are for.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{dead::Selection, rocketmq::dead::DeadLetters};
//!
//! let name = DeadLetters::default_name("idem-orders"); // %DLQ%idem-orders
//! let dead = DeadLetters::connect("127.0.0.1:9876", &name).await?;
//! for d in dead.list(&Selection::new().limit(20)).await? {
//!     println!("{} {:?} {:?}", d.id, d.reason, d.origin);
//! }
//! let done = dead.replay(&Selection::new().reason("timeout")).await?;
//! println!("{} replayed", done.count());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;

use super::client::{Client, Producer};
use super::reader::{Reader, reader};
use super::transport::{is_system, property};
use super::{DEAD_ID, DUE, TOPIC};
use crate::consume::Broker;
use crate::consume::dead::cause::HEADERS;
use crate::consume::dead::{
    CopyOf, DeadLetter, DeadLetterError, Edit, Purged, Replay, Replayed, Selection, Skipped, Take,
    now_ms, payload_digest,
};

/// The property of a replayed copy that counts its replays.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rocketmq::dead::{REPLAYED_FROM, REPLAYS};
/// assert_eq!((REPLAYS, REPLAYED_FROM), ("x-idem-replays", "x-idem-replayed-from"));
/// ```
pub const REPLAYS: &str = "x-idem-replays";
/// The property of a replayed copy that says which dead letter it is a
/// copy of: `<dead-letter topic>/<id>`.
///
/// # Examples
///
/// See [`REPLAYS`].
pub const REPLAYED_FROM: &str = "x-idem-replayed-from";

/// The ledger's property: what became of the dead letter its `KEYS` name.
const SETTLED: &str = "x-idem-settled";

/// What the ledger says of a purged dead letter: gone, for `show` too.
const PURGED: &str = "purged";

/// What a replayed copy leaves out: the consumer's counts, origin and
/// dead-letter properties, so that it starts afresh.
const NOT_REPLAYED: [&str; 11] = [
    super::PUBLISHED,
    "x-idem-failures",
    "x-idem-retries",
    "x-idem-last-error",
    DUE,
    "x-idem-reason",
    TOPIC,
    "x-idem-dead-at",
    DEAD_ID,
    REPLAYS,
    REPLAYED_FROM,
];

const BROKER: Broker = Broker::RocketMq;

/// The dead letters of one topic; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rocketmq::dead::DeadLetters;
/// assert_eq!(DeadLetters::default_name("idem-orders"), "%DLQ%idem-orders");
/// assert_eq!(DeadLetters::ledger_name("%DLQ%idem-orders"), "DLQidem-orders-settled");
/// ```
#[derive(Clone)]
pub struct DeadLetters {
    topic: String,
    producer: Producer,
    reader: Reader,
    // Last: dropped after the producer and the reader, whose runtime it is.
    _client: Arc<Client>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl DeadLetters {
    /// The dead-letter topic of consumer group `group`: `%DLQ%<group>`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn default_name(group: &str) -> String {
        super::default_dead_letter_topic(group)
    }

    /// The ledger topic of the dead-letter topic `dead_letter_topic`: its
    /// name without `%`, then `-settled`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn ledger_name(dead_letter_topic: &str) -> String {
        format!("{}-settled", dead_letter_topic.replace('%', ""))
    }

    /// The dead letters in `topic`, through the name servers `name_server`.
    ///
    /// # Errors
    ///
    /// [`DeadLetterError::Unreachable`] when the client cannot start.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn connect(name_server: &str, topic: &str) -> Result<DeadLetters, DeadLetterError> {
        let unreachable = |e| DeadLetterError::Unreachable {
            broker: BROKER,
            at: name_server.to_owned(),
            source: e,
        };
        let client = Client::new("dead", 1).map_err(unreachable)?;
        let opened = async {
            let producer = client.producer(name_server, "idem-dead-letters").await?;
            let reader = reader(&client, name_server).await?;
            Ok::<_, crate::BoxError>((producer, reader))
        }
        .await;
        let (producer, reader) = match opened {
            Ok(p) => p,
            Err(e) => {
                client.close().await;
                return Err(unreachable(e));
            }
        };
        Ok(DeadLetters {
            topic: topic.to_owned(),
            producer,
            reader,
            _client: Arc::new(client),
        })
    }

    /// The dead-letter topic.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rocketmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9876", "%DLQ%idem-orders").await?;
    /// assert_eq!(dead.name(), "%DLQ%idem-orders");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.topic
    }

    /// How many dead letters the topic holds, not counting the replayed and
    /// the purged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rocketmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9876", "%DLQ%idem-orders").await?;
    /// println!("{} dead letters", dead.count().await?);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<u64, DeadLetterError> {
        let all = self.read_all().await?;
        Ok(all.iter().filter(|d| d.replayed_to.is_none()).count() as u64)
    }

    /// The dead letters `filter` selects, oldest first, up to its limit;
    /// the replayed and the purged are left out.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let now = now_ms();
        let mut found = Vec::new();
        for d in self.read_all().await? {
            if filter.full(found.len()) {
                break;
            }
            if d.replayed_to.is_none() && filter.matches(&d, now) {
                found.push(d);
            }
        }
        Ok(found)
    }

    /// The dead letter `id`; if it was replayed, [`DeadLetter::replayed_to`]
    /// says where to. A purged one is [`DeadLetterError::NotFound`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rocketmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("127.0.0.1:9876", "%DLQ%idem-orders").await?;
    /// let one = dead.show("3f2b0c4e-8a51-4f8e-9d43-2a7d1c6b5e90").await?;
    /// println!("{:?}: {}", one.reason, String::from_utf8_lossy(&one.payload));
    /// # Ok(()) }
    /// ```
    pub async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
        self.read_all()
            .await?
            .into_iter()
            .find(|d| d.id == id && d.replayed_to.as_deref() != Some(PURGED))
            .ok_or_else(|| DeadLetterError::NotFound {
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
    /// The ledger says `replayed to <topic>, edited`.
    /// [`DeadLetterError::NotFound`] when there is no such dead letter.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Edit, rocketmq::dead::DeadLetters};
    /// let dead = DeadLetters::connect("127.0.0.1:9876", "%DLQ%idem-orders").await?;
    /// let fixed = br#"{"order_id":"o-7","sku":"PEAR-1","qty":2}"#.to_vec();
    /// let done = dead.replay_edited(&Edit::new("5b0e1c9e-4d1f-4a51-9a37-0e3c8b5d2f10", fixed)).await?;
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
        let mut done = Replayed::default();
        let dead = self.read_messages().await?;
        let replayed = dead
            .iter()
            .filter(|(d, _)| d.replayed_to.as_deref().is_some_and(|to| to != PURGED));
        for (d, _) in replayed {
            done.replayed_before(d);
        }
        for (d, msg) in dead {
            if filter.full(done.count()) {
                break;
            }
            if let Some(to) = &d.replayed_to {
                if filter.matches(&d, now) {
                    done.skipped.push(Skipped::new(d.id, to.clone()));
                }
                continue;
            }
            let to = match filter.take(&d, now, ("topic", TOPIC), &mut done) {
                None => continue,
                Some(Take::Copy { of }) => {
                    self.settle(&d.id, &format!("a copy of {of}, replayed"))
                        .await?;
                    done.copies.push(CopyOf::new(d.id, of));
                    continue;
                }
                Some(Take::Replay { to }) => to,
            };
            let replays = d.replays.saturating_add(1);
            let from = format!("{}/{}", self.topic, d.id);
            let copy = replay_copy(&msg, &to, replays, &from, edit)
                .map_err(|e| DeadLetterError::broker(BROKER, e))?;
            self.producer
                .send(copy)
                .await
                .map_err(|e| DeadLetterError::broker(BROKER, e))?;
            let edited = if edit.is_some() { ", edited" } else { "" };
            self.settle(&d.id, &format!("replayed to {to}{edited}"))
                .await?;
            let mut replay = Replay::new(d.id.clone(), to, replays);
            replay.edited = edit.is_some();
            done.note(&d, replay);
        }
        Ok(done)
    }

    /// Removes the dead letters `filter` selects from the listing, writing
    /// them to the ledger as purged. `filter` must name something, or be
    /// [`Selection::all`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Selection, rocketmq::dead::DeadLetters};
    /// let dead = DeadLetters::connect("127.0.0.1:9876", "%DLQ%idem-orders").await?;
    /// let gone = dead.purge(&Selection::new().reason("payload mismatch")).await?;
    /// println!("{} purged", gone.purged);
    /// # Ok(()) }
    /// ```
    pub async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
        filter.check("purge")?;
        let now = now_ms();
        let mut ids = Vec::new();
        for d in self.read_all().await? {
            if filter.full(ids.len()) {
                break;
            }
            if d.replayed_to.is_none() && filter.matches(&d, now) {
                self.settle(&d.id, PURGED).await?;
                ids.push(d.id);
            }
        }
        Ok(Purged {
            purged: ids.len() as u64,
            ids,
        })
    }

    /// Writes to the ledger that `id` was `what` (making the ledger topic,
    /// where it is missing, first).
    async fn settle(&self, id: &str, what: &str) -> Result<(), DeadLetterError> {
        self.producer
            .ensure_topic(&DeadLetters::ledger_name(&self.topic))
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        let entry = Message::builder()
            .topic(DeadLetters::ledger_name(&self.topic))
            .key(id.to_owned())
            .body_slice(what.as_bytes())
            .raw_property(SETTLED, what.to_owned())
            .and_then(|b| b.build())
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        self.producer
            .send(entry)
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))
    }

    /// Every dead letter, oldest first.
    async fn read_all(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        Ok(self
            .read_messages()
            .await?
            .into_iter()
            .map(|(d, _)| d)
            .collect())
    }

    /// Every dead letter with its message, oldest first; what the ledger
    /// names has its `replayed_to` set.
    async fn read_messages(&self) -> Result<Vec<(DeadLetter, MessageExt)>, DeadLetterError> {
        let failed = |e| DeadLetterError::broker(BROKER, e);
        let dead = self
            .reader
            .read(&self.topic)
            .await
            .map_err(failed)?
            .ok_or_else(|| DeadLetterError::Missing {
                broker: BROKER,
                kind: "topic",
                name: self.topic.clone(),
            })?;
        let ledger: HashMap<String, String> = self
            .reader
            .read(&DeadLetters::ledger_name(&self.topic))
            .await
            .map_err(failed)?
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let id = property(&m, "KEYS")?.to_owned();
                let what = property(&m, SETTLED).unwrap_or("settled").to_owned();
                Some((id, what))
            })
            .collect();
        let mut found: Vec<(DeadLetter, MessageExt)> = dead
            .into_iter()
            .map(|m| {
                let mut d = read(&m);
                d.replayed_to = ledger.get(&d.id).cloned();
                (d, m)
            })
            .collect();
        found.sort_by_key(|(d, _)| d.dead_at_ms);
        Ok(found)
    }
}

/// The dead letter `m` holds.
fn read(m: &MessageExt) -> DeadLetter {
    let id = property(m, DEAD_ID).map_or_else(|| m.msg_id().to_string(), str::to_owned);
    let mut dead = DeadLetter::new(BROKER, id, m.message.body_slice().to_vec());
    let mut headers: Vec<(String, String)> = m
        .properties()
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    headers.sort();
    dead.headers = headers;
    dead.reason = dead.text("x-idem-reason");
    dead.attempts = dead.count("x-idem-failures");
    dead.retries = dead.count("x-idem-retries");
    dead.replays = dead.count(REPLAYS).unwrap_or(0);
    dead.last_error = dead.text("x-idem-last-error");
    dead.dead_at_ms = dead
        .text("x-idem-dead-at")
        .and_then(|t| t.parse().ok())
        .or(Some(m.store_timestamp()));
    dead.origin = dead.text(TOPIC);
    dead.message_id = property(m, "KEYS")
        .or_else(|| property(m, "UNIQ_KEY"))
        .map(str::to_owned);
    dead.read_cause(HEADERS);
    dead
}

/// The replayed copy of `m` for `topic`, with the payload `edit` where
/// given.
fn replay_copy(
    m: &MessageExt,
    topic: &str,
    replays: u32,
    from: &str,
    edit: Option<&[u8]>,
) -> Result<Message, crate::BoxError> {
    use rocketmq_model::common::message::message_property::MessagePropertyKey;
    let builder = Message::builder().topic(topic.to_owned());
    let mut builder = match edit {
        Some(payload) => builder.body_slice(payload),
        None => builder.body(m.message.body().unwrap_or_default()),
    };
    if let Some(tags) = m.get_tags() {
        builder = builder.tags(tags);
    }
    if let Some(keys) = property(m, "KEYS") {
        builder = builder.property(MessagePropertyKey::Keys, keys.to_owned());
    }
    for (name, value) in m.properties() {
        let name = name.as_str();
        if is_system(name)
            || NOT_REPLAYED.contains(&name)
            || HEADERS.not_replayed().contains(&name)
            || (edit.is_some() && name == HEADERS.edited)
            || value.is_empty()
        {
            continue;
        }
        builder = builder.raw_property(name.to_owned(), value.clone())?;
    }
    builder = builder
        .raw_property(REPLAYS, replays.to_string())?
        .raw_property(REPLAYED_FROM, from.to_owned())?;
    if edit.is_some() {
        let replaced = payload_digest(&m.message.body().unwrap_or_default());
        builder = builder.raw_property(HEADERS.edited, replaced)?;
    }
    Ok(builder.build()?)
}
