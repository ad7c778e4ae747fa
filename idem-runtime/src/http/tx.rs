//! Transaction mode for a route: the layer opens the store's transaction
//! and claims the key in it, the handler writes through it
//! ([`RequestTx`]), and the response is recorded in the same transaction:
//! the handler's writes and the recorded response commit together, or
//! neither does. A server killed between the two leaves nothing, and the
//! client's retry runs the request again; killed after the commit, the
//! retry gets the recorded response.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tower_service::Service;

use super::config::Idempotency;
use super::detached::RunningCalls;
use super::problem::Problem;
use super::service::{
    IdempotencyLayer, NoResponse, Prepared, Route, RouteMode, codecs, refused, run, sent, verdict,
    wait_for,
};
use crate::call::tx::single::{TxBegin, TxCall, tx_begin, tx_finish};
use crate::error::{BoxError, Error};
use crate::outcome::Outcome;
use crate::registry::{self, RegistryError};
use crate::store::TxStore;

/// Transaction mode over SQL store `S` (SQLite, PostgreSQL, MySQL, or an
/// `Arc` of one).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem_runtime::SqliteStore;
/// use idem_runtime::http::{Idempotency, IdempotencyLayer, Transaction};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// store.migrate().await?;
/// let layer: IdempotencyLayer<Transaction<SqliteStore>> =
///     Idempotency::unscoped("http_tx_doc", Duration::from_secs(600)).transaction(store)?;
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Transaction<S> {
    store: Arc<S>,
}

impl<S> Clone for Transaction<S> {
    fn clone(&self) -> Self {
        Transaction {
            store: Arc::clone(&self.store),
        }
    }
}

impl Idempotency {
    /// The layer in transaction mode over `store`: the route's handler
    /// takes the request's transaction as a [`RequestTx`]. Refused when a
    /// `#[idempotent]` handler of the binary has the route's name.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idem_runtime::SqliteStore;
    /// use idem_runtime::http::Idempotency;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
    /// store.migrate().await?;
    /// let layer = Idempotency::unscoped("http_create_order", Duration::from_secs(86_400)).transaction(store)?;
    /// // axum: Router::new().route("/orders", post(create_order)).route_layer(layer)
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn transaction<S: TxStore + 'static>(
        self,
        store: S,
    ) -> Result<IdempotencyLayer<Transaction<S>>, RegistryError> {
        let spec = self.spec(store.store_name(), registry::Mode::Transaction)?;
        Ok(IdempotencyLayer {
            route: Arc::new(Route { config: self, spec }),
            mode: Transaction {
                store: Arc::new(store),
            },
            running: RunningCalls::default(),
        })
    }
}

/// The request's transaction, for the handler of a route in transaction
/// mode: in the request's extensions (and, with the `axum` feature, an
/// extractor). What the handler writes through it commits with the
/// recorded response.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use idem_runtime::SqliteStore;
/// use idem_runtime::http::RequestTx;
///
/// // an axum handler
/// async fn create_order(tx: RequestTx<SqliteStore>) -> Result<String, idem_runtime::http::TransactionOver> {
///     let mut tx = tx.lock().await?;
///     sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut **tx).await.ok();
///     Ok("created".to_owned())
/// }
/// # let _ = create_order;
/// # }
/// ```
pub struct RequestTx<S: TxStore> {
    slot: Arc<Mutex<Option<TxCall<S::Tx>>>>,
    /// The request's store, route and key: where its outbox stages, and
    /// what the ids of its messages derive from.
    store: Arc<S>,
    route: &'static str,
    key: Arc<str>,
    /// How many messages the handler staged.
    staged: Arc<std::sync::atomic::AtomicU32>,
}

impl<S: TxStore> Clone for RequestTx<S> {
    fn clone(&self) -> Self {
        RequestTx {
            slot: Arc::clone(&self.slot),
            store: Arc::clone(&self.store),
            route: self.route,
            key: Arc::clone(&self.key),
            staged: Arc::clone(&self.staged),
        }
    }
}

