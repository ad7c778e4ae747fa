//! HTTP for the Idempotency-Key tests: an axum router served on a loopback
//! port of its own, and a client that sends one request at a time over a
//! pooled HTTP/1.1 connection (hyper's), as a retrying client would.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// An axum router served on `127.0.0.1:<free port>` until this drops.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Serves `router`.
    pub async fn start(router: axum::Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("the port");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Server { addr, task }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
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

    /// Whether the layer marked the response as a replay.
    pub fn replayed(&self) -> bool {
        self.headers.contains_key("idempotent-replayed")
    }
}

/// A client of one server.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl HttpClient {
    /// A client of `http://<addr>`.
    pub fn new(addr: SocketAddr) -> HttpClient {
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    /// Sends `method path` with `headers` and `body`; `Err` when the
    /// connection failed (the server is gone or died mid-request).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, String> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// `POST path` with an `Idempotency-Key` (sent as the draft writes it,
    /// quoted) and a JSON body; panics when the connection fails.
    pub async fn post(&self, path: &str, key: &str, body: &serde_json::Value) -> Reply {
        let quoted = format!("\"{key}\"");
        self.send(
            "POST",
            path,
            &[
                ("idempotency-key", &quoted),
                ("content-type", "application/json"),
            ],
            body.to_string(),
        )
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }
}
