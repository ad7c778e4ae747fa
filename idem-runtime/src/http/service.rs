//! The tower layer and its service: what every request of a route goes
//! through before its mode ([`lease`](super::lease) or
//! [`transaction`](super::tx)) claims its key.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::config::Idempotency;
use super::detached::{self, RunningCalls};
use super::header::{self, Sent};
use super::problem::Problem;
use super::stored::Stored;
use crate::codec::Codec;
use crate::error::{BoxError, Error};
use crate::final_error::{ErrorCodec, FinalCodec};
use crate::key::{DIGEST_PREFIX, Key, KeyBuilder};
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;

/// The response body of a route behind the layer: the handler's own where
/// the layer let the request pass, the layer's (recorded, replayed or a
/// problem) where it took part.
pub type IdempotentBody<B> = Either<B, Full<Bytes>>;

/// The key a request was run under, in the request's extensions for the
/// handler: in lease mode, pass [`downstream`](IdempotencyKey::downstream)
/// on as the idempotency key of a downstream call.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum_core::extract::FromRequestParts;
/// use idem_runtime::http::IdempotencyKey;
///
/// // an axum handler's argument
/// async fn send_sms(key: IdempotencyKey) -> String {
///     format!("sent under {}", key.downstream())
/// }
/// # let _ = send_sms;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    sent: String,
    key: Key,
    downstream: String,
}

impl IdempotencyKey {
    /// The key of a request from the caller `scope` (none on an unscoped
    /// route) that sent `sent`.
    fn new(scope: Option<&str>, sent: String) -> IdempotencyKey {
        let mut b = KeyBuilder::new();
        if let Some(scope) = scope {
            // Infallible: a `&str` part is never `None`.
            let _ = b.part(scope);
        }
        let _ = b.part(sent.as_str());
        let key = b.finish();
        let stored = key.as_str();
        let downstream = if stored.bytes().all(|b| b.is_ascii_graphic()) {
            stored.to_owned()
        } else {
            // The digest `Key` stores a long encoding as: of the same
            // text, so it meets no other key's stored form.
            format!(
                "{DIGEST_PREFIX}{}",
                crate::key::hex(&Sha256::digest(stored.as_bytes()))
            )
        };
        IdempotencyKey {
            sent,
            key,
            downstream,
        }
    }

    /// The key as the client sent it: the same text from two callers of a
    /// [`scoped_by`](super::Idempotency::scoped_by) route, so not the key
    /// to pass on to a provider the server calls under one account (use
    /// [`downstream`](IdempotencyKey::downstream)).
    ///
    /// # Examples
    ///
    /// ```
    /// fn logged(key: &idem_runtime::http::IdempotencyKey) -> String {
    ///     format!("the client's key {}", key.sent())
    /// }
    /// # let _ = logged;
    /// ```
    pub fn sent(&self) -> &str {
        &self.sent
    }

    /// The key to pass on as the idempotency key of a downstream call (a
    /// payment provider, an SMS gateway), so that a handler run again after
    /// a crash is deduplicated there: the caller's scope and the sent key
    /// together, so two callers who send the same key get two keys, as
    /// they get two records. It is the stored key
    /// ([`key().as_str()`](Key::as_str), at most
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN), 128, characters: within
    /// Stripe's 255) when that is visible ASCII, and otherwise (a scope
    /// or key holding spaces or other characters) its `#sha256:` digest,
    /// 72 characters, so it always fits a header. The route's name is not
    /// in it: two routes that call one provider with their clients' keys
    /// should prefix their own.
    ///
    /// # Examples
    ///
    /// ```
    /// fn charge(key: &idem_runtime::http::IdempotencyKey) -> Vec<(&'static str, String)> {
    ///     // the provider's request headers
    ///     vec![("Idempotency-Key", key.downstream().to_owned())]
    /// }
    /// # let _ = charge;
    /// ```
    pub fn downstream(&self) -> &str {
        &self.downstream
    }

    /// The key as the store records it: the caller's scope and the sent
    /// key, encoded (what the `idem` CLI shows).
    ///
    /// # Examples
    ///
    /// ```
    /// fn recorded(key: &idem_runtime::http::IdempotencyKey) -> String {
    ///     key.key().shown().to_owned()
    /// }
    /// # let _ = recorded;
    /// ```
    pub fn key(&self) -> &Key {
        &self.key
    }
}