impl<S: TxStore> std::fmt::Debug for RequestTx<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestTx")
    }
}

/// The request's transaction was asked for after the handler's response
/// was taken (by a task the handler left running).
///
/// # Examples
///
/// ```
/// let e = idem_runtime::http::TransactionOver;
/// assert!(e.to_string().contains("transaction"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request's transaction is over: its response was recorded or rolled back")]
pub struct TransactionOver;

impl<S: TxStore> RequestTx<S> {
    /// The transaction, to write through (`&mut **guard` is its
    /// connection, as `&mut **tx` in a `#[idempotent]` handler).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::SqliteStore;
    /// use idem_runtime::http::{RequestTx, TransactionOver};
    ///
    /// async fn count(tx: &RequestTx<SqliteStore>) -> Result<i64, TransactionOver> {
    ///     let mut tx = tx.lock().await?;
    ///     Ok(sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await.unwrap_or(0))
    /// }
    /// # let _ = count;
    /// ```
    pub async fn lock(&self) -> Result<TxGuard<S>, TransactionOver> {
        let guard = Arc::clone(&self.slot).lock_owned().await;
        if guard.is_none() {
            return Err(TransactionOver);
        }
        Ok(TxGuard { guard })
    }
}

#[cfg(feature = "_sql")]
impl<D: crate::store::sql::Dialect> RequestTx<crate::store::sql::SqlStore<D>> {
    /// Stages `message` in the request's transaction (see
    /// [`Outbox`](crate::outbox::Outbox)): it commits with the handler's
    /// writes and the recorded response, or not at all, and a relay
    /// publishes it after the commit. Its id derives from the route's
    /// name, the request's key (as the store keeps it, scoped by the
    /// caller where the route is) and its place among the request's
    /// messages, so a retry that runs again after a rollback stages the
    /// same ids.
    ///
    /// It locks the request's transaction for the insert, as
    /// [`lock`](Self::lock) does: drop a guard of yours before you stage
    /// (a guard held across `stage` waits on itself for ever), as the
    /// example's inner block does.
    ///
    /// # Errors
    ///
    /// [`StageError::Over`](crate::outbox::StageError::Over) once the
    /// response was taken; the others of
    /// [`Outbox::stage`](crate::outbox::Outbox::stage).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use idem_runtime::SqliteStore;
    /// use idem_runtime::http::RequestTx;
    /// use idem_runtime::outbox::Message;
    ///
    /// // an axum handler: the order's row and its `OrderPlaced` commit together
    /// async fn place_order(tx: RequestTx<SqliteStore>) -> Result<String, String> {
    ///     {
    ///         let mut tx = tx.lock().await.map_err(|e| e.to_string())?;
    ///         sqlx::query("INSERT INTO orders (id) VALUES (17)").execute(&mut **tx).await.map_err(|e| e.to_string())?;
    ///     }
    ///     let id = tx
    ///         .stage(Message::new("orders.placed", r#"{"order_id":17}"#).key("17"))
    ///         .await
    ///         .map_err(|e| e.to_string())?;
    ///     Ok(format!("placed, announced as {id}"))
    /// }
    /// # let _ = place_order;
    /// # }
    /// ```
    pub async fn stage(
        &self,
        message: crate::outbox::Message,
    ) -> Result<crate::outbox::MessageId, crate::outbox::StageError> {
        use std::sync::atomic::Ordering;
        let mut guard =
            self.lock()
                .await
                .map_err(|TransactionOver| crate::outbox::StageError::Over {
                    producer: self.route.to_owned(),
                })?;
        let place = self.staged.load(Ordering::SeqCst);
        let mut outbox = self.store.outbox_at(self.route, &self.key, place);
        let id = outbox.stage(&mut *guard, message).await?;
        self.staged.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }
}

