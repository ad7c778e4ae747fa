//! What is the MySQL/MariaDB store's own, through its traits (`LeaseStore`,
//! `TxStore`, `Sweep`) and `#[idempotent(store = "mysql")]`, against the
//! server of `MYSQL_URL`: lease tokens (an extension in the same millisecond
//! still holds), a claim-last duplicate whose body fails, a duplicate waiting
//! on the claim row's lock, deadlocks, byte-exact keys, the handler name's
//! length, concurrent migrations, table names, a missing table, the sweep.
//! What every store does (claims, duplicates, rollbacks, expiry, takeovers,
//! concurrency, through the handlers) is the suites' (`mysql_lease.rs`,
//! `mysql_tx.rs`). Each test has a dedup table (and a business table) of its
//! own and drops them.

use std::time::{Duration, Instant};

use idem_runtime::clock::TimeShift;
use idem_runtime::registry::{HandlerSpec, Mode};
use idem_runtime::store::{Claim, LeaseStore, Standing, TxClaim, TxCommit, TxStore};
use idem_runtime::{ClaimOrder, Key, MySqlStore, MySqlTx, Outcome, StoreError, idempotent};
use idem_tests::{DropMySqlTables, mysql_pool, mysql_url, or_skip, unique_table};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool};

/// A fixed moment (2023-11-14T22:13:20Z), for a session whose clock stands.
const T0: i64 = 1_700_000_000_000;

const fn spec(name: &'static str, mode: Mode) -> HandlerSpec {
    HandlerSpec {
        name,
        function: name,
        key: "id",
        ttl: Duration::from_secs(3_600),
        lease: Duration::from_secs(30),
        store: "mysql",
        mode,
        module: module_path!(),
        file: file!(),
        line: line!(),
        fingerprint: None,
        max_attempts: None,
    }
}

static LEASE: HandlerSpec = spec("my_notify", Mode::Lease);
static TX: HandlerSpec = spec("my_deduct", Mode::Transaction);

fn key(part: &str) -> Key {
    Key::from_parts(&[&part]).expect("a key")
}

/// A migrated store on a dedup table of its own, and a business table
/// `ledger` (`id BIGINT PRIMARY KEY, note VARCHAR(64)`) next to it; both
/// are dropped at the end.
struct My {
    store: MySqlStore,
    pool: MySqlPool,
    table: String,
    ledger: String,
    _drop: DropMySqlTables,
}

impl My {
    /// `None` (after saying why) when the server is unreachable.
    async fn open(name: &str, lock_wait_secs: u32) -> Option<My> {
        let pool = mysql_pool(8, lock_wait_secs).await?;
        let table = unique_table(&format!("idem_my_{name}"));
        let ledger = format!("{table}_ledger");
        let drop = DropMySqlTables::new(&[&table, &ledger]);
        // Claiming last: the transaction-mode tests below are about what
        // a body that runs before its claim meets.
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&table)
            .expect("a valid table name")
            .with_lock_timeout(Duration::from_secs(lock_wait_secs.into()))
            .with_claim_order(ClaimOrder::Last);
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {ledger} (id BIGINT PRIMARY KEY, note VARCHAR(64)) ENGINE = InnoDB"
        )))
        .execute(&pool)
        .await
        .expect("create the ledger");
        Some(My {
            store,
            pool,
            table,
            ledger,
            _drop: drop,
        })
    }

    /// The ledger's rows, as notes by id.
    async fn ledger(&self) -> Vec<(i64, String)> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, note FROM {} ORDER BY id",
            self.ledger
        )))
        .fetch_all(&self.pool)
        .await
        .expect("read the ledger")
    }
}

// ---------------------------------------------------------------------------
// Lease mode

