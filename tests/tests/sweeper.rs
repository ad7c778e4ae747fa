//! Expired records are deleted in bounded batches, by hand
//! (`sweep_expired(batch)`) and by the background `Sweeper`; live records
//! stay and keep suppressing duplicates.

use crate::common;

use std::time::Duration;

use common::{AppError, Db, Probe, T0, eventually};
use idem_runtime::Sweeper;
use idem_runtime::clock::{ManualClock, TimeShift};
use idem_runtime::{MemoryStore, SqliteTx, idempotent};

#[derive(Debug)]
struct Tick {
    id: u32,
}

#[idempotent(key = "msg.id", ttl = "1h", store = "sqlite", name = "sweep_tx")]
async fn tick_sqlite(tx: &mut SqliteTx<'_>, msg: &Tick, probe: &Probe) -> Result<u32, AppError> {
    probe.hit();
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, 1)")
        .bind(msg.id.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(msg.id)
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "sweep_mem")]
async fn tick_memory(msg: &Tick, probe: &Probe) -> Result<u32, AppError> {
    probe.hit();
    Ok(msg.id)
}

const EXPIRED: u32 = 25;
const LIVE: u32 = 5;

/// Ids `0..EXPIRED` complete at T0 (now, on SQLite), ids `EXPIRED..EXPIRED +
/// LIVE` 30 minutes later; the time then stands at T0 + 61 min: the first
/// ones are past their 1 h ttl, the others are not.
async fn fill_sqlite(db: &Db, shift: &TimeShift, probe: &Probe) {
    for id in 0..EXPIRED {
        assert!(
            tick_sqlite(&db.store, &Tick { id }, probe)
                .await
                .unwrap()
                .is_executed()
        );
    }
    shift.advance(Duration::from_secs(30 * 60));
    for id in EXPIRED..EXPIRED + LIVE {
        assert!(
            tick_sqlite(&db.store, &Tick { id }, probe)
                .await
                .unwrap()
                .is_executed()
        );
    }
    shift.advance(Duration::from_secs(31 * 60));
}

async fn fill_memory(store: &MemoryStore, clock: &ManualClock, probe: &Probe) {
    for id in 0..EXPIRED {
        assert!(
            tick_memory(store, &Tick { id }, probe)
                .await
                .unwrap()
                .is_executed()
        );
    }
    clock.advance(Duration::from_secs(30 * 60));
    for id in EXPIRED..EXPIRED + LIVE {
        assert!(
            tick_memory(store, &Tick { id }, probe)
                .await
                .unwrap()
                .is_executed()
        );
    }
    clock.advance(Duration::from_secs(31 * 60));
}

#[tokio::test]
async fn sqlite_sweep_deletes_expired_rows_in_bounded_batches_and_keeps_live_ones() {
    let shift = TimeShift::new();
    let db = Db::with_shift(&shift).await;
    let probe = Probe::new();
    fill_sqlite(&db, &shift, &probe).await;
    assert_eq!(db.record_count().await, i64::from(EXPIRED + LIVE));

    assert_eq!(db.store.sweep_expired(0).await.unwrap(), 0);
    let mut batches = Vec::new();
    loop {
        let before = db.record_count().await;
        let n = db.store.sweep_expired(10).await.unwrap();
        assert!(n <= 10, "a batch of 10 deleted {n}");
        assert_eq!(db.record_count().await, before - n as i64);
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, [10, 10, 5, 0]);
    assert_eq!(db.record_count().await, i64::from(LIVE));

    // The live records still suppress duplicates; the swept keys run again.
    for id in EXPIRED..EXPIRED + LIVE {
        assert!(
            tick_sqlite(&db.store, &Tick { id }, &probe)
                .await
                .unwrap()
                .is_duplicate()
        );
    }
    assert!(
        tick_sqlite(&db.store, &Tick { id: 0 }, &probe)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(probe.runs(), (EXPIRED + LIVE + 1) as usize);
}

#[tokio::test]
async fn memory_sweep_deletes_expired_records_in_bounded_batches_and_keeps_live_ones() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    fill_memory(&store, &clock, &probe).await;
    assert_eq!(store.len(), (EXPIRED + LIVE) as usize);

    assert_eq!(store.sweep_expired(0).await.unwrap(), 0);
    let mut batches = Vec::new();
    loop {
        let before = store.len();
        let n = store.sweep_expired(7).await.unwrap();
        assert!(n <= 7, "a batch of 7 deleted {n}");
        assert_eq!(store.len(), before - n as usize);
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, [7, 7, 7, 4, 0]);
    assert_eq!(store.len(), LIVE as usize);
    for id in EXPIRED..EXPIRED + LIVE {
        assert!(
            tick_memory(&store, &Tick { id }, &probe)
                .await
                .unwrap()
                .is_duplicate()
        );
    }
    assert_eq!(probe.runs(), (EXPIRED + LIVE) as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sweeper_task_deletes_expired_rows_and_stops_when_dropped() {
    let shift = TimeShift::new();
    let db = Db::with_shift(&shift).await;
    let probe = Probe::new();
    fill_sqlite(&db, &shift, &probe).await;

    let sweeper = Sweeper::spawn(db.store.clone(), Duration::from_millis(20), 4);
    eventually(
        Duration::from_secs(5),
        "the sweeper deleted the expired rows",
        || async { db.record_count().await == i64::from(LIVE) },
    )
    .await;
    drop(sweeper);

    // Let an in-flight tick finish, then expire the rest: nothing sweeps them.
    tokio::time::sleep(Duration::from_millis(50)).await;
    shift.advance(Duration::from_secs(3_600));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        db.record_count().await,
        i64::from(LIVE),
        "the dropped sweeper ran"
    );
    assert_eq!(db.store.sweep_expired(100).await.unwrap(), u64::from(LIVE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_sweeper_task_deletes_expired_records_and_stops_when_dropped() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    fill_memory(&store, &clock, &probe).await;

    let sweeper = Sweeper::spawn(store.clone(), Duration::from_millis(20), 4);
    eventually(
        Duration::from_secs(5),
        "the sweeper deleted the expired records",
        || async { store.len() == LIVE as usize },
    )
    .await;
    drop(sweeper);

    tokio::time::sleep(Duration::from_millis(50)).await;
    clock.advance(Duration::from_secs(3_600));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(store.len(), LIVE as usize, "the dropped sweeper ran");
    assert_eq!(store.sweep_expired(100).await.unwrap(), u64::from(LIVE));
}
