//! Setting up the SQLite store: `migrate()`, custom table names, and what a
//! handler does on a store that was never migrated.

use crate::common;

use common::{AppError, Db, Probe};
use idem_runtime::{Error, Key, Outcome, SqliteStore, SqliteTx, StoreError, idempotent};

#[derive(Debug)]
struct Paid {
    invoice: u64,
    cents: i64,
}

#[idempotent(key = "msg.invoice", ttl = "1h", store = "sqlite", name = "schema_pay")]
async fn pay(tx: &mut SqliteTx<'_>, msg: &Paid, probe: &Probe) -> Result<i64, AppError> {
    probe.hit();
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, ?)")
        .bind(msg.invoice.to_string())
        .bind(msg.cents)
        .execute(&mut **tx)
        .await?;
    Ok(msg.cents)
}

async fn table_exists(store: &SqliteStore, name: &str) -> bool {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(name)
            .fetch_one(store.pool())
            .await
            .unwrap();
    n == 1
}

#[tokio::test]
async fn migrate_twice_is_fine_and_keeps_the_records() {
    let db = Db::new().await; // migrated once
    let probe = Probe::new();
    let msg = Paid {
        invoice: 1,
        cents: 250,
    };
    assert!(pay(&db.store, &msg, &probe).await.unwrap().is_executed());

    db.store.migrate().await.unwrap();
    db.store.migrate().await.unwrap();

    assert_eq!(db.record_count().await, 1);
    assert_eq!(
        pay(&db.store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(250)
    );
    assert_eq!(probe.runs(), 1);
    let index: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_keys' AND name = 'idem_keys_expires_at'",
    )
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!(index, 1, "the expiry index is missing");
}

#[tokio::test]
async fn a_custom_table_name_holds_the_records() {
    let db = Db::new().await;
    let store = db.store.clone().with_table("billing_dedup").unwrap();
    assert_eq!(store.table(), "billing_dedup");
    assert_eq!(db.store.table(), "idem_keys");
    store.migrate().await.unwrap();
    assert!(table_exists(&store, "billing_dedup").await);

    let probe = Probe::new();
    let msg = Paid {
        invoice: 2,
        cents: 99,
    };
    assert!(pay(&store, &msg, &probe).await.unwrap().is_executed());
    assert!(pay(&store, &msg, &probe).await.unwrap().is_duplicate());
    assert_eq!(probe.runs(), 1);

    assert_eq!(store.count().await.unwrap(), 1);
    assert_eq!(db.store.count().await.unwrap(), 0, "idem_keys was used");
    let key = Key::from_parts(&[&2u64]).unwrap();
    assert!(store.record("schema_pay", &key).await.unwrap().is_some());
    assert!(db.store.record("schema_pay", &key).await.unwrap().is_none());

    // The default table is a separate namespace: the same message there runs.
    assert!(pay(&db.store, &msg, &probe).await.unwrap().is_executed());
    assert_eq!(probe.runs(), 2);
}

#[tokio::test]
async fn a_schema_qualified_table_name_works() {
    let db = Db::new().await;
    let store = db.store.clone().with_table("main.qualified_dedup").unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let probe = Probe::new();
    let msg = Paid {
        invoice: 3,
        cents: 1,
    };
    assert!(pay(&store, &msg, &probe).await.unwrap().is_executed());
    assert!(pay(&store, &msg, &probe).await.unwrap().is_duplicate());
    assert!(table_exists(&store, "qualified_dedup").await);
    assert_eq!(store.count().await.unwrap(), 1);
}

#[tokio::test]
async fn invalid_table_names_are_rejected() {
    let db = Db::new().await;
    let bad = [
        "",
        "1dedup",
        "dedup; DROP TABLE ledger",
        "dedup--",
        "a.b.c",
        "\"quoted\"",
        "spaced name",
        "dédup",
        &"t".repeat(64),
    ];
    for name in bad {
        let err = db.store.clone().with_table(name).unwrap_err();
        match &err {
            StoreError::InvalidTableName { name: n } => assert_eq!(n, name),
            other => panic!("{name:?}: expected InvalidTableName, got {other:?}"),
        }
        assert!(SqliteStore::validate_table_name(name).is_err(), "{name:?}");
    }
    // Nothing reached the database.
    assert!(table_exists(&db.store, "ledger").await);
    for ok in ["dedup", "_d", "Dedup_2", "main.dedup", &"t".repeat(63)] {
        assert!(db.store.clone().with_table(ok).is_ok(), "{ok:?}");
    }
}

#[tokio::test]
async fn a_store_that_was_never_migrated_is_a_store_error_and_runs_no_body() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("raw.db")).await.unwrap();
    sqlx::query("CREATE TABLE ledger (order_id TEXT, amount INTEGER)")
        .execute(store.pool())
        .await
        .unwrap();
    let probe = Probe::new();
    let err = pay(
        &store,
        &Paid {
            invoice: 4,
            cents: 5,
        },
        &probe,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Store {
                handler: "schema_pay",
                key: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("idem_keys"), "{err}");
    assert_eq!(probe.runs(), 0);
}
