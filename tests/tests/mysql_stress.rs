//! MySQL/MariaDB under real contention, real crashes, dropped connections,
//! lock wait timeouts and concurrent migrations. Every claim about effects is
//! read back from the business table, not from idem's own counters.
//!
//! InnoDB's traps are the point here: a duplicate key check takes a shared
//! lock on the uncommitted row of another transaction (so a concurrent
//! duplicate waits, bounded by `innodb_lock_wait_timeout`), and gap locks
//! make deadlocks (1213) possible under contention. Both must end as a
//! retryable `InProgress`, never as a lost or doubled effect.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::{ClaimOrder, Error, MySqlStore, MySqlTx, Outcome, idempotent};
use idem_tests::{DropMySqlTables, mysql_pool, mysql_url};
use idem_tests::{or_skip, unique_table};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor as _};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Effect {
    /// The business table the body writes (one per test).
    table: String,
    message_id: i64,
    /// Crash tests: print READY and hang inside the body.
    #[serde(default)]
    park_inside_body: bool,
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Adds one to the message's row through the handler's transaction: an
/// effect applied twice shows as 2.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "mysql",
    name = "my_apply_effect"
)]
async fn apply_effect(tx: &mut MySqlTx<'_>, msg: &Effect) -> Result<i64, sqlx::Error> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    let applied = bump(tx, msg).await?;
    if msg.park_inside_body {
        println!("READY");
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    Ok(applied)
}

async fn bump(tx: &mut MySqlTx<'_>, msg: &Effect) -> Result<i64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (message_id, applied) VALUES (?, 1)
         ON DUPLICATE KEY UPDATE applied = applied + 1",
        msg.table
    )))
    .bind(msg.message_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT applied FROM {} WHERE message_id = ?",
        msg.table
    )))
    .bind(msg.message_id)
    .fetch_one(&mut **tx)
    .await
}

/// Where a body parks: it signals `parked` after its business write, then
/// waits for `release`.
#[derive(Default)]
struct Gate {
    parked: tokio::sync::Notify,
    release: tokio::sync::Notify,
    /// Released, the body reads its row once more through its transaction
    /// (so a dropped connection fails the body's own statement).
    read_after_release: bool,
}

/// As `apply_effect`, parking on `gate` after the business write.
#[idempotent(
    key = "msg.message_id",
    ttl = "1h",
    store = "mysql",
    name = "my_apply_parked"
)]
async fn apply_parked(tx: &mut MySqlTx<'_>, msg: &Effect, gate: &Gate) -> Result<i64, sqlx::Error> {
    let applied = bump(tx, msg).await?;
    gate.parked.notify_one();
    gate.release.notified().await;
    if gate.read_after_release {
        let _: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT applied FROM {} WHERE message_id = ?",
            msg.table
        )))
        .bind(msg.message_id)
        .fetch_one(&mut **tx)
        .await?;
    }
    Ok(applied)
}

async fn business_table(pool: &MySqlPool) -> String {
    let t = unique_table("my_effects");
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE {t} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL) ENGINE = InnoDB"
    )))
    .await
    .expect("create business table");
    t
}

async fn applied(pool: &MySqlPool, table: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT message_id, applied FROM {table} ORDER BY message_id"
    )))
    .fetch_all(pool)
    .await
    .expect("read business table")
}

async fn dedup_rows(pool: &MySqlPool, dedup: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {dedup}")))
        .fetch_one(pool)
        .await
        .expect("count")
}

/// A test's tables (dropped at the end, even on failure), an admin pool and
/// a migrated store on them.
struct Setup {
    admin: MySqlPool,
    dedup: String,
    table: String,
    store: MySqlStore,
    _cleanup: DropMySqlTables,
}

async fn setup(prefix: &str, order: ClaimOrder) -> Option<Setup> {
    let admin = mysql_pool(4, 5).await?;
    let dedup = unique_table(prefix);
    let table = business_table(&admin).await;
    let _cleanup = DropMySqlTables::new(&[&dedup, &table]);
    let store = store_for(admin.clone(), &dedup, order);
    store.migrate().await.expect("migrate");
    Some(Setup {
        admin,
        dedup,
        table,
        store,
        _cleanup,
    })
}

