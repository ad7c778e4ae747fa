//! Lease mode for a route: the key claimed with a fencing token, the
//! handler run while the lease is kept, its response recorded (or the key
//! released). For handlers whose effects leave the database (a payment
//! provider, an SMS gateway): pass [`IdempotencyKey::downstream`] on to
//! them.
//!
//! [`IdempotencyKey::downstream`]: super::IdempotencyKey::downstream

use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use super::config::Idempotency;
use super::detached::RunningCalls;
use super::service::{
    IdempotencyLayer, Prepared, Ran, Route, RouteMode, codecs, refused, run, sent, verdict,
    wait_for,
};
use crate::call::lease::single::run_lease;
use crate::error::{BoxError, Error};
use crate::registry::{self, RegistryError};
use crate::store::LeaseStore;

/// Lease mode over store `S`: every idem store.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::MemoryStore;
/// use idem_runtime::http::{Idempotency, IdempotencyLayer, Lease};
///
/// let layer: IdempotencyLayer<Lease<MemoryStore>> =
///     Idempotency::unscoped("http_lease_doc", Duration::from_secs(600)).lease(MemoryStore::new())?;
/// # let _ = layer;
/// # Ok::<(), idem_runtime::registry::RegistryError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Lease<S> {
    store: S,
}

impl Idempotency {
    /// The layer in lease mode over `store`. Refused when a `#[idempotent]`
    /// handler of the binary has the route's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::MemoryStore;
    /// use idem_runtime::http::Idempotency;
    ///
    /// let layer = Idempotency::unscoped("http_notify", Duration::from_secs(600)).lease(MemoryStore::new())?;
    /// // axum: Router::new().route("/notify", post(notify)).route_layer(layer)
    /// # let _ = layer;
    /// # Ok::<(), idem_runtime::registry::RegistryError>(())
    /// ```
    pub fn lease<S: LeaseStore>(
        self,
        store: S,
    ) -> Result<IdempotencyLayer<Lease<S>>, RegistryError> {
        let spec = self.spec(store.store_name(), registry::Mode::Lease)?;
        Ok(IdempotencyLayer {
            route: std::sync::Arc::new(Route { config: self, spec }),
            mode: Lease { store },
            running: RunningCalls::default(),
        })
    }
}

impl<S: LeaseStore> RouteMode for Lease<S> {
    async fn serve<Svc, ReqB, ResB>(
        &self,
        route: &Route,
        inner: Svc,
        request: Prepared,
    ) -> Result<Response<Full<Bytes>>, Svc::Error>
    where
        Svc: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
        Svc::Future: Send,
        Svc::Error: Send,
        ReqB: From<Bytes> + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        let Prepared {
            parts,
            body,
            key,
            fingerprint,
        } = request;
        let (codec, errors) = codecs();
        let started = Instant::now();
        let mut pending = Some((inner, parts, body));
        let mut ran: Option<Ran<Svc::Error>> = None;
        loop {
            let handler = async {
                let Some((inner, parts, body)) = pending.take() else {
                    return Err(super::service::Unrecorded::Released);
                };
                let out = run(inner, parts, body).await;
                let recorded = verdict(&route.config, &out, false);
                ran = Some(out);
                recorded
            };
            let result = run_lease(
                &self.store,
                route.spec,
                &key,
                Some(&fingerprint),
                codec,
                errors,
                handler,
            )
            .await;
            if let Some(ran) = ran.take() {
                // The handler ran: its response is the answer, recorded
                // or not (the runtime logged what became of the record).
                return sent(ran);
            }
            let in_progress = matches!(result, Err(Error::InProgress { .. }));
            match wait_for(&route.config, started, in_progress) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Ok(refused(result)),
            }
        }
    }
}
