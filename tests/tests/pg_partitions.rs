//! A PostgreSQL dedup table partitioned by time (`PgStore::with_partitions`):
//! one record a key across partitions, whatever partition holds it and
//! however periods end under concurrent claims; partitions made ahead and
//! dropped once expired; the default partition; a plain table turned into
//! a partitioned one. Partitions of one second, so that periods end while
//! a test runs; each test has its own table and drops it (and its
//! functions).
//!
//! The transaction suite on a partitioned table is in `pg_tx.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::store::sql::Partitions;
use idem_runtime::{Error, Outcome, PgStore, PgTx, idempotent};
use idem_tests::{DropTables, next_period, pg_pool, unique_table};
use sqlx::{AssertSqlSafe, PgPool};

#[derive(Debug, Clone)]
struct Ping {
    id: String,
}

/// Counts its body's runs per id: an effect outside any transaction.
#[derive(Default)]
struct Effects(std::sync::Mutex<HashMap<String, u32>>);

impl Effects {
    fn hit(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }
    fn of(&self, id: &str) -> u32 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[idempotent(key = "msg.id", ttl = "1h", store = "postgres", name = "part_lease")]
async fn lease_ping(msg: &Ping, effects: &Effects) -> Result<String, std::io::Error> {
    effects.hit(&msg.id);
    Ok(format!("pong {}", msg.id))
}

#[idempotent(
    key = "id",
    ttl = "2s",
    store = "postgres",
    name = "part_short",
    lease = "1s"
)]
async fn short_ping(msg: &Ping) -> Result<u32, std::io::Error> {
    Ok(msg.id.len() as u32)
}

#[idempotent(key = "msg.id", ttl = "1h", store = "postgres", name = "part_tx")]
async fn tx_ping(tx: &mut PgTx<'_>, msg: &Ping, ledger: &str) -> Result<i64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {ledger} (id) VALUES ($1)"
    )))
    .bind(&msg.id)
    .execute(&mut **tx)
    .await?;
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {ledger}")))
        .fetch_one(&mut **tx)
        .await
}

#[idempotent(key = "msg.id", ttl = "1h", store = "postgres", name = "part_slow")]
async fn slow_tx(tx: &mut PgTx<'_>, msg: &Ping, ledger: &str) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {ledger} (id) VALUES ($1)"
    )))
    .bind(&msg.id)
    .execute(&mut **tx)
    .await?;
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(())
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "postgres",
    name = "part_batch",
    lease = "3s"
)]
async fn batch_ping(msgs: &[Ping]) -> Result<Vec<usize>, std::io::Error> {
    // Past a third of the lease: the keeper extends the batch's claims.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    Ok(msgs.iter().map(|m| m.id.len()).collect())
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "postgres",
    name = "part_batch_failing"
)]
async fn failing_batch_ping(msgs: &[Ping]) -> Result<Vec<usize>, std::io::Error> {
    let _ = msgs;
    // Into the next period: the claims are released from the one before.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    Err(std::io::Error::other("the body fails"))
}

/// A partitioned dedup table of the test's own and a ledger, both dropped
/// with the functions the table's migration made.
struct Fx {
    store: PgStore,
    pool: PgPool,
    ledger: String,
    _tables: DropTables,
}