/// Extension, release and completion compare the fencing token. An
/// extension within the same millisecond changes no column, and still holds
/// the lease: sqlx sets `CLIENT_FOUND_ROWS`, so MySQL counts the row it found.
/// The store's one connection has its clock stopped at T0 (`SET timestamp`,
/// which `UTC_TIMESTAMP()` follows), so time moves only with the shift.
#[tokio::test]
async fn lease_tokens_guard_extension_release_and_completion() {
    let my = or_skip!(My::open("release", 5).await);
    let stopped = MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(format!("SET timestamp = {}", T0 / 1_000)))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&mysql_url())
        .await
        .expect("MariaDB was reachable a moment ago");
    let shift = TimeShift::new();
    let store = MySqlStore::from_pool(stopped)
        .with_table(&my.table)
        .expect("a valid table name")
        .with_time_shift(shift.clone());
    assert_eq!(LeaseStore::store_name(&store), "mysql");
    assert_eq!(TxStore::store_name(&store), "mysql");
    let k = key("m-2");
    let Claim::Fresh { token } = store.claim(&LEASE, &k, None).await.unwrap() else {
        panic!("a fresh key is taken")
    };
    shift.advance(Duration::from_secs(10));
    assert!(store.extend(&LEASE, &k, &token).await.unwrap());
    assert!(!store.extend(&LEASE, &k, "someone else's").await.unwrap());
    let r = store
        .record(LEASE.name, &k)
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(r.created_at_ms, T0);
    assert_eq!(r.expires_at_ms, T0 + 10_000 + 30_000);
    assert_eq!(r.updated_at_ms, T0 + 10_000);
    // Extending again within the same millisecond still holds the lease.
    assert!(store.extend(&LEASE, &k, &token).await.unwrap());

    store.release(&LEASE, &k, "someone else's").await.unwrap();
    assert!(store.record(LEASE.name, &k).await.unwrap().is_some());
    store.release(&LEASE, &k, &token).await.unwrap();
    assert!(store.record(LEASE.name, &k).await.unwrap().is_none());
    let Claim::Fresh { token } = store.claim(&LEASE, &k, None).await.unwrap() else {
        panic!("a released key is taken again")
    };
    assert!(
        !store
            .complete(&LEASE, &k, "someone else's", "41")
            .await
            .unwrap()
    );
    assert!(store.complete(&LEASE, &k, &token, "42").await.unwrap());
    // Sent again (its reply lost), the completion finds the record its own
    // token completed: it answers that it recorded, and writes nothing.
    assert!(
        store.complete(&LEASE, &k, &token, "42").await.unwrap(),
        "the completion's own record"
    );
    assert_eq!(
        store
            .record(LEASE.name, &k)
            .await
            .unwrap()
            .and_then(|r| r.outcome)
            .as_deref(),
        Some("42")
    );
    assert!(!store.extend(&LEASE, &k, &token).await.unwrap());
    assert_eq!(
        store.claim(&LEASE, &k, None).await.unwrap(),
        Claim::Refused(Standing::Completed {
            outcome: "42".into(),
            trace: None
        })
    );
}

#[tokio::test]
async fn keys_and_handlers_compare_byte_for_byte() {
    let my = or_skip!(My::open("bytes", 5).await);
    let store = &my.store;
    // The server's default collation is case-insensitive, and `PAD SPACE`
    // collations ignore trailing spaces: neither may merge two keys.
    static PADDED: HandlerSpec = spec("my_notify ", Mode::Lease);
    static UPPER: HandlerSpec = spec("MY_NOTIFY", Mode::Lease);
    let claims = [
        (&LEASE, key("A")),
        (&LEASE, key("a")),
        (&LEASE, key("Ä")),
        (&LEASE, key("ä")),
        (&PADDED, key("a")),
        (&UPPER, key("a")),
    ];
    for (i, (spec, k)) in claims.iter().enumerate() {
        let Claim::Fresh { token } = store.claim(spec, k, None).await.unwrap() else {
            panic!("{:?} under {:?} is a key of its own", k.as_str(), spec.name)
        };
        assert!(
            store
                .complete(spec, k, &token, &i.to_string())
                .await
                .unwrap()
        );
    }
    for (i, (spec, k)) in claims.iter().enumerate() {
        let r = store.record(spec.name, k).await.unwrap().expect("a record");
        assert_eq!(
            r.outcome,
            Some(i.to_string()),
            "{:?} {:?}",
            spec.name,
            k.as_str()
        );
    }
    assert_eq!(store.count().await.unwrap(), 6);
}

#[tokio::test]
async fn a_handler_name_longer_than_the_column_is_refused() {
    let my = or_skip!(My::open("long_name", 5).await);
    static LONG: HandlerSpec = spec(
        concat!(
            "a_handler_name_that_goes_on_and_on_and_on_and_on_and_on_and_on_and_on_",
            "and_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on_for_ever"
        ),
        Mode::Lease,
    );
    assert!(LONG.name.len() > 128);
    match my.store.claim(&LONG, &key("k"), None).await {
        Err(StoreError::Schema(msg)) => assert!(msg.contains("at most 128"), "{msg}"),
        other => panic!("a name that would be cut short must be refused: {other:?}"),
    }
    assert_eq!(my.store.count().await.unwrap(), 0);
}

// ---------------------------------------------------------------------------
// Transaction mode

