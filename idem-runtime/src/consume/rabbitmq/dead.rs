//! The dead letters of a RabbitMQ consumer: the queue `<queue>.idem.dead`
//! (feature `rabbitmq`).
//!
//! A queue has no ids and no way to read a message without taking it, so:
//!
//! * each dead letter carries its id in the header `x-idem-dead-id` (a UUID
//!   the consumer writes when it dead-letters, with the time in
//!   `x-idem-dead-at`); a dead letter written before those headers were has
//!   the digest of its headers and payload as its id, `sha256:<16 hex>`;
//! * reading takes the messages with `basic.get` without acknowledging
//!   them, on a channel of its own, and then closes that channel: RabbitMQ
//!   puts every message not acknowledged back where it was, in its order.
//!   A listing loses nothing and reorders nothing; RabbitMQ does the same
//!   with what a lost connection took and did not acknowledge. A pass reads at most the messages the
//!   queue held when it began, so dead letters arriving meanwhile (a replay
//!   that fails again) are left for the next;
//! * a replay publishes the copy (persistent, `mandatory`, with publisher
//!   confirms) to the default exchange with the routing key
//!   `x-idem-queue`, and acknowledges the dead letter only once the broker
//!   has confirmed the copy. A copy the broker cannot route (the queue is
//!   gone) is returned, and its dead letter stays ([`Skipped`]).
//!
//! Two readers at once each see only what the other has not taken: a
//! listing beside a replay may show fewer dead letters, never lose one.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{dead::Selection, rabbitmq::dead::DeadLetters};
//! use std::time::Duration;
//!
//! let name = DeadLetters::default_name("orders"); // orders.idem.dead
//! let dead = DeadLetters::connect("amqp://guest:guest@127.0.0.1:5672/%2f", &name).await?;
//! for d in dead.list(&Selection::new().limit(20)).await? {
//!     println!("{} {:?} {:?}", d.id, d.reason, d.origin);
//! }
//! let done = dead
//!     .replay(&Selection::new().reason("out of stock").older_than(Duration::from_secs(600)))
//!     .await?;
//! println!("{} replayed", done.count());
//! dead.close().await;
//! # Ok(()) }
//! ```

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use sha2::{Digest as _, Sha256};

use super::amqp::Published;
use crate::client_tls::{self, ClientTls};
use crate::consume::Broker;
use crate::consume::dead::cause::HEADERS;
use crate::consume::dead::{
    CopyOf, DeadLetter, DeadLetterError, Edit, Purged, Replay, Replayed, Selection, Skipped, Take,
    now_ms, payload_digest, redacted,
};

/// The header the consumer writes a dead letter's id in.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rabbitmq::dead::{DEAD_AT, DEAD_ID};
/// assert_eq!((DEAD_ID, DEAD_AT), ("x-idem-dead-id", "x-idem-dead-at"));
/// ```
pub const DEAD_ID: &str = "x-idem-dead-id";
/// The header the consumer writes when it dead-lettered in (ms since the
/// Unix epoch).
///
/// # Examples
///
/// See [`DEAD_ID`].
pub const DEAD_AT: &str = "x-idem-dead-at";
/// The header of a replayed copy that counts its replays.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::consume::rabbitmq::dead::REPLAYS, "x-idem-replays");
/// ```
pub const REPLAYS: &str = "x-idem-replays";

