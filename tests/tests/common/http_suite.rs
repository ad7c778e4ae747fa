//! The HTTP suite: the `Idempotency-Key` layer (`idem_runtime::http`) in
//! front of an axum route, over real HTTP on a loopback port, written once
//! and run on every store, in each mode the store has.
//!
//! The route is `POST /orders` (and `GET /orders`, which the layer lets
//! pass). Its handler ([`App`]) answers what the request's headers script:
//! `x-status` (201 unless told), `x-sleep-ms` (a pause before answering),
//! with a JSON body naming the order, the handler's run for it, the caller
//! and the key the layer handed it (as sent, and as the handler would pass
//! it on downstream), and `location` (a header the layer
//! records) and `x-run` (one it does not). In transaction mode it writes a
//! ledger row through the request's `RequestTx`, so the effect is the rows
//! committed; in lease mode the effect is the handler's run.
//!
//! [`suite!`] stamps out one `#[tokio::test]` per scenario for a fixture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use idem_runtime::ClaimOrder;
use idem_runtime::http::{Idempotency, IdempotencyKey, RunningCalls};

use super::lease::{LeaseFixture, Time};
use super::tx::StoreKind;

/// The handler's runs, per order, and the calls of the routes serving it.
#[derive(Debug, Default)]
pub(crate) struct App {
    runs: Mutex<HashMap<String, usize>>,
    running: Mutex<Vec<RunningCalls>>,
}

impl App {
    /// Follows the calls of a route's layer.
    pub(crate) fn track(&self, running: RunningCalls) {
        self.running.lock().unwrap().push(running);
    }

    /// Waits until no call of the routes runs, those whose clients went
    /// away among them (within 10 s).
    pub(crate) async fn calls_finished(&self) {
        let running: Vec<RunningCalls> = self.running.lock().unwrap().clone();
        for calls in running {
            tokio::time::timeout(Duration::from_secs(10), calls.finished())
                .await
                .expect("the route's calls finished within 10 s");
        }
    }

    /// How often the handler ran for `order`.
    pub(crate) fn runs(&self, order: &str) -> usize {
        self.runs.lock().unwrap().get(order).copied().unwrap_or(0)
    }

    fn ran(&self, order: &str) -> usize {
        let mut runs = self.runs.lock().unwrap();
        let n = runs.entry(order.to_owned()).or_default();
        *n += 1;
        *n
    }
}

/// What a request asks of the handler, read from it.
pub(crate) struct Script {
    pub(crate) order: String,
    status: StatusCode,
    sleep: Duration,
    caller: Option<String>,
    key: Option<IdempotencyKey>,
    pub(crate) extensions: http::Extensions,
}

impl Script {
    /// Reads the request whole.
    pub(crate) async fn read(request: Request) -> Script {
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let header = |name: &str, headers: &HeaderMap| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Script {
            order: json["order"].as_str().unwrap_or("none").to_owned(),
            status: header("x-status", &parts.headers)
                .and_then(|s| s.parse::<u16>().ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::CREATED),
            sleep: Duration::from_millis(
                header("x-sleep-ms", &parts.headers)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
            ),
            caller: header("x-account", &parts.headers),
            key: parts.extensions.get::<IdempotencyKey>().cloned(),
            extensions: parts.extensions,
        }
    }

    /// The handler's answer for its `run`, `pad` bytes of padding added to
    /// its body.
    pub(crate) async fn answer(&self, app: &App, pad: usize) -> Response {
        let run = app.ran(&self.order);
        tokio::time::sleep(self.sleep).await;
        let body = serde_json::json!({
            "order": self.order,
            "run": run,
            "caller": self.caller,
            "key": self.key.as_ref().map(|k| k.sent().to_owned()),
            "downstream": self.key.as_ref().map(|k| k.downstream().to_owned()),
            "pad": "p".repeat(pad),
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            "location",
            format!("/orders/{}", self.order).parse().unwrap(),
        );
        headers.insert("x-run", run.into());
        response
    }
}

/// How a fixture's route runs: its mode, and what its claim order does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Lease,
    Tx(StoreKind),
}

impl Mode {
    /// Whether an unrecorded response takes the handler's effect back.
    pub(crate) fn rolls_back(self) -> bool {
        matches!(self, Mode::Tx(_))
    }

    /// Whether a retry of a recorded key runs the handler (claiming last).
    pub(crate) fn retry_runs_handler(self) -> bool {
        matches!(self, Mode::Tx(kind) if kind.duplicate_runs_body())
    }

    /// Whether a retry racing the first request may run the handler.
    pub(crate) fn racing_retry_runs_handler(self) -> bool {
        matches!(self, Mode::Tx(kind) if kind.racing_duplicate_may_run_body())
    }

    /// Whether a retry racing the first request waits on the key's row
    /// (claiming first on PostgreSQL or MySQL) until the first commits, or
    /// its lock timeout passes.
    pub(crate) fn racing_retry_waits(self) -> bool {
        matches!(
            self,
            Mode::Tx(StoreKind::Pg(ClaimOrder::First, _) | StoreKind::MySql(ClaimOrder::First, _))
        )
    }
}

/// A store of the test's own and the route over it.
pub(crate) trait HttpFixture: Send + Sync + Sized + 'static {
    /// A fixture of its own, or `None` when its server is unreachable.
    async fn open() -> Option<Arc<Self>>;
    /// The route's mode.
    fn mode(&self) -> Mode;
    /// `POST /orders` and `GET /orders` behind `route` over the store;
    /// `pad` bytes padded to the handler's bodies.
    fn router(self: &Arc<Self>, route: Idempotency, app: &Arc<App>, pad: usize) -> Router;
    /// How often `order`'s effect took place: ledger rows committed in
    /// transaction mode, handler runs in lease mode.
    async fn effects(&self, app: &App, order: &str) -> usize;
}