#[tokio::test]
async fn tx_claim_last_a_failed_duplicate_gets_the_recorded_outcome() {
    let my = or_skip!(My::open("dup_fail", 5).await);
    let store = &my.store;
    let k = key("order-3");
    let TxClaim::Fresh(tx) = store.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    assert_eq!(
        store.commit_outcome(tx, &TX, &k, None, "7").await.unwrap(),
        TxCommit::Committed
    );
    let TxClaim::Fresh(tx) = store.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("claiming last, the body runs first")
    };
    // Its body failed (the first delivery took the stock).
    assert_eq!(
        store.rollback(tx, &TX, &k, None).await.unwrap(),
        Some(Standing::Completed {
            outcome: "7".to_owned(),
            trace: None
        })
    );
}

/// Claiming last, a body that reads anything takes InnoDB's snapshot
/// (`REPEATABLE READ`); a delivery that commits the key after that must still
/// be what the lost claim reads back, not the row as the snapshot saw it (an
/// expired window's outcome, or no row at all).
#[tokio::test]
async fn claim_last_reads_back_the_row_that_beat_it_not_its_snapshot() {
    let my = or_skip!(My::open("snapshot", 5).await);
    let shift = TimeShift::new();
    let store = my.store.clone().with_time_shift(shift.clone());
    let expired = key("expired");
    let TxClaim::Fresh(tx) = store.begin_claim(&TX, &expired, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    store
        .commit_outcome(tx, &TX, &expired, None, "\"old\"")
        .await
        .unwrap();
    shift.advance(TX.ttl + Duration::from_secs(1));

    for k in [expired, key("fresh")] {
        let TxClaim::Fresh(mut late) = store.begin_claim(&TX, &k, None).await.unwrap() else {
            panic!("claiming last, the body runs first")
        };
        // The body reads: its transaction's snapshot is taken here.
        let _: i64 =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {}", my.table)))
                .fetch_one(&mut *late)
                .await
                .unwrap();
        // Another delivery of the key commits meanwhile.
        let TxClaim::Fresh(tx) = store.begin_claim(&TX, &k, None).await.unwrap() else {
            panic!("claiming last, the body runs first")
        };
        assert_eq!(
            store
                .commit_outcome(tx, &TX, &k, None, "\"new\"")
                .await
                .unwrap(),
            TxCommit::Committed
        );
        assert_eq!(
            store
                .commit_outcome(late, &TX, &k, None, "\"mine\"")
                .await
                .unwrap(),
            TxCommit::Refused(Standing::Completed {
                outcome: "\"new\"".to_owned(),
                trace: None
            }),
            "{k}"
        );
    }
}

/// Claiming first, the claim row is the transaction's own. When it is gone
/// at the commit, the transaction that held it is too (InnoDB ends a deadlock
/// victim's transaction; DDL commits implicitly): the commit must not report
/// the call as recorded. Here the body removes the row itself, which leaves
/// the transaction open, so the test can also see that nothing it wrote is
/// committed.
#[tokio::test]
async fn claim_first_a_claim_row_gone_at_the_commit_records_nothing() {
    let my = or_skip!(My::open("claim_gone", 5).await);
    let store = my.store.clone().with_claim_order(ClaimOrder::First);
    let k = key("order-9");
    let TxClaim::Fresh(mut tx) = store.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id, note) VALUES (9, 'body')",
        my.ledger
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {}", my.table)))
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = store
        .commit_outcome(tx, &TX, &k, None, "9")
        .await
        .expect_err("the claim is gone");
    assert!(matches!(err, StoreError::Backend(_)), "{err}");
    assert!(my.ledger().await.is_empty(), "the body's write rolled back");
    assert!(store.record(TX.name, &k).await.unwrap().is_none());
}