/// What a replayed copy leaves out: the consumer's counts and dead-letter
/// headers, and RabbitMQ's record of the retry queues' expiries, so that it
/// starts afresh; `CC` and `BCC`, which would route it elsewhere too.
const NOT_REPLAYED: [&str; 15] = [
    "x-idem-failures",
    "x-idem-retries",
    "x-idem-last-error",
    "x-idem-reason",
    "x-idem-queue",
    DEAD_ID,
    DEAD_AT,
    REPLAYS,
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

const BROKER: Broker = Broker::RabbitMq;

/// The dead letters of one queue; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rabbitmq::dead::DeadLetters;
/// assert_eq!(DeadLetters::default_name("orders"), "orders.idem.dead");
/// ```
#[derive(Debug)]
pub struct DeadLetters {
    conn: Connection,
    queue: String,
}

impl DeadLetters {
    /// The dead-letter queue of a consumer of `work_queue` with the default
    /// names: `<work_queue>.idem.dead`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn default_name(work_queue: &str) -> String {
        format!("{work_queue}.idem.dead")
    }

    /// Connects to the broker at `url` for the dead letters in `queue`,
    /// which must exist ([`DeadLetterError::Missing`]).
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn connect(url: &str, queue: &str) -> Result<DeadLetters, DeadLetterError> {
        DeadLetters::connect_over(url, queue, &ClientTls::default()).await
    }

    /// As [`connect`](Self::connect), over TLS (an `amqps://` URL) verified
    /// with `tls`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{consume::rabbitmq::dead::DeadLetters, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/broker-ca.pem")?;
    /// let dead = DeadLetters::connect_tls("amqps://broker.internal:5671/%2f", "orders.idem.dead", &tls).await?;
    /// # let _ = dead;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(
        url: &str,
        queue: &str,
        tls: &crate::tls::Tls,
    ) -> Result<DeadLetters, DeadLetterError> {
        DeadLetters::connect_over(url, queue, &ClientTls::new(tls.clone())).await
    }

    async fn connect_over(
        url: &str,
        queue: &str,
        tls: &ClientTls,
    ) -> Result<DeadLetters, DeadLetterError> {
        let conn =
            client_tls::amqp(url, tls)
                .await
                .map_err(|source| DeadLetterError::Unreachable {
                    broker: BROKER,
                    at: redacted(url),
                    source,
                })?;
        let dead = DeadLetters {
            conn,
            queue: queue.to_owned(),
        };
        dead.count().await?;
        Ok(dead)
    }

    /// The dead-letter queue's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rabbitmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("amqp://127.0.0.1:5672/%2f", "orders.idem.dead").await?;
    /// assert_eq!(dead.name(), "orders.idem.dead");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.queue
    }

    /// How many dead letters the queue holds (ready, not taken by a reader).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rabbitmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("amqp://127.0.0.1:5672/%2f", "orders.idem.dead").await?;
    /// println!("{} dead letters", dead.count().await?);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<u64, DeadLetterError> {
        // A look-up of a missing queue closes its channel: one of its own.
        let probe = self.channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let found = probe
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await;
        let _ = probe.close(200, "counted".into()).await;
        match found {
            Ok(q) => Ok(u64::from(q.message_count())),
            Err(e) if not_found(&e) => Err(DeadLetterError::Missing {
                broker: BROKER,
                kind: "queue",
                name: self.queue.clone(),
            }),
            Err(e) => Err(DeadLetterError::broker(BROKER, e)),
        }
    }

    /// The dead letters `filter` selects, oldest first, up to its limit;
    /// every message stays in the queue, in its place.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let now = now_ms();
        let mut scan = self.scan(false).await?;
        let mut found = Vec::new();
        while !filter.full(found.len()) {
            let Some(delivery) = scan.next().await? else {
                break;
            };
            let dead = read(&delivery);
            if filter.matches(&dead, now) {
                found.push(dead);
            }
        }
        scan.put_back().await;
        Ok(found)
    }

    /// The dead letter `id`, headers and payload; it stays in the queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rabbitmq::dead::DeadLetters;
    /// let dead = DeadLetters::connect("amqp://127.0.0.1:5672/%2f", "orders.idem.dead").await?;
    /// let one = dead.show("5b0e1c9e-4d1f-4a51-9a37-0e3c8b5d2f10").await?;
    /// println!("{:?}: {}", one.reason, String::from_utf8_lossy(&one.payload));
    /// # Ok(()) }
    /// ```
    pub async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
        let found = self.list(&Selection::new().id(id).limit(1)).await?;
        found
            .into_iter()
            .next()
            .ok_or_else(|| DeadLetterError::NotFound {
                name: self.queue.clone(),
                id: id.to_owned(),
            })
    }

    /// Replays the dead letters `filter` selects (up to its limit) to the
    /// queues they came from; see the [module docs](self). `filter` must
    /// name something, or be [`Selection::all`].
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn replay(&self, filter: &Selection) -> Result<Replayed, DeadLetterError> {
        self.replay_with(filter, None).await
    }

    /// Replays the dead letter [`Edit::id`] with the corrected
    /// [`Edit::payload`]; see the [edited replays](crate::consume::dead#edited-replays).
    /// [`DeadLetterError::NotFound`] when there is no such dead letter.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Edit, rabbitmq::dead::DeadLetters};
    /// let dead = DeadLetters::connect("amqp://127.0.0.1:5672/%2f", "orders.idem.dead").await?;
    /// let fixed = br#"{"order_id":"o-7","sku":"PEAR-1","qty":2}"#.to_vec();
    /// let done = dead.replay_edited(&Edit::new("5b0e1c9e-4d1f-4a51-9a37-0e3c8b5d2f10", fixed)).await?;
    /// assert!(done.replayed.iter().all(|r| r.edited));
    /// # Ok(()) }
    /// ```
    pub async fn replay_edited(&self, edit: &Edit) -> Result<Replayed, DeadLetterError> {
        let done = self
            .replay_with(&edit.selection(), Some(edit.payload()))
            .await?;
        edit.found(done, &self.queue)
    }

    async fn replay_with(
        &self,
        filter: &Selection,
        edit: Option<&[u8]>,
    ) -> Result<Replayed, DeadLetterError> {
        filter.check("replay")?;
        let now = now_ms();
        let mut scan = self.scan(true).await?;
        let mut done = Replayed::default();
        let result = async {
            while !filter.full(done.count()) {
                let Some(delivery) = scan.next().await? else {
                    break;
                };
                let dead = read(&delivery);
                let to = match filter.take(&dead, now, ("queue", "x-idem-queue"), &mut done) {
                    None => continue,
                    Some(Take::Copy { of }) => {
                        ack(&delivery).await?;
                        done.copies.push(CopyOf::new(dead.id, of));
                        continue;
                    }
                    Some(Take::Replay { to }) => to,
                };
                let replays = dead.replays.saturating_add(1);
                if !publish_copy(&scan.channel, &delivery, &to, replays, edit).await? {
                    done.skipped.push(Skipped::new(
                        dead.id,
                        format!("the broker could not route it to queue `{to}`"),
                    ));
                    continue;
                }
                ack(&delivery).await?;
                let mut replay = Replay::new(dead.id.clone(), to, replays);
                replay.edited = edit.is_some();
                done.note(&dead, replay);
            }
            Ok::<_, DeadLetterError>(())
        }
        .await;
        scan.put_back().await;
        result.map(|()| done)
    }

    /// Deletes the dead letters `filter` selects (up to its limit);
    /// [`Selection::all`] alone purges the queue at once. `filter` must name
    /// something, or be [`Selection::all`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Selection, rabbitmq::dead::DeadLetters};
    /// let dead = DeadLetters::connect("amqp://127.0.0.1:5672/%2f", "orders.idem.dead").await?;
    /// let gone = dead.purge(&Selection::new().reason("does not decode")).await?;
    /// println!("{} purged", gone.purged);
    /// # Ok(()) }
    /// ```
    pub async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
        filter.check("purge")?;
        if filter.is_all() {
            let channel = self.channel().await?;
            let purged = channel
                .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
                .await
                .map_err(|e| DeadLetterError::broker(BROKER, e));
            let _ = channel.close(200, "purged".into()).await;
            return Ok(Purged {
                purged: u64::from(purged?),
                ids: Vec::new(),
            });
        }
        let now = now_ms();
        let mut scan = self.scan(false).await?;
        let mut done = Purged::default();
        let result = async {
            while !filter.full(done.ids.len()) {
                let Some(delivery) = scan.next().await? else {
                    break;
                };
                let dead = read(&delivery);
                if filter.matches(&dead, now) {
                    ack(&delivery).await?;
                    done.ids.push(dead.id);
                    done.purged += 1;
                }
            }
            Ok::<_, DeadLetterError>(())
        }
        .await;
        scan.put_back().await;
        result.map(|()| done)
    }

    /// Closes the connection.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn close(self) {
        let _ = self.conn.close(200, "done".into()).await;
    }

    async fn channel(&self) -> Result<Channel, DeadLetterError> {
        self.conn
            .create_channel()
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))
    }

    /// A pass over the messages the queue holds now, on a channel of its
    /// own (in confirm mode for a replay).
    async fn scan(&self, confirm: bool) -> Result<Scan, DeadLetterError> {
        let left = self.count().await?;
        let channel = self.channel().await?;
        if confirm {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        }
        Ok(Scan {
            channel,
            queue: self.queue.clone(),
            left,
        })
    }
}