impl Fx {
    async fn open(width: Duration) -> Option<Fx> {
        let pool = pg_pool(16).await?;
        let table = unique_table("idem_part");
        let ledger = unique_table("part_ledger");
        let tables = DropTables::new(&[&table, &ledger]);
        let store = PgStore::from_pool(pool.clone())
            .with_table(&table)
            .expect("a valid name")
            .with_partitions(Partitions::every(width).expect("a valid width"));
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {ledger} (id TEXT NOT NULL)"
        )))
        .execute(&pool)
        .await
        .expect("ledger");
        Some(Fx {
            store,
            pool,
            ledger,
            _tables: tables,
        })
    }

    /// The table's partitions by name, with their row counts.
    async fn partitions(&self) -> Vec<(String, i64)> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = to_regclass($1) ORDER BY 1",
        )
        .bind(self.store.table())
        .fetch_all(&self.pool)
        .await
        .expect("partitions");
        let mut out = Vec::new();
        for name in names {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {name}")))
                .fetch_one(&self.pool)
                .await
                .expect("count");
            out.push((name, n));
        }
        out
    }

    /// The partition that holds each row of `id` under `handler`.
    async fn homes(&self, handler: &str, id: &str) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT tableoid::regclass::text FROM {} WHERE handler = $1 AND key = $2",
            self.store.table()
        )))
        .bind(handler)
        .bind(idem_runtime::Key::from_parts(&[&id]).unwrap().as_str())
        .fetch_all(&self.pool)
        .await
        .expect("homes")
    }

    /// Rows per key under `handler` that appear more than once.
    async fn doubled(&self, handler: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM (SELECT key FROM {} WHERE handler = $1
             GROUP BY key HAVING count(*) > 1) AS d",
            self.store.table()
        )))
        .bind(handler)
        .fetch_one(&self.pool)
        .await
        .expect("doubled")
    }

    async fn ledger_len(&self, id: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE id = $1",
            self.ledger
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("ledger")
    }
}

/// What a consumer redelivers later: another holds the key, or the store
/// failed (a statement that met a row moving between partitions, say).
fn retryable<E>(e: &Error<E>) -> bool {
    matches!(e, Error::InProgress { .. } | Error::Store { .. })
}

fn ping(id: &str) -> Ping {
    Ping { id: id.to_owned() }
}

#[tokio::test]
async fn migrate_makes_the_partitions_of_now_and_ahead_and_a_default() {
    let Some(fx) = Fx::open(Duration::from_secs(60)).await else {
        return;
    };
    let parts = fx.partitions().await;
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("_pdefault")), "{names:?}");
    // Migrating again (every start-up) changes nothing.
    fx.store.migrate().await.expect("migrate again");
    assert_eq!(fx.partitions().await.len(), 5);
}

#[tokio::test]
async fn a_duplicate_finds_its_record_in_an_older_partition_and_brings_it_along() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    let effects = Effects::default();
    next_period(width).await;
    let first = lease_ping(&fx.store, &ping("a"), &effects).await.unwrap();
    assert!(first.is_executed());
    let home = fx.homes("part_lease", "a").await;
    next_period(width).await;
    fx.store.sweep_expired(100).await.unwrap();
    let again = lease_ping(&fx.store, &ping("a"), &effects).await.unwrap();
    assert_eq!(again, Outcome::Duplicate("pong a".to_owned()));
    assert_eq!(effects.of("a"), 1);
    let moved = fx.homes("part_lease", "a").await;
    assert_eq!(moved.len(), 1, "one row a key: {moved:?}");
    assert_ne!(
        moved, home,
        "the duplicate's claim moved the row into its period's partition"
    );
    // The record reads back whole after the move.
    let record = fx
        .store
        .record(
            "part_lease",
            &idem_runtime::Key::from_parts(&[&"a"]).unwrap(),
        )
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(record.status, idem_runtime::Status::Completed);
}

#[tokio::test]
async fn transaction_mode_duplicates_across_periods_apply_once() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    for order in [
        idem_runtime::ClaimOrder::Last,
        idem_runtime::ClaimOrder::Checked,
        idem_runtime::ClaimOrder::First,
    ] {
        for trips in [
            idem_runtime::RoundTrips::Separate,
            idem_runtime::RoundTrips::Merged,
        ] {
            let store = fx
                .store
                .clone()
                .with_claim_order(order)
                .with_round_trips(trips);
            let id = format!("{order:?}-{trips:?}");
            let first = tx_ping(&store, &ping(&id), &fx.ledger).await.unwrap();
            assert!(first.is_executed(), "{id}");
            next_period(width).await;
            let again = tx_ping(&store, &ping(&id), &fx.ledger).await.unwrap();
            assert!(!again.is_executed(), "{id}: {again:?}");
            assert_eq!(again.into_inner(), first.into_inner(), "{id}");
            assert_eq!(fx.ledger_len(&id).await, 1, "{id}");
            assert_eq!(fx.homes("part_tx", &id).await.len(), 1, "{id}");
        }
    }
}