#[tokio::test]
async fn a_concurrent_duplicate_waits_on_the_row_lock_then_is_in_progress() {
    let my = or_skip!(My::open("lock_wait", 1).await);
    let first = my.store.clone().with_claim_order(ClaimOrder::First);
    let last = my.store.clone().with_claim_order(ClaimOrder::Last);
    let k = key("busy");
    let second = Duration::from_secs(1);
    let TxClaim::Fresh(holder) = first.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };

    // Claiming first: the duplicate's claim waits on the row.
    let started = Instant::now();
    match first.begin_claim(&TX, &k, None).await.unwrap() {
        TxClaim::Refused(Standing::InProgress { retry_after }) => {
            assert_eq!(retry_after, second)
        }
        other => panic!("the duplicate gives up waiting: {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    // Claiming last: the body runs, the claim with its outcome waits.
    let TxClaim::Fresh(tx) = last.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("claiming last, the body runs first")
    };
    let started = Instant::now();
    assert_eq!(
        last.commit_outcome(tx, &TX, &k, None, "2").await.unwrap(),
        TxCommit::Refused(Standing::InProgress {
            retry_after: second
        })
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    // A lease claim of the key waits too.
    assert_eq!(
        my.store.claim(&TX, &k, None).await.unwrap(),
        Claim::Refused(Standing::InProgress {
            retry_after: second
        })
    );

    assert_eq!(
        first
            .commit_outcome(holder, &TX, &k, None, "1")
            .await
            .unwrap(),
        TxCommit::Committed
    );
    match first.begin_claim(&TX, &k, None).await.unwrap() {
        TxClaim::Refused(Standing::Completed { outcome, .. }) => assert_eq!(outcome, "1"),
        other => panic!("the first delivery's outcome stands: {other:?}"),
    }
}

#[tokio::test]
async fn a_deadlock_victim_is_in_progress_and_leaves_nothing() {
    let my = or_skip!(My::open("deadlock", 5).await);
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id, note) VALUES (1, 'stock')",
        my.ledger
    )))
    .execute(&my.pool)
    .await
    .unwrap();
    let first = my.store.clone().with_claim_order(ClaimOrder::First);
    let last = my.store.clone().with_claim_order(ClaimOrder::Last);
    let k = key("cycle");
    // One delivery claims first and holds the key's row ...
    let TxClaim::Fresh(mut t1) = first.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    // ... another claims last: its body locks the stock row ...
    let TxClaim::Fresh(mut t2) = last.begin_claim(&TX, &k, None).await.unwrap() else {
        panic!("claiming last, the body runs first")
    };
    let lock = format!("SELECT note FROM {} WHERE id = 1 FOR UPDATE", my.ledger);
    let _: (String,) = sqlx::query_as(AssertSqlSafe(lock.clone()))
        .fetch_one(&mut *t2)
        .await
        .unwrap();
    // ... which the first one's body now waits for ...
    let update = format!("UPDATE {} SET note = 'taken' WHERE id = 1", my.ledger);
    let body = tokio::spawn(async move {
        let r = sqlx::query(AssertSqlSafe(update)).execute(&mut *t1).await;
        (t1, r)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... while the second one's claim waits for the key's row: a cycle.
    // InnoDB rolls back the transaction that changed fewer rows, the second.
    let second = last
        .commit_outcome(t2, &TX, &k, None, "2")
        .await
        .expect("a deadlock is not a store failure");
    assert_eq!(
        second,
        TxCommit::Refused(Standing::InProgress {
            retry_after: Duration::from_secs(5)
        })
    );
    let (t1, r) = body.await.unwrap();
    r.expect("the first body goes on once the second is rolled back");
    assert_eq!(
        first.commit_outcome(t1, &TX, &k, None, "1").await.unwrap(),
        TxCommit::Committed
    );
    assert_eq!(my.ledger().await, [(1, "taken".to_owned())]);
    let r = my
        .store
        .record(TX.name, &k)
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(r.outcome.as_deref(), Some("1"));
}

// ---------------------------------------------------------------------------
// The attribute

#[derive(Debug)]
struct Shipped {
    order_id: i64,
}

#[idempotent(key = "msg.order_id", ttl = "1h", store = "mysql", name = "my_ship")]
async fn ship(tx: &mut MySqlTx<'_>, msg: &Shipped, ledger: &str) -> Result<i64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {ledger} (id, note) VALUES (?, 'shipped')"
    )))
    .bind(msg.order_id)
    .execute(&mut **tx)
    .await?;
    Ok(msg.order_id)
}

/// Claiming last, a duplicate's body runs before the claim can turn it away,
/// and here fails on the ledger's primary key, which the first delivery
/// took: the call still answers with the recorded outcome, not the body's
/// error, or the consumer would retry a processed message for ever.
#[tokio::test]
async fn a_duplicate_whose_body_fails_gets_the_recorded_outcome() {
    let my = or_skip!(My::open("attribute", 5).await);
    let msg = Shipped { order_id: 17 };
    assert_eq!(
        ship(&my.store, &msg, &my.ledger).await.unwrap(),
        Outcome::Executed(17)
    );
    assert_eq!(
        ship(&my.store, &msg, &my.ledger).await.unwrap(),
        Outcome::Duplicate(17)
    );
    let first = my.store.clone().with_claim_order(ClaimOrder::First);
    assert_eq!(
        ship(&first, &msg, &my.ledger).await.unwrap(),
        Outcome::Duplicate(17)
    );
    assert_eq!(my.ledger().await, [(17, "shipped".to_owned())]);
    assert_eq!(my.store.count().await.unwrap(), 1);
}

