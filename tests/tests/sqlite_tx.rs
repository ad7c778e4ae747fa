//! Transaction mode on SQLite: the claim, the body's writes (an `inventory`
//! update and a `ledger` insert in the same database file) and the recorded
//! outcome commit together or not at all.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{AppError, Db, Probe, T0, Tally, together};
use idem_runtime::clock::ManualClock;
use idem_runtime::store::Status;
use idem_runtime::{Error, Key, Outcome, SqliteStore, SqliteTx, StoreError, idempotent};

#[derive(Debug, Clone)]
struct OrderPlaced {
    order_id: String,
    sku: String,
    qty: i64,
    /// The body fails after its writes, to show they roll back.
    fail: bool,
    /// The body parks on the probe's gate after its writes.
    park: bool,
}

impl OrderPlaced {
    fn new(order_id: &str, sku: &str, qty: i64) -> Self {
        OrderPlaced {
            order_id: order_id.into(),
            sku: sku.into(),
            qty,
            fail: false,
            park: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Deducted {
    order_id: String,
    stock_left: i64,
}

const DEDUCT: &str = "tx_deduct";

/// Deducts stock and writes a ledger row through the transaction.
#[idempotent(
    key = "msg.order_id + msg.sku",
    ttl = "1h",
    store = "sqlite",
    name = "tx_deduct"
)]
async fn deduct(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
    probe: &Probe,
) -> Result<Deducted, AppError> {
    probe.hit();
    let stock_left: i64 =
        sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
            .bind(msg.qty)
            .bind(&msg.sku)
            .fetch_one(&mut **tx)
            .await?;
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, ?)")
        .bind(&msg.order_id)
        .bind(msg.qty)
        .execute(&mut **tx)
        .await?;
    if msg.park {
        probe.park().await;
    }
    if msg.fail {
        return Err(AppError::Refused(format!("order {} refused", msg.order_id)));
    }
    Ok(Deducted {
        order_id: msg.order_id.clone(),
        stock_left,
    })
}

fn deduct_key(msg: &OrderPlaced) -> Key {
    Key::from_parts(&[&msg.order_id, &msg.sku]).unwrap()
}

#[tokio::test]
async fn first_delivery_executes_and_commits_claim_outcome_and_business_writes() {
    let db = Db::new().await;
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-1", "apple", 3);

    let out = deduct(&db.store, &msg, &probe).await.unwrap();

    let expected = Deducted {
        order_id: "o-1".into(),
        stock_left: 7,
    };
    assert_eq!(out, Outcome::Executed(expected.clone()));
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("apple").await, 7);
    assert_eq!(db.ledger_rows("o-1").await, 1);

    let rec = db
        .store
        .record(DEDUCT, &deduct_key(&msg))
        .await
        .unwrap()
        .expect("a record after the commit");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    let stored: Deducted = serde_json::from_str(rec.outcome.as_deref().unwrap()).unwrap();
    assert_eq!(stored, expected);
    assert_eq!(rec.handler, DEDUCT);
    assert_eq!(rec.key, "3:o-1|5:apple");
    assert!(rec.expires_at_ms >= rec.updated_at_ms + 3_600_000);
}

#[tokio::test]
async fn duplicate_returns_recorded_outcome_without_running_the_body() {
    let db = Db::new().await;
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-2", "apple", 4);
    let first = deduct(&db.store, &msg, &probe).await.unwrap();
    assert!(first.is_executed());

    for _ in 0..5 {
        let again = deduct(&db.store, &msg, &probe).await.unwrap();
        assert_eq!(again, Outcome::Duplicate(first.value().clone()));
    }
    // The redelivery carries another quantity: still the recorded result,
    // and still no second deduction.
    let changed = OrderPlaced::new("o-2", "apple", 9);
    let again = deduct(&db.store, &changed, &probe).await.unwrap();
    assert_eq!(again, Outcome::Duplicate(first.value().clone()));

    assert_eq!(probe.runs(), 1, "the body ran for a duplicate");
    assert_eq!(db.stock("apple").await, 6);
    assert_eq!(db.ledger_rows("o-2").await, 1);
    assert_eq!(db.records().await, 1);
}