/// A tower layer that makes a route's requests idempotent: made by
/// [`Idempotency::lease`] or [`Idempotency::transaction`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::MemoryStore;
/// use idem_runtime::http::{Idempotency, IdempotencyLayer, Lease};
///
/// let layer: IdempotencyLayer<Lease<MemoryStore>> =
///     Idempotency::unscoped("http_layer_doc", Duration::from_secs(600)).lease(MemoryStore::new())?;
/// # let _ = layer;
/// # Ok::<(), idem_runtime::registry::RegistryError>(())
/// ```
#[derive(Debug)]
pub struct IdempotencyLayer<M> {
    pub(crate) route: Arc<Route>,
    pub(crate) mode: M,
    pub(crate) running: RunningCalls,
}

impl<M: Clone> Clone for IdempotencyLayer<M> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            route: Arc::clone(&self.route),
            mode: self.mode.clone(),
            running: self.running.clone(),
        }
    }
}

impl<M> IdempotencyLayer<M> {
    /// The route's calls that run now, whether or not their clients still
    /// wait: every clone of the layer shares them. Each request the layer
    /// claims a key for runs on a task of its own, so a server that stops
    /// waits for them ([`RunningCalls::finished`]) before its runtime ends.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::MemoryStore;
    /// use idem_runtime::http::Idempotency;
    ///
    /// let layer = Idempotency::unscoped("http_layer_running_doc", Duration::from_secs(600)).lease(MemoryStore::new())?;
    /// assert_eq!(layer.running().count(), 0);
    /// # Ok::<(), idem_runtime::registry::RegistryError>(())
    /// ```
    pub fn running(&self) -> RunningCalls {
        self.running.clone()
    }
}

/// A route's configuration and the handler description it records under.
// `pub` for `RouteMode::serve`, whose implementations are the crate's alone: it
// cannot be named outside.
#[allow(unreachable_pub)]
#[derive(Debug)]
pub struct Route {
    pub(crate) config: Idempotency,
    pub(crate) spec: &'static HandlerSpec,
}

impl<Svc, M: Clone> tower_layer::Layer<Svc> for IdempotencyLayer<M> {
    type Service = IdempotencyService<Svc, M>;

    fn layer(&self, inner: Svc) -> Self::Service {
        IdempotencyService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps a route's service in.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_layer::Layer;
/// use idem_runtime::MemoryStore;
/// use idem_runtime::http::Idempotency;
///
/// let layer = Idempotency::unscoped("http_service_doc", Duration::from_secs(600)).lease(MemoryStore::new())?;
/// let service = layer.layer(tower_service_fn());
/// # fn tower_service_fn() {}
/// # let _ = service;
/// # Ok::<(), idem_runtime::registry::RegistryError>(())
/// ```
#[derive(Debug)]
pub struct IdempotencyService<Svc, M> {
    inner: Svc,
    layer: IdempotencyLayer<M>,
}

impl<Svc: Clone, M: Clone> Clone for IdempotencyService<Svc, M> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

/// A request the layer read, ready for its mode to claim its key.
// `pub` for `RouteMode::serve`, as `Route`.
#[allow(unreachable_pub)]
pub struct Prepared {
    pub(crate) parts: http::request::Parts,
    pub(crate) body: Bytes,
    pub(crate) key: Key,
    pub(crate) fingerprint: String,
}

/// What a route's handler answered: the response with its body read, or
/// the service's own error.
pub(crate) type Ran<E> = Result<(http::response::Parts, Bytes), NoResponse<E>>;

/// Why a handler gave no response to record.
pub(crate) enum NoResponse<E> {
    /// The service failed.
    Service(E),
    /// The response's body failed while it was read.
    Body,
}

/// A handler's response that is not recorded as its outcome.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Unrecorded {
    /// Its key is released (in transaction mode, its writes rolled back):
    /// a status the route does not record, or a failed service or body.
    Released,
    /// A server error the route records (transaction mode): recorded as a
    /// final failure, so that a retry gets it back, with the handler's
    /// writes rolled back: a server error claims nothing was done.
    ServerError(Stored),
}

impl std::fmt::Display for Unrecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unrecorded::Released => {
                f.write_str("the response's status is not recorded: the key is released")
            }
            Unrecorded::ServerError(stored) => write!(
                f,
                "the handler's server error ({}) is recorded, its writes rolled back",
                stored.status()
            ),
        }
    }
}

