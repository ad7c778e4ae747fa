//! An HTTP API whose `POST /payments` takes an `Idempotency-Key`: a client
//! that retries after a timeout gets the first payment back instead of
//! paying twice.
//!
//! ```text
//! cargo run -p idem-examples --features http --example http_payments
//! cargo run -p idem-examples --features http --example http_payments -- --demo
//! ```
//!
//! Runs on the embedded SQLite store; nothing needs to be installed. It
//! serves on `127.0.0.1:3000` (`PORT` sets another port) and prints the
//! `curl` commands to try. With `--demo` (or `DEMO=1`) it makes those
//! requests itself on a free port (`PORT` if set), prints each answer,
//! checks it and the database, and exits: 0 when every answer was the one
//! it expected.
//!
//! The route is in transaction mode: the layer opens the SQLite
//! transaction and claims the key in it, the handler inserts the payment
//! and its ledger debit through the request's transaction ([`RequestTx`]),
//! and the layer records the response in the same transaction. The two
//! rows and the recorded response commit together or not at all.
//!
//! Keys are scoped by the `x-account` header: one account's key never
//! meets another's. In a real service the scope is the authenticated
//! principal (an authentication layer's extension, a verified token's
//! subject), never a header the client may set as it likes.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_examples::TempDb;
use idem_examples::http::{Client, Reply};
use idem_runtime::SqliteStore;
use idem_runtime::http::{Idempotency, RequestTx, TransactionOver};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The account a request is made for: here the `x-account` header; in a
/// real service the principal that authentication established.
fn account_of(parts: &Parts) -> Option<String> {
    let account = parts.headers.get("x-account")?.to_str().ok()?;
    (!account.is_empty()).then(|| account.to_owned())
}

/// The request's account, as a handler's argument (`401` without one).
struct Account(String);

impl<S: Send + Sync> FromRequestParts<S> for Account {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        account_of(parts)
            .map(Account)
            .ok_or((StatusCode::UNAUTHORIZED, "no x-account header"))
    }
}

/// What a client asks for.
#[derive(Debug, Deserialize)]
struct NewPayment {
    /// In the currency's minor unit (cents).
    amount: i64,
    currency: String,
}

/// A payment, as the API answers it.
#[derive(Debug, Serialize)]
struct Payment {
    id: String,
    account: String,
    amount: i64,
    currency: String,
}

/// Why a handler failed. A `400` is the answer to this request and is
/// recorded for its key (a retry gets it again); a `500` is not: the layer
/// rolls the transaction back and releases the key, so a retry runs again.
#[derive(Debug, thiserror::Error)]
enum ApiError {
    #[error("{0}")]
    Invalid(&'static str),
    #[error("the database failed: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Over(#[from] TransactionOver),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Db(_) | ApiError::Over(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = serde_json::json!({ "error": self.to_string() });
        (status, Json(body)).into_response()
    }
}

/// `POST /payments`: the payment and its ledger debit, in the request's
/// transaction; `201` with the payment and its `Location`.
async fn create_payment(
    Account(account): Account,
    tx: RequestTx<SqliteStore>,
    Json(new): Json<NewPayment>,
) -> Result<impl IntoResponse, ApiError> {
    if new.amount <= 0 {
        return Err(ApiError::Invalid("the amount must be positive"));
    }
    if new.currency.len() != 3 || !new.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::Invalid("the currency must be an ISO 4217 code"));
    }
    let payment = Payment {
        id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
        account,
        amount: new.amount,
        currency: new.currency,
    };
    let mut tx = tx.lock().await?;
    sqlx::query("INSERT INTO payments (id, account, amount, currency) VALUES (?, ?, ?, ?)")
        .bind(&payment.id)
        .bind(&payment.account)
        .bind(payment.amount)
        .bind(&payment.currency)
        .execute(&mut **tx)
        .await?;
    sqlx::query("INSERT INTO ledger (account, payment_id, amount, currency) VALUES (?, ?, ?, ?)")
        .bind(&payment.account)
        .bind(&payment.id)
        .bind(-payment.amount)
        .bind(&payment.currency)
        .execute(&mut **tx)
        .await?;
    let location = format!("/payments/{}", payment.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    ))
}