/// Many consumers claim the same keys again and again while periods end
/// under them: every key's body runs once and holds one row.
#[tokio::test]
async fn concurrent_claims_across_ending_periods_run_each_key_once() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    let fx = Arc::new(fx);
    let effects = Arc::new(Effects::default());
    let executed = Arc::new(AtomicU32::new(0));
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let deadline = Instant::now() + Duration::from_millis(3_500);
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let (fx, effects, executed, keys) =
            (fx.clone(), effects.clone(), executed.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut calls = 0u32;
            let mut i = worker;
            while Instant::now() < deadline {
                // Half the calls in lease mode, half in transaction mode.
                let id = &keys[i % keys.len()];
                if i % 2 == 0 {
                    match lease_ping(&fx.store, &ping(id), &effects).await {
                        Ok(o) if o.is_executed() => {
                            executed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => assert!(retryable(&e), "{e}"),
                    }
                } else {
                    let id = format!("tx-{id}");
                    match tx_ping(&fx.store, &ping(&id), &fx.ledger).await {
                        Ok(_) => {}
                        Err(e) => assert!(retryable(&e), "{e}"),
                    }
                }
                if worker % 3 == 0 {
                    fx.store.sweep_expired(100).await.unwrap();
                }
                i += 7;
                calls += 1;
            }
            calls
        }));
    }
    let mut calls = 0;
    for t in tasks {
        calls += t.await.unwrap();
    }
    for id in &keys {
        assert!(effects.of(id) <= 1, "{id} ran {} times", effects.of(id));
        assert!(fx.ledger_len(&format!("tx-{id}")).await <= 1, "tx-{id}");
    }
    assert_eq!(fx.doubled("part_lease").await, 0);
    assert_eq!(fx.doubled("part_tx").await, 0);
    let moved_keys = fx.partitions().await.iter().filter(|(_, n)| *n > 0).count();
    eprintln!(
        "{calls} calls, {} executed in lease mode, rows in {moved_keys} partitions",
        executed.load(Ordering::Relaxed)
    );
    assert!(calls > 100, "{calls} calls");
}

/// Fresh keys, each claimed by several consumers a few milliseconds
/// apart while a period ends, by a handler that claims first and whose
/// body takes 30 ms: a second claim of a key in the next period would
/// write into another partition beside the first claim, still uncommitted,
/// unless the trigger's lock makes it wait for the first and find it.
#[tokio::test]
async fn fresh_keys_claimed_as_a_period_ends_run_once() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    let store = fx
        .store
        .clone()
        .with_claim_order(idem_runtime::ClaimOrder::First);
    let fx = Arc::new(fx);
    let mut keys = 0;
    for edge in 0..4 {
        next_period(width).await;
        // 100 ms before the next period begins
        tokio::time::sleep(width - Duration::from_millis(150)).await;
        let mut tasks = Vec::new();
        for worker in 0..6u64 {
            let (fx, store) = (fx.clone(), store.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(7 * worker)).await;
                for j in 0..8 {
                    let id = format!("e{edge}-{j}");
                    if let Err(e) = slow_tx(&store, &ping(&id), &fx.ledger).await {
                        assert!(retryable(&e), "{e}");
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        keys += 8;
    }
    let twice: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM (SELECT id FROM {} GROUP BY id HAVING count(*) > 1) AS d",
        fx.ledger
    )))
    .fetch_one(&fx.pool)
    .await
    .unwrap();
    let spread: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(DISTINCT tableoid) FROM {} WHERE handler = 'part_slow'",
        fx.store.table()
    )))
    .fetch_one(&fx.pool)
    .await
    .unwrap();
    eprintln!(
        "{keys} fresh keys claimed around 4 period ends, in {spread} partitions; {twice} applied twice"
    );
    assert_eq!(twice, 0);
    assert_eq!(fx.doubled("part_slow").await, 0);
}

