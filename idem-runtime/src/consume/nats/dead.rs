//! The dead letters of a NATS JetStream consumer: the stream `<stream>_DEAD`
//! (feature `nats`).
//!
//! A dead letter's id is its sequence in the dead stream, and reading it
//! takes nothing: the messages are fetched by sequence
//! (`STREAM.MSG.GET`), oldest first, up to the last sequence the stream had
//! when the pass began.
//!
//! A replay publishes the copy to the subject it came from (`Idem-Subject`)
//! and waits for the stream's acknowledgement, then deletes the dead letter
//! (`STREAM.MSG.DELETE`). The copy has the dead letter's headers but the
//! dead-letter ones (`Idem-Reason`, `Idem-Deliveries`, `Idem-Stream`,
//! `Idem-Subject`), and `Idem-Replays` counts its replays; its delivery
//! count is the server's, new for a new message. The producer's message id
//! stays in `Idem-Original-Msg-Id` and is not written back as
//! `Nats-Msg-Id`: within the work stream's duplicate window the stream
//! would drop the copy as a duplicate of the original. A subject no stream
//! captures any more leaves its dead letter in place ([`Skipped`]).
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{dead::Selection, nats::dead::DeadLetters};
//!
//! let name = DeadLetters::default_name("ORDERS"); // ORDERS_DEAD
//! let dead = DeadLetters::connect("nats://127.0.0.1:4222", &name).await?;
//! for d in dead.list(&Selection::new().limit(20)).await? {
//!     println!("{} {:?} {:?}", d.id, d.reason, d.origin);
//! }
//! let done = dead.replay(&Selection::new().id("12").id("15")).await?;
//! println!("{} replayed", done.count());
//! # Ok(()) }
//! ```

use async_nats::HeaderMap;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};
use async_nats::jetstream::{self, ErrorCode};

use crate::client_tls::{self, ClientTls};
use crate::consume::Broker;
use crate::consume::dead::cause::NATS_HEADERS;
use crate::consume::dead::{
    CopyOf, DeadLetter, DeadLetterError, Edit, Purged, Replay, Replayed, Selection, Skipped, Take,
    now_ms, payload_digest, redacted,
};

/// The header of a replayed copy that counts its replays.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::consume::nats::dead::REPLAYS, "Idem-Replays");
/// ```
pub const REPLAYS: &str = "Idem-Replays";

/// The dead-letter headers a replayed copy leaves out (and `Idem-Replays`,
/// written anew).
const NOT_REPLAYED: [&str; 5] = [
    "Idem-Reason",
    "Idem-Deliveries",
    "Idem-Stream",
    "Idem-Subject",
    REPLAYS,
];

const BROKER: Broker = Broker::Nats;

/// The dead letters of one stream; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::nats::dead::DeadLetters;
/// assert_eq!(DeadLetters::default_name("ORDERS"), "ORDERS_DEAD");
/// ```
#[derive(Debug)]
pub struct DeadLetters {
    js: jetstream::Context,
    stream: Stream,
    name: String,
}

impl DeadLetters {
    /// The dead-letter stream of a consumer of `work_stream` with the
    /// default names: `<work_stream>_DEAD`.
    ///
    /// # Examples
    ///
    /// See [`DeadLetters`].
    pub fn default_name(work_stream: &str) -> String {
        format!("{work_stream}_DEAD")
    }

    /// Connects to the server at `url` for the dead letters in `stream`,
    /// which must exist ([`DeadLetterError::Missing`]).
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn connect(url: &str, stream: &str) -> Result<DeadLetters, DeadLetterError> {
        DeadLetters::connect_over(url, stream, &ClientTls::default()).await
    }

