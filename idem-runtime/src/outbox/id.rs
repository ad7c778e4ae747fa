//! The id of a staged message: derived from the handler, the key of the
//! delivery it answers and its place in the body, so that no retry can
//! make a second one.

use sha2::{Digest as _, Sha256};

/// The id of an outgoing message: a UUID (version 8) derived from the
/// handler's name, the key of the delivery the body answers and the
/// message's place in the body (0 for the first message it stages, 1 for
/// the next, ...).
///
/// A body that runs again after a rollback stages the same ids, and a
/// relay that publishes a row twice publishes the same id, so the broker's
/// duplicate window or an idem consumer downstream (keyed on
/// [`Delivery::id`](crate::consume::Delivery::id)) drops the repeat. The
/// derivation is SHA-256 over the three, each length-prefixed, cut to the
/// UUID's 122 free bits: two different triples give the same id with a
/// chance of about 2^-122, as two random UUIDs do.
///
/// # Examples
///
/// ```
/// use idem_runtime::outbox::MessageId;
///
/// let id = MessageId::derive("deduct_stock", "3:A-7", 0);
/// // the same triple, the same id, in any process, on any machine
/// assert_eq!(id, MessageId::derive("deduct_stock", "3:A-7", 0));
/// assert_ne!(id, MessageId::derive("deduct_stock", "3:A-7", 1));
/// assert_ne!(id, MessageId::derive("deduct_stoc", "k3:A-7", 0));
/// assert_eq!(id.as_str().len(), 36);
/// assert_eq!(id.to_string(), id.as_str());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// The id of the message at `place` staged by `handler` for the
    /// delivery keyed `key` (its stored form, [`Key::as_str`](crate::Key::as_str)).
    ///
    /// # Examples
    ///
    /// See [`MessageId`].
    pub fn derive(handler: &str, key: &str, place: u32) -> MessageId {
        let mut hash = Sha256::new();
        hash.update(b"idem.outbox.v1");
        for part in [handler.as_bytes(), key.as_bytes()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        hash.update(place.to_be_bytes());
        let digest = hash.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        MessageId(uuid::Uuid::new_v8(bytes).hyphenated().to_string())
    }

    /// An id as stored or as a broker carried it, taken as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::outbox::MessageId;
    /// let id = MessageId::derive("h", "k", 0);
    /// assert_eq!(MessageId::from_stored(id.as_str()), id);
    /// ```
    pub fn from_stored(id: &str) -> MessageId {
        MessageId(id.to_owned())
    }

    /// The id as text: a hyphenated UUID.
    ///
    /// # Examples
    ///
    /// See [`MessageId`].
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The ids of one call's messages, in the order it asks for them: what an
/// [`Outbox`](super::Outbox) stages with, and what a lease-mode body that
/// publishes directly hands the broker (see the outbox chapter of the
/// guide for what that does not cover).
///
/// # Examples
///
/// ```
/// use idem_runtime::outbox::{MessageId, MessageIds};
///
/// let mut ids = MessageIds::new("notify", "5:A-17");
/// assert_eq!(ids.next_id(), MessageId::derive("notify", "5:A-17", 0));
/// assert_eq!(ids.next_id(), MessageId::derive("notify", "5:A-17", 1));
/// assert_eq!(ids.taken(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct MessageIds {
    handler: String,
    key: String,
    next: u32,
}

impl MessageIds {
    /// The ids of `handler`'s call for the delivery keyed `key` (stored
    /// form), from place 0.
    ///
    /// # Examples
    ///
    /// See [`MessageIds`].
    pub fn new(handler: impl Into<String>, key: impl Into<String>) -> MessageIds {
        MessageIds::starting_at(handler, key, 0)
    }

    /// The ids from place `next` on: what a call that already took `next`
    /// ids goes on with.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::outbox::{MessageId, MessageIds};
    /// let mut ids = MessageIds::starting_at("notify", "k", 2);
    /// assert_eq!(ids.next_id(), MessageId::derive("notify", "k", 2));
    /// ```
    pub fn starting_at(
        handler: impl Into<String>,
        key: impl Into<String>,
        next: u32,
    ) -> MessageIds {
        MessageIds {
            handler: handler.into(),
            key: key.into(),
            next,
        }
    }

    /// The id of the next place.
    ///
    /// # Examples
    ///
    /// See [`MessageIds`].
    pub fn next_id(&mut self) -> MessageId {
        let id = MessageId::derive(&self.handler, &self.key, self.next);
        self.next = self.next.saturating_add(1);
        id
    }

    /// How many ids were taken.
    ///
    /// # Examples
    ///
    /// See [`MessageIds`].
    pub fn taken(&self) -> u32 {
        self.next
    }

    /// The handler the ids are of.
    ///
    /// # Examples
    ///
    /// ```
    /// let ids = idem_runtime::outbox::MessageIds::new("notify", "k");
    /// assert_eq!(ids.handler(), "notify");
    /// assert_eq!(ids.key(), "k");
    /// ```
    pub fn handler(&self) -> &str {
        &self.handler
    }

    /// The key (stored form) the ids are of.
    ///
    /// # Examples
    ///
    /// See [`handler`](Self::handler).
    pub fn key(&self) -> &str {
        &self.key
    }
}
