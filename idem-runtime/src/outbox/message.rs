//! What a body stages ([`Message`]) and what a relay reads back and
//! publishes ([`Outgoing`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};

use super::MessageId;

/// The longest destination a row holds, in bytes (a Kafka topic, an AMQP
/// routing key and a NATS subject all fit).
///
/// # Examples
///
/// ```
/// use idem_runtime::outbox::{Message, MAX_DESTINATION_LEN};
/// // a subject as long as a row keeps
/// let m = Message::new("a".repeat(MAX_DESTINATION_LEN), "{}");
/// assert_eq!(m.destination().len(), 255);
/// ```
pub const MAX_DESTINATION_LEN: usize = 255;

/// A message for a body to stage: where it goes, its payload, and
/// optionally its key, lane and headers.
///
/// | broker | `destination` | `key` |
/// | --- | --- | --- |
/// | Kafka | the topic | the record key (default: the lane) |
/// | RabbitMQ | the routing key, on the relay's exchange | – |
/// | NATS JetStream | the subject | – |
///
/// The lane orders publishing: the rows of one lane are published one at
/// a time, in the order they were staged. It is the message's key when it
/// has one, and the key of the call that staged it otherwise; name one
/// with [`lane`](Self::lane) to order the messages of one aggregate staged
/// by different handlers or keys.
///
/// # Examples
///
/// ```
/// use idem_runtime::outbox::Message;
///
/// #[derive(serde::Serialize)]
/// struct StockDeducted { order_id: u64, left: u32 }
///
/// let m = Message::json("stock.deducted", &StockDeducted { order_id: 7, left: 3 })?
///     .key("7")
///     .header("content-type", "application/json");
/// assert_eq!(m.destination(), "stock.deducted");
/// assert_eq!(m.payload(), br#"{"order_id":7,"left":3}"#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    destination: String,
    key: Option<String>,
    lane: Option<String>,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
}

impl Message {
    /// A message of raw bytes for `destination`.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = idem_runtime::outbox::Message::new("sms", "hello");
    /// assert_eq!(m.payload(), b"hello");
    /// ```
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            destination: destination.into(),
            key: None,
            lane: None,
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    /// A message whose payload is `value` as JSON: what idem's consumers
    /// decode.
    ///
    /// # Errors
    ///
    /// serde's, when `value` cannot be written as JSON.
    ///
    /// # Examples
    ///
    /// See [`Message`].
    pub fn json<T: serde::Serialize + ?Sized>(
        destination: impl Into<String>,
        value: &T,
    ) -> Result<Message, serde_json::Error> {
        Ok(Message::new(destination, serde_json::to_vec(value)?))
    }

    /// The message with a key: Kafka's record key, and the lane unless
    /// [`lane`](Self::lane) names another.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = idem_runtime::outbox::Message::new("orders", "{}").key("A-7");
    /// assert_eq!(m.message_key(), Some("A-7"));
    /// ```
    pub fn key(mut self, key: impl Into<String>) -> Message {
        self.key = Some(key.into());
        self
    }

    /// The message in `lane`: rows of one lane are published in the order
    /// they were staged, one at a time.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = idem_runtime::outbox::Message::new("orders", "{}").lane("order-7");
    /// assert_eq!(m.lane_name(), Some("order-7"));
    /// ```
    pub fn lane(mut self, lane: impl Into<String>) -> Message {
        self.lane = Some(lane.into());
        self
    }

    /// The message with one more header (as AMQP headers, NATS headers or
    /// Kafka record headers). Staging refuses a header every broker would
    /// not take: a name that is empty, longer than 255 bytes, or holds
    /// anything but ASCII letters, digits and ``!#$%&'*+-.^_`|~``; a value
    /// with a control character (a line break); and the names the relays
    /// write the message id under (`Nats-Msg-Id`, `x-idem-message-id`),
    /// which a copied header would otherwise replace.
    ///
    /// # Examples
    ///
    /// ```
    /// let m = idem_runtime::outbox::Message::new("orders", "{}").header("tenant", "acme");
    /// assert_eq!(m.headers(), [("tenant".to_owned(), "acme".to_owned())]);
    /// ```
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Where it goes.
    ///
    /// # Examples
    ///
    /// See [`Message`].
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Its key, if it has one.
    ///
    /// # Examples
    ///
    /// See [`key`](Self::key).
    pub fn message_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The lane it names, if it names one.
    ///
    /// # Examples
    ///
    /// See [`lane`](Self::lane).
    pub fn lane_name(&self) -> Option<&str> {
        self.lane.as_deref()
    }

