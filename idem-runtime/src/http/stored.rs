//! A response as the store records it, and as a retry gets it back.

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use super::header::IDEMPOTENT_REPLAYED;

/// A recorded response: its status, the headers the route keeps, and its
/// body (as text when it is UTF-8, as hex otherwise), or the size of a body
/// too large to keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stored {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    omitted: Option<usize>,
}

impl Stored {
    /// What is recorded of a response: `keep` headers, and the body when it
    /// is at most `max_body` bytes.
    pub(crate) fn of(parts: &Parts, body: &Bytes, keep: &[HeaderName], max_body: usize) -> Stored {
        let headers = keep
            .iter()
            .flat_map(|name| {
                parts.headers.get_all(name).iter().filter_map(move |v| {
                    let v = v.to_str().ok()?;
                    Some((name.as_str().to_owned(), v.to_owned()))
                })
            })
            .collect();
        let (text, hex, omitted) = if body.len() > max_body {
            (None, None, Some(body.len()))
        } else {
            match std::str::from_utf8(body) {
                Ok(t) => (Some(t.to_owned()), None, None),
                Err(_) => (None, Some(crate::key::hex(body)), None),
            }
        };
        Stored {
            status: parts.status.as_u16(),
            headers,
            text,
            hex,
            omitted,
        }
    }

    /// The recorded status code.
    pub(crate) fn status(&self) -> u16 {
        self.status
    }

    /// The response a retry gets: the recorded one, marked as replayed.
    /// `None` when the record is not one this layer writes.
    pub(crate) fn replay(&self) -> Option<Response<Full<Bytes>>> {
        let body = match (&self.text, &self.hex) {
            (Some(t), _) => Bytes::from(t.clone()),
            (None, Some(h)) => Bytes::from(unhex(h)?),
            (None, None) => Bytes::new(),
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
        let marker = if self.omitted.is_some() {
            "body-not-stored"
        } else {
            "true"
        };
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static(marker));
        Some(response)
    }
}

fn unhex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Stored;
    use bytes::Bytes;
    use http::{HeaderName, Response, StatusCode};
    use http_body_util::BodyExt;

    async fn round_trip(body: &'static [u8], max: usize) -> (Response<()>, Bytes) {
        let (parts, ()) = Response::builder()
            .status(StatusCode::CREATED)
            .header("content-type", "application/json")
            .header("location", "/payments/7")
            .header("set-cookie", "s=1")
            .body(())
            .unwrap()
            .into_parts();
        let keep = [http::header::CONTENT_TYPE, http::header::LOCATION];
        let stored = Stored::of(&parts, &Bytes::from_static(body), &keep, max);
        let json = serde_json::to_string(&stored).unwrap();
        let back: Stored = serde_json::from_str(&json).unwrap();
        let (parts, body) = back.replay().unwrap().into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (Response::from_parts(parts, ()), bytes)
    }

    #[tokio::test]
    async fn a_response_comes_back_with_its_kept_headers_and_marked() {
        let (r, body) = round_trip(b"{\"id\":7}", 1024).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(body, Bytes::from_static(b"{\"id\":7}"));
        assert_eq!(r.headers()["location"], "/payments/7");
        assert!(r.headers().get("set-cookie").is_none());
        assert_eq!(
            r.headers()[HeaderName::from_static("idempotent-replayed")],
            "true"
        );
        let (_, binary) = round_trip(b"\xff\x00\x80", 1024).await;
        assert_eq!(binary, Bytes::from_static(b"\xff\x00\x80"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_not_kept_and_the_replay_says_so() {
        let (r, body) = round_trip(b"0123456789", 9).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(body.is_empty());
        assert_eq!(r.headers()["idempotent-replayed"], "body-not-stored");
    }
}