/// The request's transaction, locked for the handler (see
/// [`RequestTx::lock`]).
///
/// # Examples
///
/// ```
/// use idem_runtime::SqliteStore;
/// use idem_runtime::http::{RequestTx, TxGuard};
///
/// async fn open(tx: &RequestTx<SqliteStore>) -> Option<TxGuard<SqliteStore>> {
///     tx.lock().await.ok()
/// }
/// # let _ = open;
/// ```
pub struct TxGuard<S: TxStore> {
    /// Holds `Some` for as long as the guard lives: it is only made of a
    /// slot that holds one, and the slot is only emptied under its lock.
    guard: OwnedMutexGuard<Option<TxCall<S::Tx>>>,
}

impl<S: TxStore> Deref for TxGuard<S> {
    type Target = S::Tx;

    fn deref(&self) -> &S::Tx {
        match self.guard.as_ref() {
            Some(call) => call.tx_ref(),
            None => unreachable!("a TxGuard's slot holds its transaction"),
        }
    }
}

impl<S: TxStore> DerefMut for TxGuard<S> {
    fn deref_mut(&mut self) -> &mut S::Tx {
        match self.guard.as_mut() {
            Some(call) => call.tx(),
            None => unreachable!("a TxGuard's slot holds its transaction"),
        }
    }
}

impl<S: TxStore + 'static> RouteMode for Transaction<S> {
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
            mut parts,
            body,
            key,
            fingerprint,
        } = request;
        let store = &*self.store;
        let spec = route.spec;
        let (codec, errors) = codecs();
        let started = Instant::now();
        let call = loop {
            match tx_begin(store, spec, &key, Some(&fingerprint), codec, errors).await {
                Ok(TxBegin::Fresh(call)) => break call,
                Ok(TxBegin::Done(outcome)) => return Ok(refused(Ok(outcome))),
                Err(e) => {
                    let in_progress = matches!(e, Error::InProgress { .. });
                    match wait_for(&route.config, started, in_progress) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => return Ok(refused(Err(e))),
                    }
                }
            }
        };
        let slot = Arc::new(Mutex::new(Some(call)));
        let staged = Arc::new(std::sync::atomic::AtomicU32::new(0));
        parts.extensions.insert(RequestTx::<S> {
            slot: Arc::clone(&slot),
            store: Arc::clone(&self.store),
            route: spec.name,
            key: key.as_str().into(),
            staged: Arc::clone(&staged),
        });
        let ran = run(inner, parts, body).await;
        // The handler's response is in: the transaction is the layer's
        // again, unless a task of the handler's still holds it.
        let call = match slot.try_lock() {
            Ok(mut held) => held.take(),
            Err(_) => None,
        };
        let Some(call) = call else {
            tracing::error!(
                handler = spec.name,
                "the handler kept the request's transaction locked past its response: it rolls back when the handler's task lets it go"
            );
            return Ok(Problem::Internal(
                "the handler kept the request's transaction past its response; nothing was recorded",
            )
            .response());
        };
        let recorded = verdict(&route.config, &ran, true);
        let result = tx_finish(
            store,
            spec,
            &key,
            Some(&fingerprint),
            codec,
            errors,
            call,
            recorded,
        )
        .await;
        match result {
            // Committed with the handler's writes (and its staged
            // messages, which the relays of this process take now).
            Ok(Outcome::Executed(_)) => {
                #[cfg(feature = "_sql")]
                crate::outbox::committed(
                    spec.name,
                    staged.load(std::sync::atomic::Ordering::SeqCst),
                );
                sent(ran)
            }
            // Not recorded (a status the route releases, a failed
            // service), or a server error recorded without the handler's
            // writes: rolled back, and the handler's answer is the
            // request's.
            Err(
                Error::Handler { .. }
                | Error::Failed {
                    replayed: false, ..
                },
            ) => match ran {
                Err(NoResponse::Service(e)) => Err(e),
                other => sent(other),
            },
            // Claiming last, the commit found the key taken by a request
            // that committed first: what it recorded is the answer. Any
            // other failure rolled the handler's writes back: the
            // handler's response would claim what did not happen.
            other => Ok(refused(other)),
        }
    }
}