#[tokio::test]
async fn body_error_rolls_back_claim_and_business_writes_and_the_retry_executes() {
    let db = Db::new().await;
    db.stock_up("pear", 10).await;
    let probe = Probe::new();
    let failing = OrderPlaced {
        fail: true,
        ..OrderPlaced::new("o-3", "pear", 2)
    };

    let err = deduct(&db.store, &failing, &probe).await.unwrap_err();
    assert_eq!(err.handler(), DEDUCT);
    assert_eq!(err.key(), Some(&deduct_key(&failing)));
    match err {
        Error::Handler {
            error: AppError::Refused(m),
            ..
        } => assert_eq!(m, "order o-3 refused"),
        other => panic!("expected Error::Handler, got {other:?}"),
    }
    assert_eq!(probe.runs(), 1);
    // The body had updated inventory and inserted a ledger row: both gone,
    // and so is the claim.
    assert_eq!(db.stock("pear").await, 10);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);
    assert!(
        db.store
            .record(DEDUCT, &deduct_key(&failing))
            .await
            .unwrap()
            .is_none()
    );

    // The redelivery (now succeeding) runs the body again and commits.
    let retry = OrderPlaced::new("o-3", "pear", 2);
    let out = deduct(&db.store, &retry, &probe).await.unwrap();
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-3".into(),
            stock_left: 8
        })
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(db.stock("pear").await, 8);
    assert_eq!(db.ledger_rows("o-3").await, 1);
    let rec = db
        .store
        .record(DEDUCT, &deduct_key(&retry))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_of_one_message_execute_exactly_once() {
    const N: usize = 64;
    let db = Arc::new(Db::new().await);
    db.stock_up("plum", 1_000).await;
    let probe = Probe::new();
    let msg = Arc::new(OrderPlaced::new("o-4", "plum", 5));

    let results = together(N, |_| {
        let (db, probe, msg) = (Arc::clone(&db), Arc::clone(&probe), Arc::clone(&msg));
        async move { deduct(&db.store, &msg, &probe).await }
    })
    .await;

    let values: Vec<Deducted> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|o| o.value().clone()))
        .collect();
    let tally = Tally::of(results);
    eprintln!("{N} concurrent deliveries of one message: {tally:?}");
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert_eq!(tally.total(), N);
    // Every caller got the one recorded result.
    assert_eq!(values.len(), N);
    assert!(values.iter().all(|v| v.stock_left == 995), "{values:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("plum").await, 995);
    assert_eq!(db.ledger_rows("o-4").await, 1);
    assert_eq!(db.records().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_distinct_messages_each_execute_exactly_once() {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let db = Arc::new(Db::new().await);
    db.stock_up("fig", 10_000).await;
    let probe = Probe::new();

    let results = together(MESSAGES * COPIES, |i| {
        let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
        let msg = OrderPlaced::new(&format!("m-{}", i % MESSAGES), "fig", 1);
        async move { deduct(&db.store, &msg, &probe).await }
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{MESSAGES} messages x {COPIES} concurrent copies: {tally:?}");
    assert_eq!(tally.executed, MESSAGES, "{tally:?}");
    assert_eq!(tally.duplicate, MESSAGES * (COPIES - 1), "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    assert_eq!(probe.runs(), MESSAGES);
    assert_eq!(db.stock("fig").await, 10_000 - MESSAGES as i64);
    assert_eq!(db.ledger_len().await, MESSAGES as i64);
    for m in 0..MESSAGES {
        assert_eq!(db.ledger_rows(&format!("m-{m}")).await, 1, "message m-{m}");
    }
    assert_eq!(db.records().await, MESSAGES as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_on_one_database_execute_a_message_once() {
    const N: usize = 32;
    let db = Arc::new(Db::new().await);
    db.stock_up("lemon", 100).await;
    // A second consumer with its own pool on the same file, as another
    // process would have.
    let other = SqliteStore::open(db.file()).await.unwrap();
    let probe = Probe::new();
    let msg = Arc::new(OrderPlaced::new("o-11", "lemon", 7));

    let results = together(N, |i| {
        let store = if i % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        let (probe, msg) = (Arc::clone(&probe), Arc::clone(&msg));
        async move { deduct(&store, &msg, &probe).await }
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{N} deliveries over two consumers: {tally:?}");
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("lemon").await, 93);
    assert_eq!(db.ledger_rows("o-11").await, 1);
}

#[tokio::test]
async fn after_the_ttl_the_key_runs_again() {
    let clock = ManualClock::new(T0);
    let db = Db::with_clock(&clock).await;
    db.stock_up("kiwi", 100).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-5", "kiwi", 10);

    assert!(deduct(&db.store, &msg, &probe).await.unwrap().is_executed());
    let rec = db
        .store
        .record(DEDUCT, &deduct_key(&msg))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.expires_at_ms, T0 + 3_600_000);

    // One millisecond before the ttl: still a duplicate.
    clock.advance(Duration::from_millis(3_600_000 - 1));
    assert!(
        deduct(&db.store, &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);

    // At the ttl the record stops suppressing the key.
    clock.advance(Duration::from_millis(1));
    let out = deduct(&db.store, &msg, &probe).await.unwrap();
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-5".into(),
            stock_left: 80
        })
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(db.stock("kiwi").await, 80);
    assert_eq!(db.ledger_rows("o-5").await, 2);

    // The new window starts now, with one record and a fresh attempt count.
    let rec = db
        .store
        .record(DEDUCT, &deduct_key(&msg))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    assert_eq!(rec.created_at_ms, T0 + 3_600_000);
    assert_eq!(rec.expires_at_ms, T0 + 7_200_000);
    assert_eq!(db.records().await, 1);
    assert!(
        deduct(&db.store, &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 2);
}

#[tokio::test]
async fn stored_outcome_that_no_longer_decodes_is_a_codec_error() {
    let db = Db::new().await;
    db.stock_up("lime", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-6", "lime", 1);
    assert!(deduct(&db.store, &msg, &probe).await.unwrap().is_executed());

    // As if the return type had changed since the record was written.
    let n = sqlx::query("UPDATE idem_keys SET outcome = ? WHERE handler = ?")
        .bind(r#"{"sku":"lime","left":9}"#)
        .bind(DEDUCT)
        .execute(db.store.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 1);

    let err = deduct(&db.store, &msg, &probe).await.unwrap_err();
    match &err {
        Error::Codec { handler, key, .. } => {
            assert_eq!(*handler, DEDUCT);
            assert_eq!(key, &deduct_key(&msg));
        }
        other => panic!("expected Error::Codec, got {other:?}"),
    }
    assert!(err.to_string().contains("tx_deduct"), "{err}");
    assert_eq!(probe.runs(), 1, "a codec failure must not run the body");
    assert_eq!(db.stock("lime").await, 9);
    assert_eq!(db.ledger_rows("o-6").await, 1);
}

/// A value that refuses to serialize.
#[derive(Debug, serde::Deserialize)]
struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("cannot encode this outcome"))
    }
}

#[idempotent(
    key = "msg.order_id",
    ttl = "1h",
    store = "sqlite",
    name = "tx_unencodable"
)]
async fn deduct_unencodable(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
    probe: &Probe,
) -> Result<Unencodable, AppError> {
    probe.hit();
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, ?)")
        .bind(&msg.order_id)
        .bind(msg.qty)
        .execute(&mut **tx)
        .await?;
    Ok(Unencodable)
}

#[tokio::test]
async fn outcome_that_does_not_encode_rolls_back_and_is_a_codec_error() {
    let db = Db::new().await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-7", "none", 1);

    for run in 1..=2 {
        let err = deduct_unencodable(&db.store, &msg, &probe)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Codec { .. }), "{err:?}");
        // Nothing was committed, so the redelivery runs again.
        assert_eq!(probe.runs(), run);
        assert_eq!(db.ledger_len().await, 0);
        assert_eq!(db.records().await, 0);
    }
}

#[derive(Debug)]
struct Refund {
    order_id: String,
    coupon: Option<String>,
}

#[idempotent(
    key = "msg.order_id + msg.coupon",
    ttl = "1h",
    store = "sqlite",
    name = "tx_refund"
)]
async fn refund(tx: &mut SqliteTx<'_>, msg: &Refund, probe: &Probe) -> Result<(), AppError> {
    probe.hit();
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, -1)")
        .bind(&msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn none_key_part_is_key_missing_and_the_body_does_not_run() {
    let db = Db::new().await;
    let probe = Probe::new();
    let msg = Refund {
        order_id: "o-8".into(),
        coupon: None,
    };

    let err = refund(&db.store, &msg, &probe).await.unwrap_err();
    match &err {
        Error::KeyMissing { handler, part } => {
            assert_eq!(*handler, "tx_refund");
            assert_eq!(*part, "msg.coupon");
        }
        other => panic!("expected Error::KeyMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("msg.coupon"), "{err}");
    assert_eq!(probe.runs(), 0);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);

    let msg = Refund {
        coupon: Some("C-1".into()),
        ..msg
    };
    assert_eq!(
        refund(&db.store, &msg, &probe).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(
        refund(&db.store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(())
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.ledger_rows("o-8").await, 1);
}

#[tokio::test]
async fn handler_runs_on_a_store_built_from_the_applications_pool() {
    // The application's own pool: business tables and dedup table share it.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("app.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let store = SqliteStore::from_pool(pool);
    store.migrate().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL);
         CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, amount INTEGER NOT NULL);
         INSERT INTO inventory VALUES ('date', 5);",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-9", "date", 2);
    assert!(deduct(&store, &msg, &probe).await.unwrap().is_executed());
    assert!(deduct(&store, &msg, &probe).await.unwrap().is_duplicate());
    let stock: i64 = sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = 'date'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!((probe.runs(), stock), (1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_waiting_on_an_open_first_delivery_past_the_lock_timeout_runs_no_body() {
    // A 200 ms lock timeout instead of the default 5 s, to keep the test fast.
    let dir = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("idem.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_millis(200));
    let store = SqliteStore::connect_with(options).await.unwrap();
    let db = Arc::new(Db::with_store(store, dir).await);
    db.stock_up("yuzu", 10).await;
    let probe = Probe::new();

    // The first delivery holds its transaction open in the body.
    let first = {
        let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
        tokio::spawn(async move {
            let msg = OrderPlaced {
                park: true,
                ..OrderPlaced::new("o-10", "yuzu", 1)
            };
            deduct(&db.store, &msg, &probe).await
        })
    };
    probe.wait_parked().await;

    let msg = OrderPlaced::new("o-10", "yuzu", 1);
    let second = deduct(&db.store, &msg, &probe).await;
    eprintln!("second delivery while the first holds the lock: {second:?}");
    // SQLite has one writer: the wait is on the database's write lock (held
    // by whichever transaction), not on this key's row, so the store reports
    // a timeout rather than `InProgress` (see `SqliteStore`'s docs). Either
    // way the consumer nacks and redelivers.
    match &second {
        Err(Error::Store {
            source: StoreError::Timeout(_),
            handler: DEDUCT,
            key: Some(k),
        }) => assert_eq!(k, &deduct_key(&msg)),
        other => panic!("expected a store timeout, got {other:?}"),
    }
    assert_eq!(probe.runs(), 1, "the waiting delivery ran its body");

    probe.open_gate();
    assert!(first.await.unwrap().unwrap().is_executed());
    assert!(
        deduct(&db.store, &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("yuzu").await, 9);
    assert_eq!(db.ledger_rows("o-10").await, 1);
}