/// Messages taken with `basic.get` and not acknowledged: the channel's
/// close puts them back.
struct Scan {
    channel: Channel,
    queue: String,
    left: u64,
}

impl Scan {
    async fn next(&mut self) -> Result<Option<Delivery>, DeadLetterError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        Ok(got.map(|g| g.delivery))
    }

    /// Closes the channel: what it took and did not acknowledge goes back
    /// to the queue, in its place.
    async fn put_back(self) {
        let _ = self.channel.close(200, "put back".into()).await;
    }
}

/// A dead letter as the queue holds it.
fn read(delivery: &Delivery) -> DeadLetter {
    let fields = delivery.properties.headers().clone().unwrap_or_default();
    let headers: Vec<(String, String)> = fields
        .inner()
        .iter()
        .map(|(name, value)| (name.to_string(), shown(value)))
        .collect();
    let id =
        text(&headers, DEAD_ID).map_or_else(|| digest(&headers, &delivery.data), str::to_owned);
    let mut dead = DeadLetter::new(BROKER, id, delivery.data.clone());
    dead.reason = text(&headers, "x-idem-reason").map(str::to_owned);
    dead.attempts = number(&headers, "x-idem-failures");
    dead.retries = number(&headers, "x-idem-retries");
    dead.replays = number(&headers, REPLAYS).unwrap_or(0);
    dead.last_error = text(&headers, "x-idem-last-error").map(str::to_owned);
    dead.dead_at_ms = text(&headers, DEAD_AT).and_then(|v| v.trim().parse().ok());
    dead.origin = text(&headers, "x-idem-queue").map(str::to_owned);
    dead.message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string());
    dead.headers = headers;
    dead.read_cause(HEADERS);
    dead
}