impl crate::FinalError for Unrecorded {
    fn is_final(&self) -> bool {
        matches!(self, Unrecorded::ServerError(_))
    }
}

pub(crate) fn codecs() -> (Codec<Stored>, ErrorCodec<Unrecorded>) {
    (
        Codec::new(),
        ErrorCodec::new(Some(FinalCodec::new()), Unrecorded::to_string),
    )
}

/// How a route's requests are run once read: [`Lease`](super::Lease) or
/// [`Transaction`](super::Transaction); sealed.
///
/// # Examples
///
/// ```
/// use idem_runtime::MemoryStore;
/// use idem_runtime::http::{Lease, RouteMode};
///
/// fn is_a_route_mode<M: RouteMode>() {}
/// is_a_route_mode::<Lease<MemoryStore>>();
/// ```
pub trait RouteMode: Clone + Send + Sync + 'static {
    #[doc(hidden)]
    fn serve<Svc, ReqB, ResB>(
        &self,
        route: &Route,
        inner: Svc,
        request: Prepared,
    ) -> impl Future<Output = Result<Response<Full<Bytes>>, Svc::Error>> + Send
    where
        Svc: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
        Svc::Future: Send,
        Svc::Error: Send,
        ReqB: From<Bytes> + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>;
}

impl<Svc, M, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<Svc, M>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send,
    Svc::Error: Send + 'static,
    M: RouteMode,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<IdempotentBody<ResB>>;
    type Error = Svc::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service made ready is the one to call; a clone stays behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let span = tracing::info_span!("idem.http", route = layer.route.config.name);
        // The request's trace context, unless a layer before this one (a
        // server span of the application's) continued it already.
        #[cfg(feature = "otel")]
        if !crate::trace::in_trace() {
            crate::trace::adopt(
                &span,
                request
                    .headers()
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
            );
        }
        let call = async move {
            let route = &layer.route;
            let request = match prepare(&route.config, request).await {
                Ok(prepared) => prepared,
                Err(Early::Pass(request)) => {
                    return inner.call(request).await.map(|r| r.map(Either::Left));
                }
                Err(Early::Refuse(problem)) => {
                    return Ok(problem.response().map(Either::Right));
                }
            };
            // On a task of its own: a client that hangs up, or a layer
            // that drops this future, does not stop the handler halfway.
            let (name, grace) = (route.config.name, route.config.grace);
            let running = layer.running.clone();
            let call = move || async move { layer.mode.serve(&layer.route, inner, request).await };
            match detached::run(name, grace, &running, call).await {
                Ok(response) => Ok(response?.map(Either::Right)),
                Err(detached::Gone) => Ok(Problem::Stopped.response().map(Either::Right)),
            }
        };
        Box::pin(tracing::Instrument::instrument(call, span))
    }
}

/// Put in a request the layer let pass without a key (a method it takes
/// none on, or a route that does not require one): it has no key and no
/// transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keyless;

/// Why a request goes no further than the layer's first look.
enum Early<B> {
    /// Not the layer's to handle: the route runs it as it is.
    Pass(Request<B>),
    /// Refused before anything ran.
    Refuse(Problem),
}

