//! A duplicate gets back exactly what the first delivery returned, for every
//! value serde can carry, on every store: a property test over arbitrary
//! outcomes (floats of every class — NaN, the infinities, -0.0, subnormals —,
//! unicode text with control characters, nested and integer-keyed maps,
//! `u128`/`i128` extremes, `Some(())`).
//!
//! The property: `Duplicate(v)` equals `Executed(v)` bit for bit; or, for a
//! value JSON cannot carry (a NaN or infinite float, a `Some` it would write
//! as `null`), the call fails at
//! record time with `Error::Unrecordable` naming handler and key, and what is
//! left behind is never an unreadable record: transaction mode leaves no row
//! (the redelivery runs again and is refused again), lease mode settles the
//! key as failed with the reason (the body took effect: the redelivery does
//! not run it, and is `Unrecordable` too).
//!
//! The cases are drawn at random on every run; a failure prints the value.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{
    Error, Key, MemoryStore, MySqlStore, MySqlTx, Outcome, PgStore, PgTx, RedisStore, RoundTrips,
    SqliteStore, SqliteTx, Status, idempotent,
};
use idem_tests::{
    DeleteKeys, DropMySqlTables, DropTables, mysql_pool, or_skip, pg_pool, redis_store, redis_url,
    unique_table,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde::{Deserialize, Serialize};

/// Cases per store and mode.
const CASES: u32 = 160;

/// An outcome that exercises what JSON makes hard.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    amount: f64,
    ratio: f32,
    samples: Vec<f64>,
    maybe: Option<f64>,
    text: String,
    letters: Vec<char>,
    nested: BTreeMap<String, BTreeMap<String, i64>>,
    by_id: HashMap<u32, String>,
    big: u128,
    small: i128,
    pair: (u64, i64),
    flag: bool,
    unit: (),
    /// `Some(())` is written as `null` and would come back as `None`.
    done: Option<()>,
}

impl Value {
    /// Equal bit for bit (floats compared by their bits, so NaN payloads
    /// and -0.0 count).
    fn same(&self, o: &Value) -> bool {
        self.amount.to_bits() == o.amount.to_bits()
            && self.ratio.to_bits() == o.ratio.to_bits()
            && self.samples.len() == o.samples.len()
            && self
                .samples
                .iter()
                .zip(&o.samples)
                .all(|(a, b)| a.to_bits() == b.to_bits())
            && self.maybe.map(f64::to_bits) == o.maybe.map(f64::to_bits)
            && self.text == o.text
            && self.letters == o.letters
            && self.nested == o.nested
            && self.by_id == o.by_id
            && self.big == o.big
            && self.small == o.small
            && self.pair == o.pair
            && self.flag == o.flag
            && self.done == o.done
    }

    /// Whether JSON can carry it: every float finite, and no `Some` that
    /// JSON writes as `null`.
    fn recordable(&self) -> bool {
        self.done.is_none()
            && self.amount.is_finite()
            && self.ratio.is_finite()
            && self.samples.iter().all(|f| f.is_finite())
            && self.maybe.is_none_or(f64::is_finite)
    }
}

/// Floats of every class, the common ones more often.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => prop::num::f64::NORMAL | prop::num::f64::POSITIVE | prop::num::f64::NEGATIVE,
        2 => (-1_000_000i64..1_000_000, 1u32..1_000).prop_map(|(n, d)| n as f64 / f64::from(d)),
        1 => prop::num::f64::SUBNORMAL | prop::num::f64::ZERO,
        1 => Just(-0.0),
        1 => prop::num::f64::ANY,
        1 => prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)],
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let floats = (
        float(),
        prop::num::f32::ANY,
        prop::collection::vec(float(), 0..4),
        prop::option::of(float()),
    );
    let text = (
        any::<String>(),
        prop::collection::vec(any::<char>(), 0..4),
        prop::collection::btree_map(
            any::<String>(),
            prop::collection::btree_map("\\PC{0,6}", any::<i64>(), 0..3),
            0..3,
        ),
        prop::collection::hash_map(any::<u32>(), "\\PC{0,8}", 0..4),
    );
    let ints = (
        prop_oneof![Just(u128::MAX), Just(0u128), any::<u128>()],
        prop_oneof![Just(i128::MIN), Just(i128::MAX), any::<i128>()],
        (any::<u64>(), any::<i64>()),
        any::<bool>(),
        prop_oneof![6 => Just(None), 1 => Just(Some(()))],
    );
    (floats, text, ints).prop_map(
        |(
            (amount, ratio, samples, maybe),
            (text, letters, nested, by_id),
            (big, small, pair, flag, done),
        )| Value {
            amount,
            ratio,
            samples,
            maybe,
            text,
            letters,
            nested,
            by_id,
            big,
            small,
            pair,
            flag,
            unit: (),
            done,
        },
    )
}

