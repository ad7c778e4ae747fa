//! The two MySQL idempotency schemes applications write by hand, as
//! transaction-mode handlers, and what the dedup record adds to each.
//!
//! ```text
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --features mysql --example orders_mysql
//! ```
//!
//! **A state machine** (`UPDATE orders SET status = 'paid' WHERE id = ? AND
//! status = 'unpaid'`) stops a second transition, but a redelivery then
//! affects no row and cannot tell "this payment already paid the order" (ack
//! it) from "another payment paid it" (refund that one) or "the order was
//! cancelled". With idem the redelivery gets the first answer back, and only
//! a different payment meets the guard.
//!
//! **An optimistic lock** (`... WHERE id = ? AND version = ?`) stops two
//! writers that read the same version, not a redelivery: the redelivered
//! message reads the version its first delivery wrote and applies again. With
//! idem the redelivery never reaches the body.
//!
//! The tables are created for the run and dropped at its end.

use idem_runtime::{MySqlStore, MySqlTx, Outcome, idempotent};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------
// The state machine

#[derive(Debug, Deserialize)]
struct PaymentConfirmed {
    payment_id: String,
    order_id: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Paid {
    order_id: i64,
    by: String,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("order {order_id} is {status}, paid by {by:?}: refund this payment")]
    NotUnpaid {
        order_id: i64,
        status: String,
        by: Option<String>,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[idempotent(key = "payment_id", ttl = "7d", store = "mysql")]
async fn pay(tx: &mut MySqlTx<'_>, msg: &PaymentConfirmed) -> Result<Paid, PayError> {
    let moved = sqlx::query(
        "UPDATE example_my_orders SET status = 'paid', paid_by = ? WHERE id = ? AND status = 'unpaid'",
    )
    .bind(&msg.payment_id)
    .bind(msg.order_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved == 1 {
        return Ok(Paid {
            order_id: msg.order_id,
            by: msg.payment_id.clone(),
        });
    }
    let (status, by): (String, Option<String>) =
        sqlx::query_as("SELECT status, paid_by FROM example_my_orders WHERE id = ?")
            .bind(msg.order_id)
            .fetch_one(&mut **tx)
            .await?;
    Err(PayError::NotUnpaid {
        order_id: msg.order_id,
        status,
        by,
    })
}

// ---------------------------------------------------------------------------
// The optimistic lock

#[derive(Debug, Deserialize)]
struct Debit {
    debit_id: String,
    account: i64,
    amount: i64,
}

#[derive(Debug, thiserror::Error)]
enum DebitError {
    #[error("account {0} changed under this debit: retry it")]
    Conflict(i64),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Reads the account's version and writes under it: the usual optimistic
/// lock, safe against a concurrent writer.
async fn debit_under_version(
    conn: &mut sqlx::MySqlConnection,
    msg: &Debit,
) -> Result<i64, DebitError> {
    let (balance, version): (i64, i64) =
        sqlx::query_as("SELECT balance, version FROM example_my_accounts WHERE id = ?")
            .bind(msg.account)
            .fetch_one(&mut *conn)
            .await?;
    let moved = sqlx::query(
        "UPDATE example_my_accounts SET balance = balance - ?, version = version + 1
         WHERE id = ? AND version = ?",
    )
    .bind(msg.amount)
    .bind(msg.account)
    .bind(version)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if moved == 0 {
        return Err(DebitError::Conflict(msg.account));
    }
    Ok(balance - msg.amount)
}

#[idempotent(key = "debit_id", ttl = "7d", store = "mysql")]
async fn debit(tx: &mut MySqlTx<'_>, msg: &Debit) -> Result<i64, DebitError> {
    debit_under_version(tx, msg).await
}

async fn balance(store: &MySqlStore, account: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT balance FROM example_my_accounts WHERE id = ?")
        .bind(account)
        .fetch_one(store.pool())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("mysql:") || u.starts_with("mariadb:"))
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".into());
    let store = MySqlStore::connect(&url)
        .await?
        .with_table("example_my_orders_idem")?;
    store.migrate().await?;
    for statement in [
        "DROP TABLE IF EXISTS example_my_orders, example_my_accounts",
        "CREATE TABLE example_my_orders (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, paid_by VARCHAR(64)) ENGINE = InnoDB",
        "INSERT INTO example_my_orders VALUES (1, 'unpaid', NULL)",
        "CREATE TABLE example_my_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL) ENGINE = InnoDB",
        "INSERT INTO example_my_accounts VALUES (7, 100, 0), (8, 100, 0)",
        "TRUNCATE example_my_orders_idem",
    ] {
        sqlx::raw_sql(statement).execute(store.pool()).await?;
    }

    // The state machine: payment p-1 delivered three times, then a second
    // payment p-2 for the same order.
    let p1 = PaymentConfirmed {
        payment_id: "p-1".into(),
        order_id: 1,
    };
    let first = pay(&store, &p1).await?;
    println!("p-1, first delivery: {first:?}");
    for _ in 0..2 {
        let again = pay(&store, &p1).await?;
        println!("p-1, redelivered:    {again:?}");
        assert_eq!(again, Outcome::Duplicate(first.clone().into_inner()));
    }
    let p2 = PaymentConfirmed {
        payment_id: "p-2".into(),
        order_id: 1,
    };
    let err = pay(&store, &p2).await.expect_err("a second payment");
    println!("p-2:                 {err}");

    // The optimistic lock, by hand: a redelivery reads the version its first
    // delivery wrote, so it debits again.
    let d = Debit {
        debit_id: "d-1".into(),
        account: 7,
        amount: 30,
    };
    let mut conn = store.pool().acquire().await?;
    debit_under_version(&mut conn, &d).await?;
    debit_under_version(&mut conn, &d).await?;
    drop(conn);
    let by_hand = balance(&store, 7).await?;
    println!("optimistic lock alone, d-1 delivered twice: balance 100 -> {by_hand}");
    assert_eq!(by_hand, 40);

    // The same body as an idempotent handler: debited once.
    let d = Debit {
        debit_id: "d-2".into(),
        account: 8,
        amount: 30,
    };
    let first = debit(&store, &d).await?;
    let again = debit(&store, &d).await?;
    let with_idem = balance(&store, 8).await?;
    println!("with idem, d-2 delivered twice: {first:?}, {again:?}; balance 100 -> {with_idem}");
    assert_eq!(with_idem, 70);
    assert!(again.is_duplicate());

    sqlx::raw_sql("DROP TABLE example_my_orders, example_my_accounts, example_my_orders_idem")
        .execute(store.pool())
        .await?;
    Ok(())
}