#[tokio::test]
async fn a_sweep_drops_a_partition_whose_records_all_expired_and_keeps_one_with_a_live_record() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    next_period(width).await;
    for i in 0..30 {
        assert!(
            short_ping(&fx.store, &ping(&format!("s{i}")))
                .await
                .unwrap()
                .is_executed()
        );
    }
    // One long record beside them, in the same period.
    let effects = Effects::default();
    assert!(
        lease_ping(&fx.store, &ping("long"), &effects)
            .await
            .unwrap()
            .is_executed()
    );
    let home = fx.homes("part_short", "s0").await;
    assert_eq!(home.len(), 1);
    let before = fx.store.count().await.unwrap();
    // Past the short records' 2 s ttl: their partition still holds "long".
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    for _ in 0..10 {
        fx.store.sweep_expired(1_000).await.unwrap();
    }
    assert!(fx.partitions().await.iter().any(|(n, _)| n == &home[0]));
    assert_eq!(fx.store.count().await.unwrap(), before);

    // Without the live record, the partition goes whole, and the sweep
    // says how many rows went with it.
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {} WHERE handler = 'part_lease'",
        fx.store.table()
    )))
    .execute(&fx.pool)
    .await
    .unwrap();
    let mut removed = 0;
    for _ in 0..10 {
        removed += fx.store.sweep_expired(1_000).await.unwrap();
    }
    assert_eq!(removed, 30);
    assert!(!fx.partitions().await.iter().any(|(n, _)| n == &home[0]));
    assert_eq!(fx.store.count().await.unwrap(), 0);
    // The key is fresh again.
    assert!(
        short_ping(&fx.store, &ping("s0"))
            .await
            .unwrap()
            .is_executed()
    );
}

/// A store opened without partitions (an operator's `idem sweep`, a
/// consumer not yet redeployed) sweeps a table partitioned since by the
/// table's own function; and where there is none (a table partitioned by
/// hand), with a delete that takes expired rows only. A row's place
/// (`ctid`) is its partition's own: the expired rows of one partition sit
/// at the places of live rows in the others.
#[tokio::test]
async fn a_store_opened_without_partitions_sweeps_a_partitioned_table_and_keeps_its_live_records() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    let plain = PgStore::from_pool(fx.pool.clone())
        .with_table(fx.store.table())
        .unwrap();
    let effects = Effects::default();
    // Each period: 30 records that expire in 2 s, then in the next period
    // a live one, first in its partition, at the place of the first of
    // the 30 in theirs.
    let fill = async |round: &str| {
        next_period(width).await;
        for i in 0..30 {
            let id = format!("{round}{i}");
            assert!(
                short_ping(&fx.store, &ping(&id))
                    .await
                    .unwrap()
                    .is_executed()
            );
        }
        next_period(width).await;
        let live = format!("{round}-live");
        assert!(
            lease_ping(&fx.store, &ping(&live), &effects)
                .await
                .unwrap()
                .is_executed()
        );
        // Past the 30's ttl.
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        (
            fx.homes("part_short", &format!("{round}0")).await,
            fx.homes("part_lease", &live).await,
        )
    };
    let live_count = async || -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE handler = 'part_lease'",
            fx.store.table()
        )))
        .fetch_one(&fx.pool)
        .await
        .unwrap()
    };

    // By the table's function: the expired partition goes whole.
    let (expired, live) = fill("a").await;
    assert_ne!(expired, live, "the live record has a partition of its own");
    let mut removed = 0;
    for _ in 0..10 {
        removed += plain.sweep_expired(1_000).await.unwrap();
    }
    assert_eq!(removed, 30);
    assert!(!fx.partitions().await.iter().any(|(n, _)| n == &expired[0]));
    assert_eq!(live_count().await, 1);

    // Without the function: a delete of the expired rows, however their
    // places meet the live rows'.
    let (expired, _) = fill("b").await;
    let maintain = format!("{}_idem_maintain", fx.store.table());
    sqlx::query(AssertSqlSafe(format!(
        "DROP FUNCTION {maintain}(bigint, bigint)"
    )))
    .execute(&fx.pool)
    .await
    .unwrap();
    let places: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {t} AS l JOIN {t} AS e ON e.ctid = l.ctid
         WHERE l.handler = 'part_lease' AND e.handler = 'part_short'",
        t = fx.store.table()
    )))
    .fetch_one(&fx.pool)
    .await
    .unwrap();
    assert!(places >= 1, "an expired row sits at a live row's place");
    let mut removed = 0;
    for _ in 0..10 {
        removed += plain.sweep_expired(1_000).await.unwrap();
    }
    assert_eq!(removed, 30);
    assert_eq!(fx.homes("part_short", "b0").await, Vec::<String>::new());
    assert_eq!(live_count().await, 2, "every live record stays");
    assert!(fx.partitions().await.iter().any(|(n, _)| n == &expired[0]));
}