/// The random cases of one run.
fn cases() -> Vec<Value> {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        ..Config::default()
    });
    let strategy = value();
    (0..CASES)
        .map(|_| strategy.new_tree(&mut runner).expect("a case").current())
        .collect()
}

/// One delivery: which case (the key) and its value.
#[derive(Debug)]
struct Delivery {
    id: String,
    value: Value,
}

impl Delivery {
    fn key(&self) -> Key {
        Key::from_parts(&[&self.id]).expect("a key")
    }
}

/// How often the bodies ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "id", ttl = "1h", store = "memory", name = "replay_memory")]
async fn on_memory(msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "redis", name = "replay_redis")]
async fn on_redis(msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "replay_sqlite_tx")]
async fn on_sqlite_tx(tx: &mut SqliteTx<'_>, msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "replay_sqlite_lease")]
async fn on_sqlite_lease(msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "replay_pg_tx")]
async fn on_pg_tx(tx: &mut PgTx<'_>, msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "replay_pg_lease")]
async fn on_pg_lease(msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "mysql", name = "replay_mysql_tx")]
async fn on_mysql_tx(tx: &mut MySqlTx<'_>, msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.value.clone())
}

#[idempotent(key = "id", ttl = "1h", store = "mysql", name = "replay_mysql_lease")]
async fn on_mysql_lease(msg: &Delivery) -> Result<Value, sqlx::Error> {
    RUNS.fetch_add(1, Ordering::Relaxed);
    Ok(msg.value.clone())
}

/// What a store in one mode should leave after a refused (unrecordable)
/// value: transaction mode nothing, lease mode a failed record that says
/// why.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Transaction,
    Lease,
}

