//! PostgreSQL under real contention, real crashes, dropped connections, lock
//! timeouts and a steady stream with expiry. Every claim about effects is
//! read back from the business table, not from idem's own counters.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ClaimOrder;
use idem_runtime::clock::ManualClock;
use idem_runtime::{Error, Outcome, PgStore, PgTx, idempotent};
use idem_tests::{DropTables, or_skip, pg_pool, pg_url, unique_table};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Effect {
    /// The business table the body writes (one per test).
    table: String,
    message_id: i64,
    /// Crash tests: what the body does before returning.
    #[serde(default)]
    park: Park,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Park {
    #[default]
    No,
    /// Print READY and hang inside the body (the process is then killed).
    InsideBody,
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Adds one to the message's row: an effect applied twice shows as 2.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_apply_effect"
)]
async fn apply_effect(tx: &mut PgTx<'_>, msg: &Effect) -> Result<i64, sqlx::Error> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES ($1, 1)
         ON CONFLICT (message_id) DO UPDATE SET applied = {0}.applied + 1 RETURNING applied",
        msg.table
    );
    let applied: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .fetch_one(&mut **tx)
        .await?;
    match msg.park {
        Park::No => {}
        Park::InsideBody => {
            println!("READY");
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
    }
    Ok(applied)
}

/// Where a body parks: it signals `parked` after its business write, then
/// waits for `release`. One per call, so no wake-up leaks between tests.
#[derive(Default)]
struct Gate {
    parked: tokio::sync::Notify,
    release: tokio::sync::Notify,
    /// Released, the body reads its row once more through its transaction
    /// before returning (so a connection dropped while it was parked fails
    /// the body's own statement, not the commit).
    read_after_release: bool,
}

/// As `apply_effect`, parking on `gate` after the business write.
#[idempotent(
    key = "msg.message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_apply_parked"
)]
async fn apply_parked(tx: &mut PgTx<'_>, msg: &Effect, gate: &Gate) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES ($1, 1)
         ON CONFLICT (message_id) DO UPDATE SET applied = {0}.applied + 1 RETURNING applied",
        msg.table
    );
    let applied: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .fetch_one(&mut **tx)
        .await?;
    gate.parked.notify_one();
    gate.release.notified().await;
    if gate.read_after_release {
        let sql = format!("SELECT applied FROM {} WHERE message_id = $1", msg.table);
        return sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(msg.message_id)
            .fetch_one(&mut **tx)
            .await;
    }
    Ok(applied)
}

async fn business_table(pool: &PgPool) -> String {
    let t = unique_table("pg_effects");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {t} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await
    .expect("create business table");
    t
}

async fn applied(pool: &PgPool, table: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT message_id, applied FROM {table} ORDER BY message_id"
    )))
    .fetch_all(pool)
    .await
    .expect("read business table")
}

/// A test's tables: its business table and dedup table (dropped at the
/// end, even on failure), an admin pool, and a migrated store on them.
struct Setup {
    admin: PgPool,
    dedup: String,
    table: String,
    store: PgStore,
    _cleanup: DropTables,
}

/// The usual start of a test, or `None` (skip) without a server.
async fn setup(prefix: &str, order: ClaimOrder) -> Option<Setup> {
    let admin = pg_pool(4).await?;
    let dedup = unique_table(prefix);
    let table = business_table(&admin).await;
    let _cleanup = DropTables::new(&[&dedup, &table]);
    let store = store_on(&admin, &dedup, order).await;
    Some(Setup {
        admin,
        dedup,
        table,
        store,
        _cleanup,
    })
}

/// A store on `pool` over the dedup table `dedup`, claiming in `order`.
fn store_for(pool: PgPool, dedup: &str, order: ClaimOrder) -> PgStore {
    PgStore::from_pool(pool)
        .with_table(dedup)
        .expect("valid table")
        .with_claim_order(order)
}

async fn store_on(pool: &PgPool, dedup: &str, order: ClaimOrder) -> PgStore {
    let store = store_for(pool.clone(), dedup, order);
    store.migrate().await.expect("migrate");
    store
}