    /// As [`connect`](Self::connect), with TLS required and verified with
    /// `tls`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{consume::nats::dead::DeadLetters, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/nats-ca.pem")?;
    /// let dead = DeadLetters::connect_tls("tls://nats.internal:4222", "ORDERS_DEAD", &tls).await?;
    /// # let _ = dead;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(
        url: &str,
        stream: &str,
        tls: &crate::tls::Tls,
    ) -> Result<DeadLetters, DeadLetterError> {
        DeadLetters::connect_over(url, stream, &ClientTls::new(tls.clone())).await
    }

    async fn connect_over(
        url: &str,
        stream: &str,
        tls: &ClientTls,
    ) -> Result<DeadLetters, DeadLetterError> {
        let client =
            client_tls::nats(url, tls)
                .await
                .map_err(|source| DeadLetterError::Unreachable {
                    broker: BROKER,
                    at: redacted(url),
                    source,
                })?;
        let js = jetstream::new(client);
        let found = js.get_stream(stream).await.map_err(|e| match e.kind() {
            GetStreamErrorKind::JetStream(api)
                if api.error_code() == ErrorCode::STREAM_NOT_FOUND =>
            {
                DeadLetterError::Missing {
                    broker: BROKER,
                    kind: "stream",
                    name: stream.to_owned(),
                }
            }
            _ => DeadLetterError::broker(BROKER, e),
        })?;
        Ok(DeadLetters {
            js,
            stream: found,
            name: stream.to_owned(),
        })
    }

    /// The dead-letter stream's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::nats::dead::DeadLetters;
    /// let dead = DeadLetters::connect("nats://127.0.0.1:4222", "ORDERS_DEAD").await?;
    /// assert_eq!(dead.name(), "ORDERS_DEAD");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many dead letters the stream holds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::nats::dead::DeadLetters;
    /// let dead = DeadLetters::connect("nats://127.0.0.1:4222", "ORDERS_DEAD").await?;
    /// println!("{} dead letters", dead.count().await?);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<u64, DeadLetterError> {
        Ok(self.bounds().await?.2)
    }

    /// The dead letters `filter` selects, oldest first, up to its limit.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let now = now_ms();
        let mut found = Vec::new();
        let mut pass = self.pass().await?;
        while !filter.full(found.len()) {
            let Some(dead) = pass.next(self).await? else {
                break;
            };
            if filter.matches(&dead, now) {
                found.push(dead);
            }
        }
        Ok(found)
    }

    /// The dead letter `id` (its sequence), headers and payload.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::nats::dead::DeadLetters;
    /// let dead = DeadLetters::connect("nats://127.0.0.1:4222", "ORDERS_DEAD").await?;
    /// let one = dead.show("12").await?;
    /// println!("{:?}: {}", one.reason, String::from_utf8_lossy(&one.payload));
    /// # Ok(()) }
    /// ```
    pub async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
        let sequence = sequence(id)?;
        match self.stream.get_raw_message(sequence).await {
            Ok(message) => Ok(read(&message)),
            Err(e) if matches!(e.kind(), RawMessageErrorKind::NoMessageFound) => {
                Err(DeadLetterError::NotFound {
                    name: self.name.clone(),
                    id: id.to_owned(),
                })
            }
            Err(e) => Err(DeadLetterError::broker(BROKER, e)),
        }
    }

    /// Replays the dead letters `filter` selects (up to its limit) to the
    /// subjects they came from; see the [module docs](self). `filter` must
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
    /// use idem_runtime::consume::{dead::Edit, nats::dead::DeadLetters};
    /// let dead = DeadLetters::connect("nats://127.0.0.1:4222", "ORDERS_DEAD").await?;
    /// let fixed = br#"{"order_id":"o-7","sku":"PEAR-1","qty":2}"#.to_vec();
    /// let done = dead.replay_edited(&Edit::new("12", fixed)).await?;
    /// assert!(done.replayed.iter().all(|r| r.edited));
    /// # Ok(()) }
    /// ```
    pub async fn replay_edited(&self, edit: &Edit) -> Result<Replayed, DeadLetterError> {
        let done = self
            .replay_with(&edit.selection(), Some(edit.payload()))
            .await?;
        edit.found(done, &self.name)
    }

    async fn replay_with(
        &self,
        filter: &Selection,
        edit: Option<&[u8]>,
    ) -> Result<Replayed, DeadLetterError> {
        filter.check("replay")?;
        let now = now_ms();
        let mut done = Replayed::default();
        let mut pass = self.pass().await?;
        while !filter.full(done.count()) {
            let Some(dead) = pass.next(self).await? else {
                break;
            };
            let to = match filter.take(&dead, now, ("subject", "Idem-Subject"), &mut done) {
                None => continue,
                Some(Take::Copy { of }) => {
                    self.delete(&dead.id).await?;
                    done.copies.push(CopyOf::new(dead.id, of));
                    continue;
                }
                Some(Take::Replay { to }) => to,
            };
            let replays = dead.replays.saturating_add(1);
            let mut headers = HeaderMap::new();
            for (name, value) in &dead.headers {
                let name = name.as_str();
                if !NOT_REPLAYED.contains(&name) && !NATS_HEADERS.not_replayed().contains(&name) {
                    headers.append(name, value.as_str());
                }
            }
            headers.insert(REPLAYS, replays.to_string().as_str());
            if edit.is_some() {
                headers.insert(NATS_HEADERS.edited, payload_digest(&dead.payload).as_str());
            }
            let payload = edit.map_or_else(|| dead.payload.clone(), <[u8]>::to_vec);
            let published = match self
                .js
                .publish_with_headers(to.clone(), headers, payload.into())
                .await
            {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            match published {
                Ok(ack) if !ack.duplicate => {}
                Ok(_) => {
                    done.skipped.push(Skipped::new(
                        dead.id,
                        format!("the stream of `{to}` dropped the copy as a duplicate"),
                    ));
                    continue;
                }
                Err(e) if matches!(e.kind(), PublishErrorKind::StreamNotFound) => {
                    done.skipped.push(Skipped::new(
                        dead.id,
                        format!("no stream captures subject `{to}`"),
                    ));
                    continue;
                }
                Err(e) => return Err(DeadLetterError::broker(BROKER, e)),
            }
            self.delete(&dead.id).await?;
            let mut replay = Replay::new(dead.id.clone(), to, replays);
            replay.edited = edit.is_some();
            done.note(&dead, replay);
        }
        Ok(done)
    }

    /// Deletes the dead letters `filter` selects (up to its limit);
    /// [`Selection::all`] alone purges the stream at once. `filter` must name
    /// something, or be [`Selection::all`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{dead::Selection, nats::dead::DeadLetters};
    /// let dead = DeadLetters::connect("nats://127.0.0.1:4222", "ORDERS_DEAD").await?;
    /// let gone = dead.purge(&Selection::all()).await?;
    /// println!("{} purged", gone.purged);
    /// # Ok(()) }
    /// ```
    pub async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
        filter.check("purge")?;
        if filter.is_all() {
            let purged = self
                .stream
                .purge()
                .await
                .map_err(|e| DeadLetterError::broker(BROKER, e))?;
            return Ok(Purged {
                purged: purged.purged,
                ids: Vec::new(),
            });
        }
        let now = now_ms();
        let mut done = Purged::default();
        let mut pass = self.pass().await?;
        while !filter.full(done.ids.len()) {
            let Some(dead) = pass.next(self).await? else {
                break;
            };
            if filter.matches(&dead, now) {
                self.delete(&dead.id).await?;
                done.ids.push(dead.id);
                done.purged += 1;
            }
        }
        Ok(done)
    }

    /// The first and last sequence and the message count, now.
    async fn bounds(&self) -> Result<(u64, u64, u64), DeadLetterError> {
        let info = self
            .stream
            .get_info()
            .await
            .map_err(|e| DeadLetterError::broker(BROKER, e))?;
        let s = info.state;
        Ok((s.first_sequence, s.last_sequence, s.messages))
    }

    async fn pass(&self) -> Result<Pass, DeadLetterError> {
        let (first, last, messages) = self.bounds().await?;
        Ok(Pass {
            next: first.max(1),
            last: if messages == 0 { 0 } else { last },
        })
    }

    async fn delete(&self, id: &str) -> Result<(), DeadLetterError> {
        self.stream
            .delete_message(sequence(id)?)
            .await
            .map(drop)
            .map_err(|e| DeadLetterError::broker(BROKER, e))
    }
}