    /// Its payload.
    ///
    /// # Examples
    ///
    /// See [`Message`].
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Its headers, in the order they were added.
    ///
    /// # Examples
    ///
    /// See [`header`](Self::header).
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// What is wrong with the message for a row, if anything: an empty
    /// or over-long destination, or a header no broker takes (see
    /// [`header`](Self::header)).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.destination.is_empty() {
            return Err("the destination is empty".into());
        }
        if self.destination.len() > MAX_DESTINATION_LEN {
            return Err(format!(
                "the destination is {} bytes long; at most {MAX_DESTINATION_LEN} are kept",
                self.destination.len()
            ));
        }
        for (name, value) in &self.headers {
            check_header(name, value)?;
        }
        Ok(())
    }

    /// The stored lane: 32 hex digits of SHA-256 of the lane's name (the
    /// message's [`lane`](Self::lane), its key, or `call_key`), so that
    /// any name fits the lane index.
    pub(crate) fn stored_lane(&self, call_key: &str) -> String {
        let name = self
            .lane
            .as_deref()
            .or(self.key.as_deref())
            .unwrap_or(call_key);
        lane_of(name)
    }

    /// The headers as the row stores them: a JSON array of `[name, value]`
    /// pairs, or `None` for none.
    pub(crate) fn stored_headers(&self) -> Option<String> {
        (!self.headers.is_empty())
            .then(|| serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned()))
    }
}

/// The header names the relays write the id under, which a message's own
/// headers may not name.
const RESERVED_HEADERS: [&str; 2] = ["Nats-Msg-Id", "x-idem-message-id"];

/// Why header `name: value` cannot travel on every broker, if it cannot.
fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 255 || !name.bytes().all(token) {
        return Err(format!(
            "the header name {name:?} is not one every broker takes: 1 to 255 ASCII letters, digits or !#$%&'*+-.^_`|~"
        ));
    }
    if RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(format!(
            "the header {name:?} is where the relays write the message id: the id is derived, not given"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "the value of header {name:?} holds a control character"
        ));
    }
    Ok(())
}

/// The stored form of the lane named `name`.
pub(crate) fn lane_of(name: &str) -> String {
    crate::key::hex(&Sha256::digest(name.as_bytes())[..16])
}

/// A staged message as a relay reads it back, to publish.
///
/// # Examples
///
/// ```
/// use idem_runtime::outbox::{MessageId, Outgoing};
///
/// let o = Outgoing::for_test(MessageId::derive("h", "k", 0), "orders", b"{}".to_vec());
/// assert_eq!(o.destination, "orders");
/// assert_eq!(o.partition_key(), o.lane.as_str()); // no key: the lane orders it
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outgoing {
    /// The row's place in the table: rows are published in its order
    /// within a lane.
    pub seq: i64,
    /// The message's id.
    pub id: MessageId,
    /// The handler (or producer) that staged it.
    pub handler: String,
    /// Where it goes: see [`Message`].
    pub destination: String,
    /// Its key, if it has one.
    pub key: Option<String>,
    /// Its lane, as stored (32 hex digits).
    pub lane: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// When it was staged (the database's clock).
    pub staged_at: SystemTime,
    /// How many publishes of it failed so far.
    pub attempts: u32,
    /// The last publish's error, if one failed.
    pub last_error: Option<String>,
}

impl Outgoing {
    /// What a Kafka record is keyed by: the message's key, or its lane, so
    /// that the messages of one lane go to one partition, in order.
    ///
    /// # Examples
    ///
    /// See [`Outgoing`].
    pub fn partition_key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.lane)
    }

    /// An outgoing message as a test of a [`Destination`](super::Destination)
    /// makes it: no key, no headers, lane of the id, staged now.
    ///
    /// # Examples
    ///
    /// See [`Outgoing`].
    pub fn for_test(id: MessageId, destination: &str, payload: Vec<u8>) -> Outgoing {
        Outgoing {
            seq: 0,
            lane: lane_of(id.as_str()),
            id,
            handler: String::new(),
            destination: destination.to_owned(),
            key: None,
            payload,
            headers: Vec::new(),
            staged_at: SystemTime::now(),
            attempts: 0,
            last_error: None,
        }
    }

    /// The row's columns as read back, decoded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_row(
        seq: i64,
        id: String,
        handler: String,
        destination: String,
        key: Option<String>,
        lane: String,
        payload: Vec<u8>,
        headers: Option<String>,
        staged_at_ms: i64,
        attempts: i64,
        last_error: Option<String>,
    ) -> Result<Outgoing, String> {
        let headers = match headers {
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| format!("the headers of row {seq} do not decode: {e}"))?,
            None => Vec::new(),
        };
        Ok(Outgoing {
            seq,
            id: MessageId::from_stored(&id),
            handler,
            destination,
            key,
            lane,
            payload,
            headers,
            staged_at: UNIX_EPOCH + Duration::from_millis(u64::try_from(staged_at_ms).unwrap_or(0)),
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            last_error,
        })
    }
}