/// Lease-mode batches reach each record where it is (its partition is
/// part of its place): a batch whose keys stand in an older partition gets
/// their duplicates, completes its fresh claims after the keeper extended
/// them, and a failing batch releases its claims; each body ends in a
/// period after the one its claims were made in.
#[tokio::test]
async fn lease_batches_complete_extend_and_release_claims_across_partitions() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    let pings = |ids: &[&str]| ids.iter().map(|id| ping(id)).collect::<Vec<_>>();
    next_period(width).await;
    let first = batch_ping(&fx.store, &pings(&["a0", "a1", "a2"]))
        .await
        .unwrap();
    assert!(first.iter().all(|r| r.as_ref().unwrap().is_executed()));
    let old = fx.homes("part_batch", "a0").await;

    next_period(width).await;
    let second = batch_ping(&fx.store, &pings(&["a0", "b0", "a1", "b1", "b2"]))
        .await
        .unwrap();
    let executed: Vec<bool> = second
        .iter()
        .map(|r| r.as_ref().unwrap().is_executed())
        .collect();
    assert_eq!(executed, [false, true, false, true, true]);
    assert_eq!(
        *second[0].as_ref().unwrap().value(),
        2,
        "a0's first outcome"
    );
    for id in ["a0", "a1", "a2", "b0", "b1", "b2"] {
        let home = fx.homes("part_batch", id).await;
        assert_eq!(home.len(), 1, "{id}: {home:?}");
    }
    assert_ne!(
        fx.homes("part_batch", "b0").await,
        old,
        "the fresh claims are in another partition than the old records"
    );
    let record = |id: &str| {
        let key = idem_runtime::Key::from_parts(&[&id]).unwrap();
        let store = fx.store.clone();
        async move { store.record("part_batch", &key).await.unwrap() }
    };
    for id in ["b0", "b1", "b2"] {
        let r = record(id).await.expect("a record");
        assert_eq!(r.status, idem_runtime::Status::Completed, "{id}");
    }

    assert_eq!(fx.doubled("part_batch").await, 0);

    // A failing batch: its claims are released.
    next_period(width).await;
    let failed = failing_batch_ping(&fx.store, &pings(&["c0", "c1", "c2"])).await;
    assert!(failed.is_err(), "{failed:?}");
    for id in ["c0", "c1", "c2"] {
        assert_eq!(
            fx.homes("part_batch_failing", id).await,
            Vec::<String>::new()
        );
    }
}

#[tokio::test]
async fn an_expired_claim_in_an_older_partition_is_taken_over() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    use idem_runtime::store::{Claim, LeaseStore};
    let spec = idem_runtime::registry::find("part_short").expect("registered");
    let key = idem_runtime::Key::from_parts(&[&"stalled"]).unwrap();
    let Claim::Fresh { .. } = fx.store.claim(spec, &key, None).await.unwrap() else {
        panic!("a fresh claim")
    };
    // The 1 s lease runs out in a later period (no sweep: it would drop
    // the stalled claim's partition, as a plain table's sweep deletes the
    // row).
    next_period(width).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let taken = fx.store.claim(spec, &key, None).await.unwrap();
    assert!(matches!(taken, Claim::Fresh { .. }), "{taken:?}");
    let record = fx
        .store
        .record("part_short", &key)
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(
        record.attempts, 2,
        "the takeover counts the stalled attempt"
    );
    assert_eq!(fx.homes("part_short", "stalled").await.len(), 1);
}