/// Acknowledges a dead letter taken: it leaves the queue.
async fn ack(delivery: &Delivery) -> Result<(), DeadLetterError> {
    delivery
        .ack(BasicAckOptions::default())
        .await
        .map(|_| ())
        .map_err(|e| DeadLetterError::broker(BROKER, e))
}

/// A header value as text: strings as they are, numbers in decimal,
/// arrays as `[a, b]` and tables as `{k: v}` (RabbitMQ's `x-death`).
fn shown(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        AMQPValue::ShortString(v) => v.as_str().to_owned(),
        AMQPValue::ByteArray(v) => String::from_utf8_lossy(v.as_slice()).into_owned(),
        AMQPValue::Boolean(v) => v.to_string(),
        AMQPValue::ShortShortInt(v) => v.to_string(),
        AMQPValue::ShortShortUInt(v) => v.to_string(),
        AMQPValue::ShortInt(v) => v.to_string(),
        AMQPValue::ShortUInt(v) => v.to_string(),
        AMQPValue::LongInt(v) => v.to_string(),
        AMQPValue::LongUInt(v) => v.to_string(),
        AMQPValue::LongLongInt(v) => v.to_string(),
        AMQPValue::Float(v) => v.to_string(),
        AMQPValue::Double(v) => v.to_string(),
        AMQPValue::Timestamp(v) => v.to_string(),
        AMQPValue::FieldArray(items) => {
            let items: Vec<String> = items.as_slice().iter().map(shown).collect();
            format!("[{}]", items.join(", "))
        }
        AMQPValue::FieldTable(table) => {
            let fields: Vec<String> = table
                .inner()
                .iter()
                .map(|(k, v)| format!("{k}: {}", shown(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        other => format!("{other:?}"),
    }
}

fn text<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn number(headers: &[(String, String)], name: &str) -> Option<u32> {
    text(headers, name).and_then(|v| v.trim().parse().ok())
}

/// The id of a dead letter without `x-idem-dead-id`: the digest of its
/// headers and payload, the same on every read.
fn digest(headers: &[(String, String)], payload: &[u8]) -> String {
    let mut hash = Sha256::new();
    for (name, value) in headers {
        hash.update(name.len().to_be_bytes());
        hash.update(name.as_bytes());
        hash.update(value.len().to_be_bytes());
        hash.update(value.as_bytes());
    }
    hash.update(payload);
    let hex: String = hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Publishes the replayed copy of `delivery` to queue `to`, with the
/// payload `edit` where given, and waits for the broker's confirm: `false`
/// when the broker returned it unrouted.
async fn publish_copy(
    channel: &Channel,
    delivery: &Delivery,
    to: &str,
    replays: u32,
    edit: Option<&[u8]>,
) -> Result<bool, DeadLetterError> {
    let mut headers = FieldTable::default();
    if let Some(fields) = delivery.properties.headers() {
        for (name, value) in fields.inner() {
            let name_str = name.as_str();
            if !NOT_REPLAYED.contains(&name_str) && !HEADERS.not_replayed().contains(&name_str) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    headers.insert(REPLAYS.into(), AMQPValue::LongLongInt(i64::from(replays)));
    if edit.is_some() {
        headers.insert(
            HEADERS.edited.into(),
            AMQPValue::LongString(payload_digest(&delivery.data).into()),
        );
    }
    // The message's identity is kept; `expiration` is not (it would drop the
    // copy again).
    let payload = edit.unwrap_or(&delivery.data);
    match super::amqp::publish_copy(channel, delivery, to, headers, payload)
        .await
        .map_err(|e| DeadLetterError::broker(BROKER, e))?
    {
        Published::Taken => Ok(true),
        Published::Unrouted => Ok(false),
        Published::Refused => Err(DeadLetterError::broker(
            BROKER,
            format!("the broker refused the copy for queue `{to}` (nack)"),
        )),
    }
}

/// Whether the broker said the queue does not exist.
fn not_found(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_header_values_read_as_text() {
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(2));
        death.insert(
            "queue".into(),
            AMQPValue::LongString("q.idem.retry.100ms".into()),
        );
        let deaths = AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into());
        assert_eq!(shown(&deaths), "[{count: 2, queue: q.idem.retry.100ms}]");
        assert_eq!(shown(&AMQPValue::Boolean(true)), "true");
    }

    #[test]
    fn a_digest_is_stable_and_tells_messages_apart() {
        let h = vec![("x-idem-reason".to_owned(), "bad".to_owned())];
        assert_eq!(digest(&h, b"a"), digest(&h, b"a"));
        assert_ne!(digest(&h, b"a"), digest(&h, b"b"));
        assert_ne!(digest(&h, b"a"), digest(&[], b"a"));
        assert!(digest(&h, b"a").starts_with("sha256:"));
        assert_eq!(digest(&h, b"a").len(), "sha256:".len() + 16);
    }
}