/// `GET /payments/{id}`: one of the account's payments, or `404`. No
/// idempotency layer: a GET changes nothing.
async fn get_payment(
    State(pool): State<SqlitePool>,
    Account(account): Account,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let found: Option<(String, String, i64, String)> = sqlx::query_as(
        "SELECT id, account, amount, currency FROM payments WHERE id = ? AND account = ?",
    )
    .bind(id)
    .bind(account)
    .fetch_optional(&pool)
    .await?;
    Ok(match found {
        Some((id, account, amount, currency)) => Json(Payment {
            id,
            account,
            amount,
            currency,
        })
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": "no such payment" })),
        )
            .into_response(),
    })
}

/// The API: `POST /payments` behind the idempotency layer, `GET
/// /payments/{id}` without it.
fn router(store: SqliteStore) -> Result<Router, BoxError> {
    let idempotency =
        Idempotency::scoped_by("create_payment", Duration::from_secs(24 * 3600), account_of)
            .transaction(store.clone())?;
    Ok(Router::new()
        .route("/payments", post(create_payment))
        // `route_layer`: the routes above only; an unknown path stays a 404
        .route_layer(idempotency)
        .route("/payments/{id}", get(get_payment))
        .with_state(store.pool().clone()))
}

/// The `curl` commands to try against `addr`.
fn print_curls(addr: SocketAddr) {
    let post = format!(
        "curl -i -X POST http://{addr}/payments -H 'x-account: acct_42' -H 'content-type: application/json'"
    );
    println!("# a payment (201, with its Location):");
    println!(
        "{post} -H 'Idempotency-Key: \"pay-0001\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'"
    );
    println!(
        "# the client's retry: the same payment, not a second one (idempotent-replayed: true):"
    );
    println!(
        "{post} -H 'Idempotency-Key: \"pay-0001\"' -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'"
    );
    println!("# the same key for another amount (422):");
    println!(
        "{post} -H 'Idempotency-Key: \"pay-0001\"' -d '{{\"amount\":9999,\"currency\":\"EUR\"}}'"
    );
    println!("# no key (400):");
    println!("{post} -d '{{\"amount\":1250,\"currency\":\"EUR\"}}'");
    println!("# the payment (its id from the first answer):");
    println!("curl -i http://{addr}/payments/<id> -H 'x-account: acct_42'");
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let demo = std::env::args().any(|a| a == "--demo")
        || std::env::var("DEMO").is_ok_and(|v| !v.is_empty() && v != "0");
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse().map_err(|e| format!("PORT={p}: {e}"))?,
        Err(_) if demo => 0,
        Err(_) => 3000,
    };

    let db = TempDb::new("http_payments");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE payments (
             id TEXT PRIMARY KEY,
             account TEXT NOT NULL,
             amount INTEGER NOT NULL,
             currency TEXT NOT NULL
         );
         CREATE TABLE ledger (
             entry INTEGER PRIMARY KEY AUTOINCREMENT,
             account TEXT NOT NULL,
             payment_id TEXT NOT NULL REFERENCES payments (id),
             amount INTEGER NOT NULL,
             currency TEXT NOT NULL
         );",
    )
    .execute(store.pool())
    .await?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let app = router(store.clone())?;
    println!("serving on http://{addr}; try:");
    println!();
    print_curls(addr);
    println!();

    if !demo {
        println!("(Ctrl-C stops it; the database is removed then)");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }

    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let result = run_demo(addr, store.pool()).await;
    server.abort();
    match &result {
        Ok(()) => println!("every answer was the expected one"),
        Err(e) => eprintln!("demo failed: {e}"),
    }
    result
}