/// Lease mode over a lease fixture.
pub(crate) struct LeaseFx<F>(pub(crate) F);

impl<F: LeaseFixture + Send + Sync> HttpFixture for LeaseFx<F>
where
    F::Store: Clone,
{
    async fn open() -> Option<Arc<Self>> {
        Some(Arc::new(LeaseFx(F::open(Time::Real).await?)))
    }

    fn mode(&self) -> Mode {
        Mode::Lease
    }

    fn router(self: &Arc<Self>, route: Idempotency, app: &Arc<App>, pad: usize) -> Router {
        let layer = route
            .lease(self.0.store().clone())
            .expect("the route's name is its own");
        app.track(layer.running());
        let app = Arc::clone(app);
        let handler = move |request: Request| {
            let app = Arc::clone(&app);
            async move { Script::read(request).await.answer(&app, pad).await }
        };
        Router::new().route(
            "/orders",
            post(handler.clone()).get(handler).route_layer(layer),
        )
    }

    async fn effects(&self, app: &App, order: &str) -> usize {
        app.runs(order)
    }
}

/// Transaction mode over a SQL fixture: `tx_fixture!(Db, kind)` makes
/// `TxFx<Db>` one, its handler writing a ledger row through the request's
/// transaction; `tx_fixture!(Db, kind, Marker)` makes `TxFx<Db, Marker>`
/// one, for a second store kind (a claim order) on the same fixture.
pub(crate) struct TxFx<F, K = ()>(pub(crate) F, pub(crate) std::marker::PhantomData<K>);

#[allow(unused_macros)]
macro_rules! tx_fixture {
    ($Db:ty, $kind:expr) => {
        $crate::common::http_suite::tx_fixture!($Db, $kind, ());
    };
    ($Db:ty, $kind:expr, $K:ty) => {
        impl $crate::common::http_suite::HttpFixture for $crate::common::http_suite::TxFx<$Db, $K> {
            async fn open() -> Option<std::sync::Arc<Self>> {
                let db = <$Db as $crate::common::tx::TxFixture>::open(
                    $kind,
                    $crate::common::tx::Open::Plain,
                )
                .await?;
                Some(std::sync::Arc::new($crate::common::http_suite::TxFx(
                    db,
                    std::marker::PhantomData,
                )))
            }

            fn mode(&self) -> $crate::common::http_suite::Mode {
                $crate::common::http_suite::Mode::Tx($crate::common::tx::TxFixture::kind(&self.0))
            }

            fn router(
                self: &std::sync::Arc<Self>,
                route: idem_runtime::http::Idempotency,
                app: &std::sync::Arc<$crate::common::http_suite::App>,
                pad: usize,
            ) -> axum::Router {
                type Store = <$Db as $crate::common::tx::TxFixture>::Store;
                let layer = route
                    .transaction($crate::common::tx::TxFixture::store(&self.0).clone())
                    .expect("the route's name is its own");
                app.track(layer.running());
                let (app, fx) = (std::sync::Arc::clone(app), std::sync::Arc::clone(self));
                let handler = move |request: axum::extract::Request| {
                    let (app, fx) = (std::sync::Arc::clone(&app), std::sync::Arc::clone(&fx));
                    async move {
                        let script = $crate::common::http_suite::Script::read(request).await;
                        if let Some(tx) = script
                            .extensions
                            .get::<idem_runtime::http::RequestTx<Store>>()
                        {
                            let mut tx = tx.lock().await.expect("the request's transaction");
                            $crate::common::tx::TxFixture::add_ledger_in(
                                &fx.0,
                                &mut **tx,
                                &script.order,
                                1,
                            )
                            .await
                            .expect("the ledger row");
                        }
                        script.answer(&app, pad).await
                    }
                };
                axum::Router::new().route(
                    "/orders",
                    axum::routing::post(handler.clone())
                        .get(handler)
                        .route_layer(layer),
                )
            }

            async fn effects(&self, _: &$crate::common::http_suite::App, order: &str) -> usize {
                $crate::common::tx::TxFixture::ledger_rows(&self.0, order).await as usize
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use tx_fixture;

/// One `#[tokio::test]` per scenario of [`scenarios`] for fixture `$Fx`.
#[allow(unused_macros)]
macro_rules! suite {
    ($Fx:ty) => {
        $crate::common::http_suite::suite!(@tests $Fx;
            the_drafts_examples,
            concurrent_retries_run_once,
            concurrent_retries_wait_for_the_first,
            keys_are_scoped_by_the_caller,
            statuses_are_recorded_or_released_by_class,
            server_errors_recorded_on_request,
            other_methods_pass_through,
            sizes_are_bounded,
            optional_keys_and_the_fingerprint,
            a_client_that_hangs_up_does_not_cut_the_handler,
            a_timeout_layer_does_not_cut_the_handler,
            a_call_past_its_grace_is_dropped,
        );
    };
    (@tests $Fx:ty; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(fx) = <$Fx as $crate::common::http_suite::HttpFixture>::open().await else {
                    return;
                };
                $crate::common::http_suite::scenarios::$scenario(fx).await;
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use suite;

pub(crate) mod scenarios;
