//! A network link a test breaks on purpose: [`LostReply`], a TCP proxy
//! that lets one request through to the server and loses the server's
//! reply, as a connection that drops after the server acted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long the server stays silent before a reply counts as whole.
const QUIET: Duration = Duration::from_millis(150);

/// A TCP proxy on a free loopback port to a port of the test's. Once
/// [`arm`](LostReply::arm)ed with a needle, the first request whose bytes
/// hold it reaches the server as sent; the server's whole reply (what it
/// sends until it is quiet for 150 ms) is swallowed, and the connection is
/// dropped on both sides. The server did what was asked, and the client
/// never learns it: the ambiguous failure of a real network.
///
/// Everything else goes through as it is, and so do new connections after
/// the drop.
pub struct LostReply {
    port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    needle: Mutex<Option<Vec<u8>>>,
    lost: AtomicUsize,
}

impl Shared {
    /// Whether `window` holds the armed needle; disarms it if so.
    fn take_needle(&self, window: &[u8]) -> bool {
        let mut needle = self.needle.lock().unwrap_or_else(PoisonError::into_inner);
        let found = needle
            .as_deref()
            .is_some_and(|n| !n.is_empty() && window.windows(n.len()).any(|w| w == n));
        if found {
            *needle = None;
        }
        found
    }

    fn needle_len(&self) -> usize {
        self.needle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, Vec::len)
    }
}

impl LostReply {
    /// A proxy on a free loopback port to `127.0.0.1:target`.
    pub async fn start(target: u16) -> LostReply {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the proxy's port");
        let port = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared::default());
        let task = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    tokio::spawn(relay(inbound, target, Arc::clone(&shared)));
                }
            })
        };
        LostReply { port, shared, task }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the reply to the next request whose bytes hold `needle`.
    pub fn arm(&self, needle: &[u8]) {
        *self
            .shared
            .needle
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(needle.to_vec());
    }

    /// Whether the proxy is still waiting for its needle.
    pub fn armed(&self) -> bool {
        self.shared.needle_len() > 0
    }

    /// How many replies the proxy lost so far.
    pub fn lost(&self) -> usize {
        self.shared.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LostReply {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays one connection until either side closes, or until the reply to
/// the armed request is lost.
async fn relay(inbound: TcpStream, target: u16, shared: Arc<Shared>) {
    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut client_rx, mut client_tx) = inbound.into_split();
    let (mut server_rx, mut server_tx) = outbound.into_split();
    let doomed = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        // The end of the previous read, for a needle cut in two.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut window = std::mem::take(&mut tail);
            window.extend_from_slice(&buf[..n]);
            if !doomed.load(Ordering::SeqCst) && shared.take_needle(&window) {
                // Before the request can reach the server, so that the
                // reply to it is never let through.
                doomed.store(true, Ordering::SeqCst);
            }
            let keep = shared.needle_len().saturating_sub(1).min(window.len());
            tail = window[window.len() - keep..].to_vec();
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if doomed.load(Ordering::SeqCst) {
                // The reply to the armed request: swallow all of it, then
                // drop the connection.
                while let Ok(Ok(n)) = tokio::time::timeout(QUIET, server_rx.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                }
                shared.lost.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