#[tokio::test]
async fn rows_of_a_period_without_a_partition_go_to_the_default_one_and_are_swept() {
    let width = Duration::from_secs(1);
    let Some(fx) = Fx::open(width).await else {
        return;
    };
    // No sweeper for more than the partitions made ahead: 4 periods.
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    for i in 0..10 {
        assert!(
            short_ping(&fx.store, &ping(&format!("d{i}")))
                .await
                .unwrap()
                .is_executed()
        );
    }
    let default = fx.partitions().await;
    let in_default = default
        .iter()
        .find(|(n, _)| n.ends_with("_pdefault"))
        .map(|(_, n)| *n);
    assert_eq!(in_default, Some(10), "{default:?}");
    // The records keep their keys from duplicates there too.
    let again = short_ping(&fx.store, &ping("d0")).await.unwrap();
    assert!(!again.is_executed());
    // Expired, they are deleted from the default partition.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let mut removed = 0;
    for _ in 0..10 {
        removed += fx.store.sweep_expired(1_000).await.unwrap();
    }
    assert_eq!(removed, 10);
}

#[tokio::test]
async fn a_store_refuses_a_table_of_the_other_layout() {
    let Some(fx) = Fx::open(Duration::from_secs(60)).await else {
        return;
    };
    let plain = PgStore::from_pool(fx.pool.clone())
        .with_table(fx.store.table())
        .unwrap();
    let err = plain.migrate().await.unwrap_err().to_string();
    assert!(err.contains("is partitioned"), "{err}");

    let table = unique_table("idem_plain");
    let _drop = DropTables::new(&[&table]);
    let plain = PgStore::from_pool(fx.pool.clone())
        .with_table(&table)
        .unwrap();
    plain.migrate().await.unwrap();
    let err = plain
        .clone()
        .with_partitions(Partitions::daily())
        .migrate()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("partition_existing"), "{err}");
}

/// A plain table with records becomes a partitioned one: its records keep
/// suppressing duplicates, a key claimed again leaves it for the current
/// partition, and once its last record expired the sweep drops it whole.
#[tokio::test]
async fn a_plain_table_becomes_a_partition_of_the_partitioned_one() {
    let Some(pool) = pg_pool(8).await else {
        return;
    };
    let table = unique_table("idem_conv");
    let _drop = DropTables::new(&[&table]);
    let plain = PgStore::from_pool(pool.clone()).with_table(&table).unwrap();
    plain.migrate().await.unwrap();
    let effects = Effects::default();
    for i in 0..10 {
        assert!(
            lease_ping(&plain, &ping(&format!("l{i}")), &effects)
                .await
                .unwrap()
                .is_executed()
        );
        assert!(
            short_ping(&plain, &ping(&format!("s{i}")))
                .await
                .unwrap()
                .is_executed()
        );
    }
    let partitioned = plain
        .clone()
        .with_partitions(Partitions::every(Duration::from_secs(1)).unwrap());
    partitioned.partition_existing().await.unwrap();
    // Again, as after an interrupted deploy: nothing changes.
    partitioned.partition_existing().await.unwrap();
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
            .bind(&table)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(kind, "p");
    assert_eq!(partitioned.count().await.unwrap(), 20);

    // The plain table's records answer duplicates.
    for i in 0..10 {
        let again = lease_ping(&partitioned, &ping(&format!("l{i}")), &effects)
            .await
            .unwrap();
        assert_eq!(again, Outcome::Duplicate(format!("pong l{i}")));
    }
    assert!(
        lease_ping(&partitioned, &ping("new"), &effects)
            .await
            .unwrap()
            .is_executed()
    );
    for i in 0..10 {
        assert_eq!(effects.of(&format!("l{i}")), 1);
    }
    // The old partition holds the short records alone now; past their ttl
    // it goes.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let mut removed = 0;
    for _ in 0..10 {
        removed += partitioned.sweep_expired(1_000).await.unwrap();
    }
    assert_eq!(
        removed, 10,
        "the plain table's expired records went with it"
    );
    assert_eq!(partitioned.count().await.unwrap(), 11);
    // A plain store is refused from now on.
    let err = plain.migrate().await.unwrap_err().to_string();
    assert!(err.contains("is partitioned"), "{err}");
}