/// Runs every case twice through `call` and checks the property; `record`
/// reads back the status and raw outcome the store keeps for a key.
async fn check<F, Fut, R, RFut, E>(store: &str, mode: Mode, call: F, record: R)
where
    F: Fn(Delivery) -> Fut,
    Fut: std::future::Future<Output = Result<Outcome<Value>, Error<E>>>,
    R: Fn(Key) -> RFut,
    RFut: std::future::Future<Output = Option<(Status, Option<String>)>>,
    E: std::fmt::Debug,
{
    let (mut replayed, mut refused) = (0, 0);
    for (i, value) in cases().into_iter().enumerate() {
        let delivery = || Delivery {
            id: format!("{store}-{i}"),
            value: value.clone(),
        };
        let first = call(delivery()).await;
        let second = call(delivery()).await;
        let stored = record(delivery().key()).await;
        if value.recordable() {
            let executed = match first {
                Ok(Outcome::Executed(v)) => v,
                other => panic!("{store}: first delivery of {value:?}: {other:?}"),
            };
            let duplicate = match second {
                Ok(Outcome::Duplicate(v)) => v,
                other => panic!("{store}: duplicate of {value:?}: {other:?}"),
            };
            assert!(executed.same(&value), "{store}: {executed:?} != {value:?}");
            assert!(
                duplicate.same(&executed),
                "{store}: replayed {duplicate:?}, executed {executed:?}"
            );
            let (status, outcome) = stored.expect("a record");
            assert_eq!(status, Status::Completed);
            let raw = outcome.expect("a recorded outcome");
            let read: Value = serde_json::from_str(&raw).expect("the record reads back");
            assert!(read.same(&value), "{store}: record {raw}");
            replayed += 1;
        } else {
            for (n, r) in [first, second].into_iter().enumerate() {
                match (mode, n, r) {
                    (_, _, Err(Error::Unrecordable { handler, key, .. })) => {
                        assert!(handler.starts_with("replay_"), "{handler}");
                        assert_eq!(key, delivery().key());
                    }
                    (_, _, other) => panic!("{store}: delivery {n} of {value:?}: {other:?}"),
                }
            }
            match (mode, stored) {
                (Mode::Transaction, None) => {}
                (Mode::Lease, Some((Status::Failed, Some(recorded))))
                    if recorded.starts_with(r#"{"idem:unrecordable":"#) => {}
                (_, other) => panic!("{store}: left behind for {value:?}: {other:?}"),
            }
            refused += 1;
        }
    }
    println!("{store}: {replayed} values replayed bit for bit, {refused} refused at record time");
    assert!(replayed > 0 && refused > 0, "the cases cover both kinds");
}

#[tokio::test]
async fn memory_replays_every_value_or_refuses_it() {
    let store = MemoryStore::new();
    check(
        "memory",
        Mode::Lease,
        |d| {
            let store = store.clone();
            async move { on_memory(&store, &d).await }
        },
        |k| {
            let store = store.clone();
            async move {
                let r = store.record("replay_memory", &k).await.unwrap();
                r.map(|r| (r.status, r.outcome))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn redis_replays_every_value_or_refuses_it() {
    let prefix = idem_tests::unique_prefix("replay");
    let _cleanup = DeleteKeys::new(&redis_url(), &prefix);
    let store: RedisStore = or_skip!(redis_store(&prefix).await);
    check(
        "redis",
        Mode::Lease,
        |d| {
            let store = store.clone();
            async move { on_redis(&store, &d).await }
        },
        |k| {
            let store = store.clone();
            async move {
                let r = store
                    .record("replay_redis", &k)
                    .await
                    .expect("read a record");
                r.map(|r| (r.status, r.outcome))
            }
        },
    )
    .await;
}

async fn sqlite_store() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    (store, dir)
}

/// Both modes of one SQL store: transaction mode through `$tx`, lease mode
/// through `$lease`, each under its registered name.
macro_rules! both_modes {
    ($store:expr, $tx:ident = $tx_name:literal, $lease:ident = $lease_name:literal) => {{
        let store = $store;
        for (mode, name) in [(Mode::Transaction, $tx_name), (Mode::Lease, $lease_name)] {
            check(
                name,
                mode,
                |d| {
                    let store = store.clone();
                    async move {
                        match mode {
                            Mode::Transaction => $tx(&store, &d).await,
                            Mode::Lease => $lease(&store, &d).await,
                        }
                    }
                },
                |k| {
                    let store = store.clone();
                    async move {
                        let r = store.record(name, &k).await.expect("read a record");
                        r.map(|r| (r.status, r.outcome))
                    }
                },
            )
            .await;
        }
    }};
}

#[tokio::test]
async fn sqlite_replays_every_value_or_refuses_it() {
    let (store, _dir) = sqlite_store().await;
    both_modes!(
        store,
        on_sqlite_tx = "replay_sqlite_tx",
        on_sqlite_lease = "replay_sqlite_lease"
    );
}

/// Both ways of sending the dedup row: as a statement with bound values,
/// and in the `COMMIT`'s message with the values written in as `U&'...'`
/// literals.
#[tokio::test]
async fn postgres_replays_every_value_or_refuses_it() {
    let pool = or_skip!(pg_pool(4).await);
    for trips in [RoundTrips::Separate, RoundTrips::Merged] {
        let table = unique_table("replay");
        let _drop = DropTables::new(&[&table]);
        let store = PgStore::from_pool(pool.clone())
            .with_table(&table)
            .expect("a table name")
            .with_round_trips(trips);
        store.migrate().await.expect("migrate");
        both_modes!(
            store,
            on_pg_tx = "replay_pg_tx",
            on_pg_lease = "replay_pg_lease"
        );
    }
}

/// Both ways, the merged one with the values written in as `X'...'`
/// literals.
#[tokio::test]
async fn mysql_replays_every_value_or_refuses_it() {
    let pool = or_skip!(mysql_pool(4, 5).await);
    for trips in [RoundTrips::Separate, RoundTrips::Merged] {
        let table = unique_table("replay");
        let _drop = DropMySqlTables::new(&[&table]);
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&table)
            .expect("a table name")
            .with_round_trips(trips);
        store.migrate().await.expect("migrate");
        both_modes!(
            store,
            on_mysql_tx = "replay_mysql_tx",
            on_mysql_lease = "replay_mysql_lease"
        );
    }
}