fn store_for(pool: MySqlPool, dedup: &str, order: ClaimOrder) -> MySqlStore {
    MySqlStore::from_pool(pool)
        .with_table(dedup)
        .expect("valid table")
        .with_claim_order(order)
}

/// 16 consumers on their own connections deliver the same 1,000 messages,
/// each 3 to 5 times, at the same moment.
async fn contention(order: ClaimOrder) {
    let Setup {
        admin,
        dedup,
        table,
        store: _,
        _cleanup,
    } = or_skip!(setup("my_dedup", order).await);

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
            let store = MySqlStore::connect_with(
                mysql_url().parse().expect("url"),
                MySqlPoolOptions::new().max_connections(1),
            )
            .await
            .expect("consumer connects")
            .with_table(&dedup)
            .expect("table")
            .with_claim_order(order);
            barrier.wait().await;
            let (mut executed, mut duplicate, mut retries) = (0usize, 0usize, 0usize);
            for id in queue {
                let msg = Effect {
                    table: table.clone(),
                    message_id: id,
                    park_inside_body: false,
                };
                loop {
                    match apply_effect(&store, &msg).await {
                        Ok(Outcome::Executed(_)) => executed += 1,
                        Ok(Outcome::Duplicate(_)) => duplicate += 1,
                        // Another consumer holds the key, or InnoDB chose
                        // this transaction as a deadlock victim: redeliver.
                        Err(Error::InProgress { .. }) => {
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(e) => panic!("delivery of {id} failed: {e:?}"),
                    }
                    break;
                }
            }
            (executed, duplicate, retries)
        }));
    }
    let (mut executed, mut duplicate, mut retries) = (0, 0, 0);
    for t in tasks {
        let (e, d, r) = t.await.expect("consumer task");
        executed += e;
        duplicate += d;
        retries += r;
    }
    eprintln!(
        "{order:?}: {deliveries} deliveries by {CONSUMERS} consumers: {executed} executed, {duplicate} duplicate, {retries} in-progress retries"
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
    assert_eq!(dedup_rows(&admin, &dedup).await, MESSAGES);
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
    let store = MySqlStore::connect(&mysql_url())
        .await
        .expect("child connects")
        .with_table(&dedup)
        .expect("table")
        .with_claim_order(order);
    let msg = Effect {
        table,
        message_id: 1,
        park_inside_body: mode == "inside_body",
    };
    let outcome = apply_effect(&store, &msg).await.expect("child delivery");
    assert!(outcome.is_executed());
    // Committed, but the consumer dies before it can ack.
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Runs `crash_child` in a new process, waits until it prints READY (parked
/// where `mode` says), and kills it with SIGKILL.
fn run_and_kill(mode: &str, dedup: &str, table: &str, order: ClaimOrder) {
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
        .env(
            "IDEM_CRASH_ORDER",
            if order == ClaimOrder::First {
                "first"
            } else {
                "last"
            },
        )
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
    } = or_skip!(setup("my_crash_dedup", order).await);

    let (dedup2, table2, mode2) = (dedup.clone(), table.clone(), mode.to_owned());
    tokio::task::spawn_blocking(move || run_and_kill(&mode2, &dedup2, &table2, order))
        .await
        .expect("crash run");

    // The broker redelivers. Until the server notices the dead connection,
    // its transaction still holds the key: the redelivery waits and is told
    // to come back.
    let msg = Effect {
        table: table.clone(),
        message_id: 1,
        park_inside_body: false,
    };
    let mut outcome = None;
    for _ in 0..200 {
        match apply_effect(&store, &msg).await {
            Ok(o) => {
                outcome = Some(o);
                break;
            }
            Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("redelivery failed: {e:?}"),
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

/// The consumer's connection is killed (`KILL <id>`) while the body is parked
/// in its transaction: whether the failure then meets the commit or the
/// body's own next statement, the call is a store error to retry, never the
/// body's business error, and nothing stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_gives_store_error_and_records_nothing() {
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
        } = or_skip!(setup("my_drop_dedup", order).await);
        // The consumer's own single-connection pool, so we know its thread.
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&mysql_url())
            .await
            .expect("connect");
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&pool)
            .await
            .expect("connection id");
        let store = store_for(pool, &dedup, order);
        let msg = Effect {
            table: table.clone(),
            message_id: 7,
            park_inside_body: false,
        };
        let gate = Arc::new(Gate {
            read_after_release,
            ..Gate::default()
        });
        let body_gate = gate.clone();
        let call = tokio::spawn(async move { apply_parked(&store, &msg, &body_gate).await });
        tokio::time::timeout(Duration::from_secs(10), gate.parked.notified())
            .await
            .expect("the body parks in its transaction");
        // The server's own integer, not user input.
        admin
            .execute(AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .await
            .expect("kill the consumer's connection");
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
        assert_eq!(dedup_rows(&admin, &dedup).await, 0, "no dedup record");
    }
}