/// 16 consumers on separate connections deliver the same 1,000 messages, each
/// 3 to 5 times, at the same moment.
async fn contention(order: ClaimOrder) {
    let Setup {
        admin,
        dedup,
        table,
        store: _,
        _cleanup,
    } = or_skip!(setup("pg_dedup", order).await);

    const MESSAGES: i64 = 1_000;
    const CONSUMERS: usize = 16;
    // Copies of message i go to different consumers at about the same place
    // in their queues, so duplicates really meet.
    let mut queues: Vec<Vec<i64>> = vec![Vec::new(); CONSUMERS];
    let mut deliveries = 0;
    for id in 0..MESSAGES {
        let copies = 3 + (id % 3) as usize;
        for c in 0..copies {
            queues[(id as usize * 7 + c * 5) % CONSUMERS].push(id);
            deliveries += 1;
        }
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(CONSUMERS));
    let mut tasks = Vec::new();
    for queue in queues {
        let barrier = barrier.clone();
        let (dedup, table) = (dedup.clone(), table.clone());
        tasks.push(tokio::spawn(async move {
            // A consumer of its own: one connection.
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&pg_url())
                .await
                .expect("consumer connects");
            let store = store_for(pool, &dedup, order);
            barrier.wait().await;
            let (mut executed, mut duplicate, mut in_progress) = (0usize, 0usize, 0usize);
            for id in queue {
                let msg = Effect {
                    table: table.clone(),
                    message_id: id,
                    park: Park::No,
                };
                loop {
                    match apply_effect(&store, &msg).await {
                        Ok(Outcome::Executed(_)) => executed += 1,
                        Ok(Outcome::Duplicate(_)) => duplicate += 1,
                        Err(Error::InProgress { .. }) => {
                            in_progress += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(e) => panic!("delivery of {id} failed: {e}"),
                    }
                    break;
                }
            }
            (executed, duplicate, in_progress)
        }));
    }
    let (mut executed, mut duplicate, mut in_progress) = (0, 0, 0);
    for t in tasks {
        let (e, d, p) = t.await.expect("consumer task");
        executed += e;
        duplicate += d;
        in_progress += p;
    }
    eprintln!(
        "{order:?}: {deliveries} deliveries by {CONSUMERS} consumers: {executed} executed, {duplicate} duplicate, {in_progress} in-progress retries"
    );
    assert_eq!(executed, MESSAGES as usize, "each message executes once");
    assert_eq!(executed + duplicate, deliveries);
    let rows = applied(&admin, &table).await;
    assert_eq!(rows.len(), MESSAGES as usize, "every message took effect");
    let twice: Vec<_> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        twice.is_empty(),
        "effects applied more than once: {twice:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_last_applies_each_message_once() {
    contention(ClaimOrder::Last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_first_applies_each_message_once() {
    contention(ClaimOrder::First).await;
}

/// The child side of the crash tests: run by the parent as a separate process
/// of this test binary, killed with SIGKILL where it parks.
#[tokio::test]
#[ignore = "run as a child process by the crash tests"]
async fn crash_child() {
    let Ok(mode) = std::env::var("IDEM_CRASH_MODE") else {
        return;
    };
    let dedup = std::env::var("IDEM_CRASH_DEDUP").expect("dedup table");
    let table = std::env::var("IDEM_CRASH_TABLE").expect("business table");
    let order = match std::env::var("IDEM_CRASH_ORDER").as_deref() {
        Ok("first") => ClaimOrder::First,
        _ => ClaimOrder::Last,
    };
    let store = PgStore::connect(&pg_url())
        .await
        .expect("child connects")
        .with_table(&dedup)
        .expect("table")
        .with_claim_order(order);
    let park = if mode == "inside_body" {
        Park::InsideBody
    } else {
        Park::No
    };
    let msg = Effect {
        table,
        message_id: 1,
        park,
    };
    let outcome = apply_effect(&store, &msg).await.expect("child delivery");
    assert!(outcome.is_executed());
    // Committed, but the consumer dies before it can ack.
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Runs `crash_child` in a new process, waits until it prints READY (parked
/// where `mode` says), and kills it with SIGKILL.
fn run_and_kill(mode: &str, dedup: &str, table: &str, order: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IDEM_CRASH_MODE", mode)
        .env("IDEM_CRASH_DEDUP", dedup)
        .env("IDEM_CRASH_TABLE", table)
        .env("IDEM_CRASH_ORDER", order)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child consumer");
    let stdout = child.stdout.take().expect("child stdout");
    let mut ready = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child output");
        // libtest prints "test crash_child ... " without a newline first.
        if line.trim_end().ends_with("READY") {
            ready = true;
            break;
        }
    }
    assert!(ready, "child never reached its parking point");
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap child");
    assert!(!status.success(), "the child was killed, not finished");
}

async fn crash(mode: &str, order: ClaimOrder) {
    let Setup {
        admin,
        dedup,
        table,
        store,
        _cleanup,
    } = or_skip!(setup("pg_crash_dedup", order).await);
    let order_name = if order == ClaimOrder::First {
        "first"
    } else {
        "last"
    };

    let (dedup2, table2, mode2) = (dedup.clone(), table.clone(), mode.to_owned());
    tokio::task::spawn_blocking(move || run_and_kill(&mode2, &dedup2, &table2, order_name))
        .await
        .expect("crash run");

    // The broker redelivers; the killed consumer's connection is gone, and
    // Postgres rolled back whatever it had not committed.
    let msg = Effect {
        table: table.clone(),
        message_id: 1,
        park: Park::No,
    };
    let mut outcome = None;
    for _ in 0..200 {
        match apply_effect(&store, &msg).await {
            Ok(o) => {
                outcome = Some(o);
                break;
            }
            // The server may not have noticed the dead connection yet.
            Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("redelivery failed: {e}"),
        }
    }
    let outcome = outcome.expect("redelivery completes");
    match mode {
        "inside_body" => assert!(outcome.is_executed(), "nothing committed, so it runs again"),
        _ => assert!(
            outcome.is_duplicate(),
            "committed before the kill, so a duplicate"
        ),
    }
    assert_eq!(outcome.into_inner(), 1);
    // Once more for good measure.
    assert!(
        apply_effect(&store, &msg)
            .await
            .expect("again")
            .is_duplicate()
    );
    assert_eq!(
        applied(&admin, &table).await,
        vec![(1, 1)],
        "the effect stands exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_the_body_leaves_nothing_and_redelivery_runs_once() {
    crash("inside_body", ClaimOrder::Last).await;
    crash("inside_body", ClaimOrder::First).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_before_ack_makes_redelivery_a_duplicate() {
    crash("after_commit", ClaimOrder::Last).await;
    crash("after_commit", ClaimOrder::First).await;
}

/// The consumer's connection is terminated while the body is parked in its
/// transaction: whether the failure then meets the commit or the body's own
/// next statement (which returns the body's `Err(sqlx::Error)`), the call is a
/// store error to retry, never the body's business error, and nothing stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connection_gives_store_error_and_records_nothing() {
    for (order, read_after_release) in [
        (ClaimOrder::Last, false),
        (ClaimOrder::First, false),
        (ClaimOrder::Last, true),
        (ClaimOrder::First, true),
    ] {
        let Setup {
            admin,
            dedup,
            table,
            store: _,
            _cleanup,
        } = or_skip!(setup("pg_drop_dedup", order).await);
        // The consumer's own single-connection pool, so we know its backend.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg_url())
            .await
            .expect("connect");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("pid");
        let store = store_for(pool, &dedup, order);
        let msg = Effect {
            table: table.clone(),
            message_id: 7,
            park: Park::No,
        };
        let gate = std::sync::Arc::new(Gate {
            read_after_release,
            ..Gate::default()
        });
        let body_gate = gate.clone();
        let call = tokio::spawn(async move { apply_parked(&store, &msg, &body_gate).await });
        // The body has written through its transaction and is parked in it.
        tokio::time::timeout(Duration::from_secs(10), gate.parked.notified())
            .await
            .expect("the body parks in its transaction");
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&admin)
            .await
            .expect("terminate");
        assert!(killed);
        gate.release.notify_one();
        let r = call.await.expect("call task");
        assert!(
            matches!(r, Err(Error::Store { .. })),
            "{order:?}, failing in the body: {read_after_release}: expected Error::Store, got {r:?}"
        );
        assert!(
            applied(&admin, &table).await.is_empty(),
            "no business effect"
        );
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {dedup}")))
            .fetch_one(&admin)
            .await
            .expect("count");
        assert_eq!(rows, 0, "no dedup record");
    }
}

/// Another transaction holds the key (an in-flight first delivery between its
/// claim and its commit): the claim waits on the unique index, gives up at the
/// lock timeout with `InProgress`, and leaves no effect; once the other
/// transaction is gone the delivery runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waiting_past_the_lock_timeout_is_in_progress() {
    for order in [ClaimOrder::Last, ClaimOrder::First] {
        let Setup {
            admin,
            dedup,
            table,
            store: _,
            _cleanup,
        } = or_skip!(setup("pg_lock_dedup", order).await);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET lock_timeout = '300ms'")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(&pg_url())
            .await
            .expect("connect");
        let store = store_for(pool, &dedup, order).with_lock_timeout(Duration::from_millis(300));

        // The other delivery's uncommitted claim row.
        let key = idem_runtime::Key::from_parts(&[&3i64]).expect("key");
        let mut holder = admin.begin().await.expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {dedup} (handler, key, status, attempts, created_at, updated_at, expires_at)
             VALUES ('pg_apply_effect', $1, 'in_progress', 1, 0, 0, 9223372036854775807)"
        )))
        .bind(key.as_str())
        .execute(&mut *holder)
        .await
        .expect("hold the key");

        let msg = first_msg(&table);
        let started = std::time::Instant::now();
        match apply_effect(&store, &msg).await {
            Err(Error::InProgress {
                retry_after,
                key: k,
                ..
            }) => {
                assert_eq!(retry_after, Duration::from_millis(300));
                assert_eq!(k, key);
            }
            other => panic!("{order:?}: expected InProgress, got {other:?}"),
        }
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "it waited for the lock"
        );
        assert!(
            applied(&admin, &table).await.is_empty(),
            "{order:?}: no effect while in progress"
        );

        holder.rollback().await.expect("the other delivery fails");
        assert!(
            apply_effect(&store, &msg)
                .await
                .expect("runs")
                .is_executed()
        );
        assert!(
            apply_effect(&store, &msg)
                .await
                .expect("after")
                .is_duplicate()
        );
        assert_eq!(applied(&admin, &table).await, vec![(3, 1)]);
    }
}