/// The request read: its key, scope, body and fingerprint.
async fn prepare<B>(config: &Idempotency, request: Request<B>) -> Result<Prepared, Early<B>>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if !config.methods.contains(request.method()) {
        // A method the route takes no key on: for the handler's
        // extractors, a request without one.
        let mut request = request;
        request.extensions_mut().insert(Keyless);
        return Err(Early::Pass(request));
    }
    let sent = match header::read(request.headers()) {
        Sent::Key(key) => key,
        Sent::Missing if !config.required => {
            // For the handler's extractors: a keyless request, not a route
            // without the layer.
            let mut request = request;
            request.extensions_mut().insert(Keyless);
            return Err(Early::Pass(request));
        }
        Sent::Missing => return Err(Early::Refuse(Problem::Missing)),
        Sent::Malformed(why) => return Err(Early::Refuse(Problem::Malformed(why))),
    };
    let (mut parts, body) = request.into_parts();
    let scope = match &config.scope {
        Some(scope) => match scope(&parts) {
            Some(s) => Some(s),
            None => return Err(Early::Refuse(Problem::Unscoped)),
        },
        None => None,
    };
    let body = match Limited::new(body, config.max_request_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Early::Refuse(Problem::TooLarge(config.max_request_body)));
        }
        Err(_) => {
            return Err(Early::Refuse(Problem::Malformed(
                "the request's body could not be read",
            )));
        }
    };
    let sent = IdempotencyKey::new(scope.as_deref(), sent);
    let key = sent.key.clone();
    let fingerprint = fingerprint(config, &parts, &body);
    parts.extensions.insert(sent);
    Ok(Prepared {
        parts,
        body,
        key,
        fingerprint,
    })
}