/// Makes the requests of [`print_curls`], prints each answer and checks
/// it, then checks what the database holds.
async fn run_demo(addr: SocketAddr, pool: &SqlitePool) -> Result<(), BoxError> {
    let client = Client::new(addr);
    let post = |account: &'static str, key: Option<&'static str>, amount: i64| {
        let client = client.clone();
        async move {
            let mut headers = vec![("x-account", account), ("content-type", "application/json")];
            if let Some(key) = key {
                headers.push(("idempotency-key", key));
            }
            let body = serde_json::json!({ "amount": amount, "currency": "EUR" }).to_string();
            client.send("POST", "/payments", &headers, body).await
        }
    };

    let first = post("acct_42", Some("\"pay-0001\""), 1250).await?;
    show("POST, key \"pay-0001\", 1250 EUR", &first);
    expect(first.status == 201, "the first POST answers 201")?;
    expect(
        first.header("idempotent-replayed").is_none(),
        "the first POST is no replay",
    )?;
    let id = first.json()["id"]
        .as_str()
        .ok_or("the first POST's body has no id")?
        .to_owned();
    expect(
        first.header("location") == Some(format!("/payments/{id}").as_str()),
        "the first POST's Location names the payment",
    )?;

    let retry = post("acct_42", Some("\"pay-0001\""), 1250).await?;
    show("the retry: the same key and body", &retry);
    expect(retry.status == 201, "the retry answers 201")?;
    expect(
        retry.header("idempotent-replayed") == Some("true"),
        "the retry is marked idempotent-replayed: true",
    )?;
    expect(
        retry.body == first.body,
        "the retry's body is the first one's",
    )?;
    expect(
        retry.header("location") == first.header("location"),
        "the retry's Location is the first one's",
    )?;

    let reused = post("acct_42", Some("\"pay-0001\""), 9999).await?;
    show("the same key, another amount", &reused);
    expect(
        reused.status == 422,
        "a key reused for another request answers 422",
    )?;
    expect(
        reused.header("content-type") == Some("application/problem+json"),
        "the 422 is a problem+json",
    )?;

    let keyless = post("acct_42", None, 1250).await?;
    show("no Idempotency-Key", &keyless);
    expect(keyless.status == 400, "a POST without a key answers 400")?;

    let other = post("acct_7", Some("\"pay-0001\""), 1250).await?;
    show("another account, the same key", &other);
    expect(other.status == 201, "another account's key is its own: 201")?;
    expect(
        other.header("idempotent-replayed").is_none() && other.json()["id"] != first.json()["id"],
        "another account's key makes its own payment",
    )?;

    let got = client
        .send(
            "GET",
            &format!("/payments/{id}"),
            &[("x-account", "acct_42")],
            "",
        )
        .await?;
    show(&format!("GET /payments/{id}"), &got);
    expect(got.status == 200, "the payment is there")?;
    expect(
        got.json() == first.json(),
        "it is the payment the POST answered",
    )?;
    let foreign = client
        .send(
            "GET",
            &format!("/payments/{id}"),
            &[("x-account", "acct_7")],
            "",
        )
        .await?;
    expect(foreign.status == 404, "another account does not see it")?;

    let (payments, debits): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM payments WHERE account = 'acct_42'),
                (SELECT coalesce(sum(amount), 0) FROM ledger WHERE account = 'acct_42')",
    )
    .fetch_one(pool)
    .await?;
    println!("acct_42 in the database: {payments} payment, ledger {debits}");
    expect(payments == 1, "acct_42 paid once")?;
    expect(debits == -1250, "acct_42's ledger was debited once, 1250")?;
    Ok(())
}

fn show(what: &str, reply: &Reply) {
    let replayed = reply
        .header("idempotent-replayed")
        .map(|v| format!(", idempotent-replayed: {v}"))
        .unwrap_or_default();
    let location = reply
        .header("location")
        .map(|v| format!(", location: {v}"))
        .unwrap_or_default();
    println!(
        "{what}\n  -> {}{replayed}{location}\n     {}",
        reply.status,
        reply.text()
    );
}

fn expect(holds: bool, claim: &str) -> Result<(), BoxError> {
    if holds {
        Ok(())
    } else {
        Err(format!("expected: {claim}").into())
    }
}