/// A steady stream with a short ttl: expired rows are reclaimed at claim time
/// and swept in bounded batches, so the table stays the size of the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_stream_keeps_the_table_the_size_of_the_window() {
    #[derive(Serialize, Deserialize)]
    struct Tick {
        id: i64,
    }
    #[idempotent(key = "id", ttl = "10s", store = "postgres", name = "pg_stream_tick")]
    async fn tick(msg: &Tick) -> Result<i64, std::io::Error> {
        Ok(msg.id)
    }

    let admin = or_skip!(pg_pool(4).await);
    let dedup = unique_table("pg_stream_dedup");
    let _cleanup = DropTables::new(&[&dedup]);
    let clock = ManualClock::starting_now();
    let store = store_on(&admin, &dedup, ClaimOrder::Last)
        .await
        .with_clock(clock.clone());
    // 100 messages a simulated second for 60 s; the window is 10 s, so the
    // live set is 1,000 rows. Sweep every simulated second in batches of 300.
    let mut counts = Vec::new();
    let mut id = 0;
    for second in 0..60 {
        for _ in 0..100 {
            assert!(
                tick(&store, &Tick { id })
                    .await
                    .expect("tick")
                    .is_executed()
            );
            id += 1;
        }
        clock.advance(Duration::from_secs(1));
        loop {
            let n = store.sweep_expired(300).await.expect("sweep");
            assert!(n <= 300, "a batch is bounded");
            if n < 300 {
                break;
            }
        }
        let count = store.count().await.expect("count");
        if second % 10 == 9 {
            counts.push(count);
        }
    }
    eprintln!("rows every 10 simulated seconds: {counts:?}");
    for c in &counts {
        assert!(
            (900..=1_100).contains(c),
            "table size {c} strays from the window"
        );
    }
    // An expired key is reclaimed at claim time even before the sweep.
    assert!(
        tick(&store, &Tick { id: id - 1 })
            .await
            .expect("dup")
            .is_duplicate()
    );
    clock.advance(Duration::from_secs(11));
    assert!(
        tick(&store, &Tick { id: id - 1 })
            .await
            .expect("again")
            .is_executed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_many_processes_at_once() {
    let admin = or_skip!(pg_pool(8).await);
    let dedup = unique_table("pg_migrate");
    let _cleanup = DropTables::new(&[&dedup]);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let dedup = dedup.clone();
        tasks.push(tokio::spawn(async move {
            let store = PgStore::connect(&pg_url()).await?.with_table(&dedup)?;
            store.migrate().await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("concurrent migrate succeeds");
    }
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(&dedup)
    .fetch_all(&admin)
    .await
    .expect("columns");
    assert_eq!(
        columns,
        [
            "handler",
            "key",
            "status",
            "token",
            "outcome",
            "attempts",
            "created_at",
            "updated_at",
            "expires_at"
        ]
    );
    assert!(
        PgStore::from_pool(admin.clone())
            .with_table("bad name")
            .is_err()
    );
    assert!(
        PgStore::from_pool(admin.clone())
            .with_table("public.x; drop")
            .is_err()
    );
}

fn first_msg(table: &str) -> Effect {
    Effect {
        table: table.to_owned(),
        message_id: 3,
        park: Park::No,
    }
}

/// Takes the whole stock of one row, or refuses when it is gone.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_take_all"
)]
async fn take_all(tx: &mut PgTx<'_>, msg: &Effect) -> Result<i64, TakeError> {
    let sql = format!(
        "UPDATE {} SET applied = 0 WHERE message_id = 1 AND applied > 0 RETURNING 1",
        msg.table
    );
    let taken: Option<i32> = sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_optional(&mut **tx)
        .await
        .map_err(TakeError::Db)?;
    taken.map(|_| msg.message_id).ok_or(TakeError::NothingLeft)
}

#[derive(Debug, thiserror::Error)]
enum TakeError {
    #[error("nothing left")]
    NothingLeft,
    #[error(transparent)]
    Db(sqlx::Error),
}

/// Claiming last, a duplicate's body runs before the claim can turn it away,
/// and may fail because the first delivery already took effect. The call must
/// still answer with the recorded outcome, not the body's error, or the
/// consumer would retry a processed message forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_body_fails_gets_the_recorded_outcome() {
    for order in [ClaimOrder::Last, ClaimOrder::First] {
        let Setup {
            admin,
            table,
            store,
            _cleanup,
            ..
        } = or_skip!(setup("pg_takeall_dedup", order).await);
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES (1, 5)")))
            .execute(&admin)
            .await
            .expect("stock");
        let msg = Effect {
            table: table.clone(),
            message_id: 42,
            park: Park::No,
        };
        assert_eq!(
            take_all(&store, &msg).await.expect("first"),
            idem_runtime::Outcome::Executed(42)
        );
        for _ in 0..3 {
            match take_all(&store, &msg).await {
                Ok(idem_runtime::Outcome::Duplicate(42)) => {}
                other => panic!("{order:?}: expected the recorded outcome, got {other:?}"),
            }
        }
        // A different message finds nothing left: that error is the body's.
        let other = Effect {
            message_id: 43,
            ..msg.clone()
        };
        assert!(matches!(
            take_all(&store, &other).await,
            Err(Error::Handler {
                error: TakeError::NothingLeft,
                ..
            })
        ));
        assert_eq!(applied(&admin, &table).await, vec![(1, 0)]);
    }
}
