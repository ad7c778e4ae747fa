//! A lease store whose next completion loses its reply, once a test arms
//! it: the store writes the outcome, and the call is told the completion
//! failed, as when the connection drops after the server acted. The
//! runtime then sends the completion again.
//!
//! Where the store talks to a server (PostgreSQL, MySQL, Redis) the loss is
//! real: the store reaches its server through a [`LostReply`] proxy, which
//! lets the completion through and drops the connection before its reply.
//! Where it does not (SQLite, memory), the completion runs on the store and
//! then answers an error in place of its reply.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{BatchItem, Claim, Failure, Held, LeaseStore};
use idem_runtime::{Key, StoreError};
use idem_tests::LostReply;

/// How a [`Lossy`] store loses a reply.
#[derive(Clone)]
enum Link {
    /// Through the proxy the store reaches its server by.
    Proxy(Arc<LostReply>),
    /// In the process: the completion runs, then answers an error.
    Simulated(Arc<AtomicUsize>),
}

/// A lease store whose next completion (single or batch) loses its reply
/// once [`lose_next_completion`](Lossy::lose_next_completion) is called.
#[derive(Clone)]
pub(crate) struct Lossy<S> {
    inner: S,
    link: Link,
    armed: Arc<AtomicBool>,
    /// The next completion never answers (until its caller drops it).
    stalled: Arc<AtomicBool>,
}

impl<S: LeaseStore> Lossy<S> {
    /// `inner`, which reaches its server through `proxy`.
    pub(crate) fn proxied(inner: S, proxy: LostReply) -> Self {
        Lossy {
            inner,
            link: Link::Proxy(Arc::new(proxy)),
            armed: Arc::default(),
            stalled: Arc::default(),
        }
    }

    /// `inner`, whose lost replies are simulated.
    pub(crate) fn simulated(inner: S) -> Self {
        Lossy {
            inner,
            link: Link::Simulated(Arc::default()),
            armed: Arc::default(),
            stalled: Arc::default(),
        }
    }

    /// Holds the next completion (single or batch) without an answer, as a
    /// store that hangs: only its caller dropping it ends it.
    pub(crate) fn stall_next_completion(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// Loses the reply to the next completion.
    pub(crate) fn lose_next_completion(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many completions' replies were lost so far.
    pub(crate) fn lost(&self) -> usize {
        match &self.link {
            Link::Proxy(proxy) => proxy.lost(),
            Link::Simulated(lost) => lost.load(Ordering::SeqCst),
        }
    }

    /// Whether the replies are lost by a real connection drop.
    pub(crate) fn is_real(&self) -> bool {
        matches!(self.link, Link::Proxy(_))
    }

    /// Runs `complete` (which holds `needle`, the outcome it writes),
    /// losing its reply if armed.
    async fn completing<R>(
        &self,
        needle: &str,
        complete: impl Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        if self.stalled.swap(false, Ordering::SeqCst) {
            return std::future::pending().await;
        }
        if !self.armed.swap(false, Ordering::SeqCst) {
            return complete.await;
        }
        match &self.link {
            Link::Proxy(proxy) => {
                proxy.arm(needle.as_bytes());
                let done = complete.await;
                assert!(
                    !proxy.armed(),
                    "the completion never passed the proxy: {:?}",
                    done.as_ref().err()
                );
                done
            }
            Link::Simulated(lost) => {
                complete.await?;
                lost.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Backend(
                    "connection reset by peer (the reply to the completion was lost)".into(),
                ))
            }
        }
    }
}

impl<S: LeaseStore> LeaseStore for Lossy<S> {
    fn store_name(&self) -> &'static str {
        self.inner.store_name()
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        self.inner.claim(spec, key, fingerprint).await
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        self.completing(outcome, self.inner.complete(spec, key, token, outcome))
            .await
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.fail(spec, key, token, failure).await
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        self.inner.release(spec, key, token).await
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        self.inner.extend(spec, key, token).await
    }

    async fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim_batch(spec, items).await
    }

    /// The store's own batch completion (or the contract's default, for a
    /// store that has none), its reply lost as a whole.
    async fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let needle = done.first().map_or("", |(_, outcome)| *outcome);
        self.completing(needle, self.inner.complete_batch(spec, done))
            .await
    }

    async fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        self.inner.release_batch(spec, held).await
    }

    async fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.extend_batch(spec, held).await
    }
}

/// `url` with the port of its authority replaced by `port` (and its host
/// by the loopback address, where the proxy listens).
pub(crate) fn through(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (credentials, _) = match authority.rsplit_once('@') {
        Some((credentials, host)) => (format!("{credentials}@"), host),
        None => (String::new(), authority),
    };
    format!("{scheme}://{credentials}127.0.0.1:{port}{path}")
}

/// The port of `url`'s authority, or `default`.
pub(crate) fn port_of(url: &str, default: u16) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    host.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(default)
}