/// A pass over the sequences a stream held when it began.
struct Pass {
    next: u64,
    last: u64,
}

impl Pass {
    async fn next(&mut self, dead: &DeadLetters) -> Result<Option<DeadLetter>, DeadLetterError> {
        if self.next > self.last {
            return Ok(None);
        }
        // The first message at or after `next` (deleted ones leave gaps).
        match dead
            .stream
            .get_first_raw_message_by_subject(">", self.next)
            .await
        {
            Ok(message) if message.sequence <= self.last => {
                self.next = message.sequence + 1;
                Ok(Some(read(&message)))
            }
            Ok(_) => {
                self.next = self.last + 1;
                Ok(None)
            }
            Err(e) if matches!(e.kind(), RawMessageErrorKind::NoMessageFound) => {
                self.next = self.last + 1;
                Ok(None)
            }
            Err(e) => Err(DeadLetterError::broker(BROKER, e)),
        }
    }
}

fn sequence(id: &str) -> Result<u64, DeadLetterError> {
    id.trim()
        .parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| DeadLetterError::BadId {
            broker: BROKER,
            id: id.to_owned(),
            expected: "a stream sequence, a number from 1",
        })
}

/// A dead letter as the stream holds it.
fn read(message: &StreamMessage) -> DeadLetter {
    let mut headers = Vec::new();
    for (name, values) in message.headers.iter() {
        for value in values {
            headers.push((name.to_string(), value.as_str().to_owned()));
        }
    }
    let mut dead = DeadLetter::new(
        BROKER,
        message.sequence.to_string(),
        message.payload.to_vec(),
    );
    dead.headers = headers;
    dead.reason = dead.text("Idem-Reason");
    dead.attempts = dead.count("Idem-Deliveries");
    dead.replays = dead.count(REPLAYS).unwrap_or(0);
    dead.origin = dead.text("Idem-Subject");
    dead.message_id = dead.text("Idem-Original-Msg-Id");
    dead.dead_at_ms = i64::try_from(message.time.unix_timestamp_nanos() / 1_000_000).ok();
    dead.read_cause(NATS_HEADERS);
    dead
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_sequences() {
        assert_eq!(sequence("12").ok(), Some(12));
        assert_eq!(sequence(" 7 ").ok(), Some(7));
        assert!(matches!(sequence("0"), Err(DeadLetterError::BadId { .. })));
        assert!(matches!(
            sequence("0:12"),
            Err(DeadLetterError::BadId { .. })
        ));
    }
}
