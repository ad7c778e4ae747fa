//! An HTTP/1.1 client for the HTTP example's `--demo` and the HTTP
//! benchmark's clients: hyper's pooled client, which keeps its connection
//! alive between requests. With the `http` feature.
//!
//! ```no_run
//! # async fn demo(addr: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use idem_examples::http::Client;
//!
//! let client = Client::new(addr);
//! let reply = client
//!     .send("POST", "/payments", &[("idempotency-key", "\"pay-1\"")], "{}")
//!     .await?;
//! println!("{} {}", reply.status, reply.text());
//! # Ok(()) }
//! ```

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::http::{self, HeaderMap};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A boxed error, as the examples return.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The response's headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A header's value as text, if it is there.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A client of one server, keeping its connections alive between requests.
#[derive(Debug, Clone)]
pub struct Client {
    client: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Client {
    /// A client of `http://<addr>`.
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            client: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    /// Sends `method path` with `headers` and `body`, and reads the
    /// response whole.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, BoxError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .client
            .request(request.body(Full::new(body.into()))?)
            .await?;
        let (parts, body) = response.into_parts();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: body.collect().await?.to_bytes(),
        })
    }
}
