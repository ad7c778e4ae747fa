//! The payment routes of the HTTP benchmark (`bench_http`) and of the
//! instruction count's HTTP variants (`count_instructions`): one `INSERT`
//! of a payment on PostgreSQL, answered `201` with the payment as JSON and
//! its `Location`, by a handler with a transaction of its own ([`pay_bare`]),
//! the same with one more statement beside it ([`pay_extra`]: the limits)
//! or through the request's [`RequestTx`] behind the `Idempotency-Key`
//! layer ([`pay_idem`]). With the `http` and `postgres` features.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, store: idem_runtime::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! use axum::Router;
//! use axum::routing::post;
//! use idem_examples::payments::{App, account_of, pay_bare, pay_idem};
//! use idem_runtime::http::Idempotency;
//!
//! let layer = Idempotency::scoped_by("pay", Duration::from_secs(3600), account_of)
//!     .transaction(store)?;
//! let app = App::new(pool, "payments");
//! let router: Router = Router::new()
//!     .route("/bare", post(pay_bare))
//!     .merge(Router::new().route("/idem", post(pay_idem)).route_layer(layer))
//!     .with_state(app);
//! # let _ = router;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_runtime::PgStore;
use idem_runtime::http::{RequestTx, TransactionOver};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

/// The request's account, from its `x-account` header: the layer's scope,
/// and the handlers' argument.
pub fn account_of(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get("x-account")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// The account as an extractor: `401` without the header.
#[derive(Debug)]
pub struct Account(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Account {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        account_of(parts)
            .map(Account)
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

/// A request's body: `{"amount": 12}`.
#[derive(Debug, Deserialize)]
pub struct NewPayment {
    /// The amount, in cents.
    pub amount: i64,
}

/// A payment as answered.
#[derive(Debug, Serialize)]
pub struct Payment {
    /// Its row's id.
    pub id: i64,
    /// The account that paid.
    pub account: String,
    /// The amount, in cents.
    pub amount: i64,
}

/// The server's state: the pool, and the `INSERT` into the run's table.
#[derive(Debug, Clone)]
pub struct App {
    /// The pool the bare handler opens its transactions on.
    pub pool: PgPool,
    insert: Arc<str>,
}

impl App {
    /// Payments go into `table` (`id BIGSERIAL PRIMARY KEY, account TEXT,
    /// amount BIGINT`), a name of the program's own.
    pub fn new(pool: PgPool, table: &str) -> Self {
        App {
            pool,
            insert: format!("INSERT INTO {table} (account, amount) VALUES ($1, $2) RETURNING id")
                .into(),
        }
    }

    /// The business statement, the same for every route: inserts the
    /// payment on `conn` and answers it with its id.
    pub async fn insert(
        &self,
        conn: &mut sqlx::PgConnection,
        account: String,
        amount: i64,
    ) -> Result<Payment, sqlx::Error> {
        let id = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.insert)))
            .bind(&account)
            .bind(amount)
            .fetch_one(conn)
            .await?;
        Ok(Payment {
            id,
            account,
            amount,
        })
    }
}

/// A handler's failure: `500`, which the layer does not record.
#[derive(Debug)]
pub struct Failed(pub String);

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0).into_response()
    }
}

impl From<sqlx::Error> for Failed {
    fn from(e: sqlx::Error) -> Self {
        Failed(e.to_string())
    }
}

impl From<TransactionOver> for Failed {
    fn from(e: TransactionOver) -> Self {
        Failed(e.to_string())
    }
}

/// `201` with the payment as JSON and its `Location`.
pub fn created(payment: Payment) -> Response {
    let location = format!("/payments/{}", payment.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    )
        .into_response()
}

/// No idempotency: `BEGIN; INSERT ... RETURNING id; COMMIT` on a
/// transaction of the handler's own.
pub async fn pay_bare(
    State(app): State<App>,
    Account(account): Account,
    Json(new): Json<NewPayment>,
) -> Result<Response, Failed> {
    let mut tx = app.pool.begin().await?;
    let payment = app.insert(&mut tx, account, new.amount).await?;
    tx.commit().await?;
    Ok(created(payment))
}

