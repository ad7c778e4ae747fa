//! The layer's own answers: problem details (RFC 9457), with the titles the
//! draft's examples give.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// Why the layer answered without the handler's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// No key on a route that requires one.
    Missing,
    /// No key on a route that does not require one, to a handler that
    /// takes the request's key or transaction.
    NeededByHandler,
    /// A header that is not one key.
    Malformed(&'static str),
    /// The scope function named no caller.
    Unscoped,
    /// A request body larger than the route reads.
    TooLarge(usize),
    /// The key was used with another request.
    Reused,
    /// The first request with the key is still running.
    InFlight(Duration),
    /// The store did not answer: nothing was run.
    Unavailable,
    /// The server's runtime stopped the request's call before its end.
    Stopped,
    /// The handler ran, but what it answered cannot be given (its record
    /// does not read, or it kept the request's transaction).
    Internal(&'static str),
}

impl Problem {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        const USAGE: &str =
            "This operation is idempotent and it requires correct usage of Idempotency Key.";
        match self {
            Problem::Missing => (
                StatusCode::BAD_REQUEST,
                "Idempotency-Key is missing",
                USAGE.to_owned(),
            ),
            Problem::NeededByHandler => (
                StatusCode::BAD_REQUEST,
                "Idempotency-Key is missing",
                format!(
                    "{USAGE} The route takes requests without one, but this operation needs one."
                ),
            ),
            Problem::Malformed(why) => (
                StatusCode::BAD_REQUEST,
                "Idempotency-Key is malformed",
                format!("{USAGE} {why}."),
            ),
            Problem::Unscoped => (
                StatusCode::UNAUTHORIZED,
                "No caller to scope the Idempotency-Key",
                "The request names no caller, and keys are kept per caller.".to_owned(),
            ),
            Problem::TooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large",
                format!("An idempotent request's body is read whole, up to {limit} bytes."),
            ),
            Problem::Reused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency-Key is already used",
                format!(
                    "{USAGE} Idempotency Key MUST not be reused across different payloads of this operation."
                ),
            ),
            Problem::InFlight(_) => (
                StatusCode::CONFLICT,
                "A request is outstanding for this Idempotency-Key",
                "A request with the same Idempotency-Key for the same operation is being processed or is outstanding.".to_owned(),
            ),
            Problem::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Idempotency store unavailable",
                "The request was not run: its key could not be checked. Retry it with the same key.".to_owned(),
            ),
            Problem::Stopped => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Server stopping",
                "The server stopped before the request's call ended. Retry it with the same key.".to_owned(),
            ),
            Problem::Internal(why) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Idempotent response unavailable",
                (*why).to_owned(),
            ),
        }
    }

    /// The response: `application/problem+json`, with `Retry-After` where
    /// retrying is the answer.
    pub(crate) fn response(&self) -> Response<Full<Bytes>> {
        let (status, title, detail) = self.parts();
        let body = serde_json::json!({
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry_after = match self {
            Problem::InFlight(after) => Some(after.as_secs_f64().ceil().max(1.0) as u64),
            Problem::Unavailable | Problem::Stopped => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