/// Another transaction holds the key (an in-flight first delivery between
/// its claim and its commit): the claim waits on the row lock, gives up at
/// the lock wait timeout with `InProgress`, and leaves no effect; once the
/// other transaction is gone the delivery runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waiting_past_the_lock_wait_timeout_is_in_progress() {
    for order in [ClaimOrder::Last, ClaimOrder::First] {
        let Setup {
            admin,
            dedup,
            table,
            store: _,
            _cleanup,
        } = or_skip!(setup("my_lock_dedup", order).await);
        let pool = or_skip!(mysql_pool(2, 1).await);
        let store = store_for(pool, &dedup, order).with_lock_timeout(Duration::from_secs(1));

        // The other delivery's uncommitted claim row.
        let key = idem_runtime::Key::from_parts(&[&3i64]).expect("key");
        let mut holder = admin.begin().await.expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {dedup} (handler, `key`, status, attempts, created_at, updated_at, expires_at)
             VALUES ('my_apply_effect', ?, 'in_progress', 1, 0, 0, 9223372036854775807)"
        )))
        .bind(key.as_str())
        .execute(&mut *holder)
        .await
        .expect("hold the key");

        let msg = Effect {
            table: table.clone(),
            message_id: 3,
            park_inside_body: false,
        };
        let started = std::time::Instant::now();
        match apply_effect(&store, &msg).await {
            Err(Error::InProgress {
                retry_after,
                key: k,
                ..
            }) => {
                assert_eq!(retry_after, Duration::from_secs(1), "{order:?}");
                assert_eq!(k, key);
            }
            other => panic!("{order:?}: expected InProgress, got {other:?}"),
        }
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{order:?}: it waited for the lock"
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
        assert_eq!(applied(&admin, &table).await, vec![(3, 1)], "{order:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_many_connections_at_once() {
    let admin = or_skip!(mysql_pool(2, 5).await);
    let dedup = unique_table("my_migrate");
    let _cleanup = DropMySqlTables::new(&[&dedup]);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let dedup = dedup.clone();
        tasks.push(tokio::spawn(async move {
            let store = MySqlStore::connect(&mysql_url())
                .await?
                .with_table(&dedup)?;
            store.migrate().await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("concurrent migrate succeeds");
    }
    let store = store_for(admin.clone(), &dedup, ClaimOrder::Last);
    let msg = Effect {
        table: business_table(&admin).await,
        message_id: 1,
        park_inside_body: false,
    };
    let _business = DropMySqlTables::new(&[&msg.table]);
    assert!(
        apply_effect(&store, &msg)
            .await
            .expect("runs")
            .is_executed()
    );
    assert!(
        MySqlStore::from_pool(admin.clone())
            .with_table("bad name")
            .is_err()
    );
    assert!(
        MySqlStore::from_pool(admin)
            .with_table("x; drop table y")
            .is_err()
    );
}