/// The same `INSERT` through the request's transaction, behind the
/// `Idempotency-Key` layer in transaction mode.
pub async fn pay_idem(
    State(app): State<App>,
    Account(account): Account,
    tx: RequestTx<PgStore>,
    Json(new): Json<NewPayment>,
) -> Result<Response, Failed> {
    let mut tx = tx.lock().await?;
    let payment = app.insert(&mut tx, account, new.amount).await?;
    Ok(created(payment))
}

/// What a limit route writes beside the payment, in the same transaction:
/// one more prepared statement, with no idem in the call.
#[derive(Debug, Clone)]
enum Beside {
    /// A narrow row, the payment's id and a short text.
    Note(Arc<str>),
    /// The row the layer records for a fresh request, written by hand:
    /// the same columns, and values as wide (the response as the layer
    /// stores it, a fingerprint as long as its digest).
    Record(Arc<str>),
}

/// The state of [`pay_extra`]: the payments, and what it writes beside
/// them.
#[derive(Debug, Clone)]
pub struct Extra {
    app: App,
    beside: Beside,
}

impl Extra {
    /// Writes `(id, note)` into `table` (`id BIGINT PRIMARY KEY, note TEXT
    /// NOT NULL`): the one-more-statement limit.
    pub fn note(app: App, table: &str) -> Extra {
        let insert = format!("INSERT INTO {table} (id, note) VALUES ($1, $2)");
        Extra {
            app,
            beside: Beside::Note(insert.into()),
        }
    }

    /// Writes the layer's record of the request into `table`, a dedup
    /// table made by [`PgStore::migrate`]: the limit of the layer's own
    /// statement, the row it records, without the layer around it.
    pub fn record(app: App, table: &str) -> Extra {
        let now = "(extract(epoch from statement_timestamp()) * 1000)::bigint";
        let insert = format!(
            "INSERT INTO {table} (handler, key, status, outcome, attempts, failures, fingerprint, \
             created_at, updated_at, expires_at) VALUES ($1, $2, 'completed', $3, 1, 0, $4, \
             {now}, {now}, {now} + $5) ON CONFLICT (handler, key) DO NOTHING"
        );
        Extra {
            app,
            beside: Beside::Record(insert.into()),
        }
    }
}

/// [`pay_bare`]'s transaction with one more prepared statement: a narrow
/// row ([`Extra::note`]) or the layer's record written by hand
/// ([`Extra::record`]).
pub async fn pay_extra(
    State(extra): State<Extra>,
    Account(account): Account,
    Json(new): Json<NewPayment>,
) -> Result<Response, Failed> {
    let mut tx = extra.app.pool.begin().await?;
    let payment = extra.app.insert(&mut tx, account, new.amount).await?;
    match &extra.beside {
        Beside::Note(insert) => {
            sqlx::query(AssertSqlSafe(Arc::clone(insert)))
                .bind(payment.id)
                .bind("42")
                .execute(&mut *tx)
                .await?;
        }
        Beside::Record(insert) => {
            // As the layer stores a `201`: its status, the headers it keeps
            // and the body as text.
            let body = serde_json::to_string(&payment).map_err(|e| Failed(e.to_string()))?;
            let outcome = serde_json::json!({
                "status": 201,
                "headers": [
                    ["content-type", "application/json"],
                    ["location", format!("/payments/{}", payment.id)],
                ],
                "text": body,
            });
            // The layer's key (the scope and the sent key without its
            // quotes, length-prefixed as `Key` stores its parts) and
            // fingerprint (32 hex digits).
            let sent = format!("k{}", payment.id);
            let key = format!(
                "{}:{}|{}:{sent}",
                payment.account.len(),
                payment.account,
                sent.len()
            );
            let written = sqlx::query(AssertSqlSafe(Arc::clone(insert)))
                .bind("bench_http_pay")
                .bind(key)
                .bind(outcome.to_string())
                .bind("0".repeat(32))
                .bind(3_600_000_i64)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if written != 1 {
                return Err(Failed(format!(
                    "payment {}: its record was written already",
                    payment.id
                )));
            }
        }
    }
    tx.commit().await?;
    Ok(created(payment))
}
