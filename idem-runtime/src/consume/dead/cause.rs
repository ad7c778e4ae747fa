//! What a consumer writes on a dead letter beside its reason, so that dead
//! letters can be grouped by cause and a replay can tell when the key's
//! record may be gone: the handler, the error's kind, the error alone, the
//! key and the handler's ttl (the headers are listed in the [parent
//! module's docs](super#cause-headers)). A replayed copy leaves them out,
//! as it starts afresh, except `x-idem-edited`, which stays with the
//! message for good.

use std::fmt::Display;
use std::time::Duration;

use super::DeadLetter;
use crate::error::Error;

/// The names of the cause headers on one broker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    pub(crate) handler: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) error: &'static str,
    pub(crate) key: &'static str,
    pub(crate) ttl: &'static str,
    pub(crate) edited: &'static str,
}

/// RabbitMQ's, Kafka's and RocketMQ's names.
#[cfg_attr(
    not(any(feature = "rabbitmq", feature = "kafka", feature = "rocketmq")),
    allow(dead_code)
)]
pub(crate) const HEADERS: Names = Names {
    handler: "x-idem-handler",
    kind: "x-idem-error-kind",
    error: "x-idem-error",
    key: "x-idem-key",
    ttl: "x-idem-ttl-ms",
    edited: "x-idem-edited",
};

/// NATS's names, in its headers' style.
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const NATS_HEADERS: Names = Names {
    handler: "Idem-Handler",
    kind: "Idem-Error-Kind",
    error: "Idem-Error",
    key: "Idem-Key",
    ttl: "Idem-Ttl-Ms",
    edited: "Idem-Edited",
};

impl Names {
    /// The headers a replayed copy leaves out: all but `edited`.
    pub(crate) fn not_replayed(&self) -> [&'static str; 5] {
        [self.handler, self.kind, self.error, self.key, self.ttl]
    }
}

/// Why one message was dead-lettered, as its consumer knew it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Cause {
    /// The handler's registered name (`None`: none ran, the payload did
    /// not decode).
    pub(crate) handler: Option<&'static str>,
    /// [`Error::kind`], or `decode`, `panic`.
    pub(crate) kind: &'static str,
    /// The error, without the handler or the key.
    pub(crate) error: String,
    /// The key, as shown.
    pub(crate) key: Option<String>,
    /// The handler's ttl, from the registry.
    pub(crate) ttl: Option<Duration>,
}

impl Cause {
    /// The cause of a call that returned `err`.
    pub(crate) fn of<E: Display>(err: &Error<E>) -> Cause {
        let error = match err {
            Error::Handler { error, .. } | Error::Failed { error, .. } => error.to_string(),
            Error::Exhausted {
                last_error: Some(last),
                ..
            } => last.clone(),
            Error::PayloadMismatch { .. } => "the key was recorded with another payload".into(),
            other => other.to_string(),
        };
        let handler = err.handler();
        Cause {
            handler: Some(handler),
            kind: err.kind(),
            error,
            key: err.key().map(|k| k.shown().to_owned()),
            ttl: ttl_of(handler),
        }
    }

    /// The cause of a body that panicked with `what`, in `handler` (""
    /// when not known).
    pub(crate) fn panicked(handler: &'static str, what: String) -> Cause {
        let handler = (!handler.is_empty()).then_some(handler);
        Cause {
            handler,
            kind: "panic",
            error: what,
            key: None,
            ttl: handler.and_then(ttl_of),
        }
    }

    /// The cause of a payload that does not decode: `why`.
    pub(crate) fn undecodable(why: &str) -> Cause {
        Cause {
            handler: None,
            kind: "decode",
            error: why.to_owned(),
            key: None,
            ttl: None,
        }
    }

    /// The headers to write, named as on the broker: those known, their
    /// texts cut to 4,000 characters.
    pub(crate) fn headers(&self, names: Names) -> Vec<(&'static str, String)> {
        let mut out = vec![(names.kind, self.kind.to_owned())];
        if let Some(handler) = self.handler {
            out.push((names.handler, handler.to_owned()));
        }
        out.push((names.error, header_text(&self.error)));
        if let Some(key) = &self.key {
            out.push((names.key, header_text(key)));
        }
        if let Some(ttl) = self.ttl {
            out.push((names.ttl, ttl.as_millis().to_string()));
        }
        out
    }
}

/// `text` as a header's value: cut to 4,000 characters, and on one line
/// (a header is no place for a whole report, and a NATS header value
/// cannot hold a line break).
pub(crate) fn header_text(text: &str) -> String {
    text.chars()
        .take(4_000)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The ttl of the handler registered as `name`, if it is linked in.
fn ttl_of(name: &str) -> Option<Duration> {
    crate::registry::handlers()
        .find(|h| h.name == name)
        .map(|h| h.ttl)
}

impl DeadLetter {
    /// Fills in what the cause headers `names` say.
    pub(crate) fn read_cause(&mut self, names: Names) {
        self.handler = self.text(names.handler);
        self.error_kind = self.text(names.kind);
        self.error = self.text(names.error);
        self.key = self.text(names.key);
        self.ttl = self
            .header(names.ttl)
            .and_then(|t| t.trim().parse().ok())
            .map(Duration::from_millis);
        self.edited = self.text(names.edited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Key;

    #[test]
    fn a_cause_names_the_handler_kind_error_and_key() {
        let key = Key::from_parts(&[&"o-1"]).unwrap();
        let err: Error<String> = Error::Handler {
            handler: "not_registered",
            key: key.clone(),
            error: "out of stock".into(),
        };
        let cause = Cause::of(&err);
        assert_eq!(cause.handler, Some("not_registered"));
        assert_eq!(cause.kind, "handler_error");
        assert_eq!(cause.error, "out of stock");
        assert_eq!(cause.key.as_deref(), Some(key.shown()));
        assert_eq!(cause.ttl, None);
        let headers = cause.headers(HEADERS);
        assert!(headers.contains(&("x-idem-error", "out of stock".to_owned())));
        assert!(!headers.iter().any(|(n, _)| *n == "x-idem-ttl-ms"));
        let undecodable = Cause::undecodable("bad JSON").headers(NATS_HEADERS);
        assert_eq!(
            undecodable,
            [
                ("Idem-Error-Kind", "decode".to_owned()),
                ("Idem-Error", "bad JSON".to_owned())
            ]
        );
    }
}