// ---------------------------------------------------------------------------
// Schema and sweeping

#[tokio::test]
async fn concurrent_migrations_all_succeed() {
    let pool = or_skip!(mysql_pool(8, 5).await);
    let table = unique_table("idem_my_migrate");
    let _drop = DropMySqlTables::new(&[&table]);
    let store = MySqlStore::from_pool(pool)
        .with_table(&table)
        .expect("a valid table name");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("every migration succeeds");
    }
    assert_eq!(store.count().await.unwrap(), 0);
    store.migrate().await.expect("and again");
    assert!(matches!(
        store.claim(&LEASE, &key("k"), None).await.unwrap(),
        Claim::Fresh { .. }
    ));
}

#[tokio::test]
async fn invalid_table_names_are_refused() {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .connect_lazy(&mysql_url())
        .expect("a valid URL");
    let store = MySqlStore::from_pool(pool);
    for bad in [
        "",
        "1abc",
        "a-b",
        "a.b.c",
        "keys; DROP TABLE x",
        "`x`",
        "x' OR '1",
        "é",
        &"x".repeat(64),
    ] {
        assert!(
            matches!(
                store.clone().with_table(bad),
                Err(StoreError::InvalidTableName { name }) if name == bad
            ),
            "{bad:?}"
        );
    }
    assert!(store.with_table("test.orders_dedup").is_ok());
}

#[tokio::test]
async fn a_missing_table_is_reported_as_such() {
    let pool = or_skip!(mysql_pool(2, 5).await);
    let table = unique_table("idem_my_missing");
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&pool)
        .await
        .unwrap();
    for name in [table.clone(), format!("{database}.{table}")] {
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&name)
            .expect("a valid table name")
            .with_claim_order(ClaimOrder::First);
        let missing = |r: Result<_, StoreError>, what: &str| match r {
            Err(StoreError::MissingTable { table }) => assert_eq!(table, name, "{what}"),
            Err(other) => panic!("{what}: {other}"),
            Ok(_) => panic!("{what}: no table, yet it worked"),
        };
        missing(
            store.claim(&LEASE, &key("k"), None).await.map(drop),
            "claim",
        );
        missing(
            store.begin_claim(&TX, &key("k"), None).await.map(drop),
            "begin_claim",
        );
        missing(
            store.record(LEASE.name, &key("k")).await.map(drop),
            "record",
        );
        missing(store.count().await.map(drop), "count");
        missing(store.sweep_expired(10).await.map(drop), "sweep");
    }
}

#[tokio::test]
async fn a_sweep_deletes_in_batches_and_does_not_wait_on_live_claims() {
    let my = or_skip!(My::open("sweep", 5).await);
    let shift = TimeShift::new();
    let store = my
        .store
        .clone()
        .with_time_shift(shift.clone())
        .with_claim_order(ClaimOrder::First);
    for i in 0..5 {
        let k = key(&format!("old-{i}"));
        let Claim::Fresh { token } = store.claim(&LEASE, &k, None).await.unwrap() else {
            panic!("a fresh key is taken")
        };
        assert!(store.complete(&LEASE, &k, &token, "null").await.unwrap());
    }
    shift.advance(LEASE.ttl);
    // A delivery in flight holds a live claim, whose expiry follows the
    // expired ones in the index.
    let live = key("live");
    let TxClaim::Fresh(holder) = store.begin_claim(&TX, &live, None).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let started = Instant::now();
    let mut swept = Vec::new();
    loop {
        let n = idem_runtime::store::Sweep::sweep_expired(&store, 2)
            .await
            .unwrap();
        swept.push(n);
        if n < 2 {
            break;
        }
    }
    assert_eq!(swept, [2, 2, 1]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the sweep waited on the live claim: {:?}",
        started.elapsed()
    );
    // Claims of other keys do not wait on a sweep either.
    assert!(matches!(
        store.claim(&LEASE, &key("new"), None).await.unwrap(),
        Claim::Fresh { .. }
    ));
    assert_eq!(
        store
            .commit_outcome(holder, &TX, &live, None, "1")
            .await
            .unwrap(),
        TxCommit::Committed
    );
    assert_eq!(store.count().await.unwrap(), 2);
    assert_eq!(my.store.table(), my.table);
}