/// The request's fingerprint: a digest of the parts the route takes, each
/// with its length, so that no two different requests meet.
fn fingerprint(config: &Idempotency, parts: &http::request::Parts, body: &Bytes) -> String {
    let fp = &config.fingerprint;
    let mut h = Sha256::new();
    let mut put = |tag: u8, bytes: &[u8]| {
        h.update([tag]);
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    if fp.method {
        put(b'm', parts.method.as_str().as_bytes());
    }
    if fp.path {
        put(b'p', parts.uri.path().as_bytes());
    }
    if fp.query {
        put(b'q', parts.uri.query().unwrap_or("").as_bytes());
    }
    for name in &fp.headers {
        put(b'h', name.as_str().as_bytes());
        for value in parts.headers.get_all(name) {
            put(b'v', value.as_bytes());
        }
    }
    if fp.body {
        put(b'b', body);
    }
    crate::key::hex(&h.finalize()[..16])
}

/// Runs the route's handler on the request, its body read whole.
pub(crate) async fn run<Svc, ReqB, ResB>(
    mut inner: Svc,
    parts: http::request::Parts,
    body: Bytes,
) -> Ran<Svc::Error>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: From<Bytes>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
{
    let response = inner
        .call(Request::from_parts(parts, ReqB::from(body)))
        .await
        .map_err(NoResponse::Service)?;
    let (parts, body) = response.into_parts();
    match body.collect().await {
        Ok(collected) => Ok((parts, collected.to_bytes())),
        Err(e) => {
            let e: BoxError = e.into();
            tracing::warn!(error = %e, "the handler's response body failed: the key is released");
            Err(NoResponse::Body)
        }
    }
}

/// What of `ran` is recorded for the key as its outcome, or why not.
/// `rollback_server_errors` (transaction mode) records a server error the
/// route records as a final failure, without the handler's writes.
pub(crate) fn verdict<E>(
    config: &Idempotency,
    ran: &Ran<E>,
    rollback_server_errors: bool,
) -> Result<Stored, Unrecorded> {
    match ran {
        Ok((parts, body)) if (config.recorded)(parts.status) => {
            let stored = Stored::of(parts, body, &config.stored_headers, config.max_stored_body);
            if rollback_server_errors && parts.status.is_server_error() {
                Err(Unrecorded::ServerError(stored))
            } else {
                Ok(stored)
            }
        }
        _ => Err(Unrecorded::Released),
    }
}

/// The handler's response as it ran, to send.
pub(crate) fn sent<E>(ran: Ran<E>) -> Result<Response<Full<Bytes>>, E> {
    match ran {
        Ok((parts, body)) => Ok(Response::from_parts(parts, Full::new(body))),
        Err(NoResponse::Service(e)) => Err(e),
        Err(NoResponse::Body) => {
            Ok(Problem::Internal("the handler's response body failed").response())
        }
    }
}

/// What a request gets when the record of its key turned it away, or when
/// the store failed before its handler ran.
pub(crate) fn refused(result: Result<Outcome<Stored>, Error<Unrecorded>>) -> Response<Full<Bytes>> {
    match result {
        Ok(Outcome::Duplicate(stored) | Outcome::Executed(stored)) => {
            stored.replay().unwrap_or_else(|| {
                Problem::Internal("the recorded response does not read back").response()
            })
        }
        // A server error recorded with its writes rolled back.
        Err(Error::Failed {
            error: Unrecorded::ServerError(stored),
            ..
        }) => stored.replay().unwrap_or_else(|| {
            Problem::Internal("the recorded response does not read back").response()
        }),
        Err(Error::InProgress { retry_after, .. }) => Problem::InFlight(retry_after).response(),
        Err(Error::PayloadMismatch { .. }) => Problem::Reused.response(),
        Err(Error::Store { .. } | Error::Config { .. }) => Problem::Unavailable.response(),
        Err(Error::Codec { .. }) => {
            Problem::Internal("the recorded response does not read back").response()
        }
        Err(_) => Problem::Internal("the key's record refused the request").response(),
    }
}

/// How long to pause before asking again for a key in progress, when the
/// route waits and its time since `started` is not over.
pub(crate) fn wait_for(
    config: &Idempotency,
    started: std::time::Instant,
    in_progress: bool,
) -> Option<Duration> {
    match config.in_flight {
        super::InFlight::Wait(limit) if in_progress => {
            let left = limit.checked_sub(started.elapsed())?;
            Some(left.min(Duration::from_millis(25)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::IdempotencyKey;

    #[test]
    fn the_downstream_key_holds_the_callers_scope() {
        let alice = IdempotencyKey::new(Some("alice"), "k-1".into());
        let bob = IdempotencyKey::new(Some("bob"), "k-1".into());
        assert_eq!((alice.sent(), bob.sent()), ("k-1", "k-1"));
        assert_eq!(alice.downstream(), "5:alice|3:k-1");
        assert_eq!(bob.downstream(), "3:bob|3:k-1");
        assert_eq!(alice.downstream(), alice.key().as_str());
        // Unscoped, the key alone.
        let internal = IdempotencyKey::new(None, "k-1".into());
        assert_eq!(internal.downstream(), "3:k-1");
        assert_ne!(internal.downstream(), alice.downstream());
    }

    #[test]
    fn the_downstream_key_is_short_visible_ascii() {
        let digest = |d: &str| {
            d.len() == 72
                && d.starts_with("#sha256:")
                && d[8..].bytes().all(|b| b.is_ascii_hexdigit())
        };
        // A scope with a space or beyond ASCII, a sent key with a space: the
        // digest of the stored key, one per caller still.
        let zoe = IdempotencyKey::new(Some("Zoë"), "k-1".into());
        let spaced = IdempotencyKey::new(Some("zoe smith"), "k-1".into());
        let key_spaced = IdempotencyKey::new(Some("zoe"), "a b".into());
        for k in [&zoe, &spaced, &key_spaced] {
            assert!(digest(k.downstream()), "{}", k.downstream());
        }
        assert_ne!(zoe.downstream(), spaced.downstream());
        // A key as long as the header allows, scoped: stored as a digest
        // already, and passed on as it is.
        let long = IdempotencyKey::new(Some("alice"), "k".repeat(255));
        assert!(digest(long.downstream()), "{}", long.downstream());
        assert_eq!(long.downstream(), long.key().as_str());
        // Never the digest a plain stored key could be.
        let plain = IdempotencyKey::new(Some("zoe"), "k-1".into());
        assert_eq!(plain.downstream(), "3:zoe|3:k-1");
        assert!(
            [&zoe, &spaced, &key_spaced, &long]
                .iter()
                .all(|k| k.downstream() != plain.downstream())
        );
    }
}
