//! The stress scenarios, written once and run on PostgreSQL and MySQL:
//! real contention, real crashes, connections killed under a parked body,
//! claims waiting past the lock timeout, concurrent migrations. Every claim
//! about effects is read back from the business table, not from idem's own
//! counters.
//!
//! * The scenarios are generic functions over a [`StressHandlers`] fixture:
//!   an admin pool of the server's, and what differs between the servers
//!   ([`StressFixture`]: how a consumer connects, the business table's SQL in
//!   the server's dialect, how a connection is killed, how a key is held in
//!   an uncommitted transaction, the lock timeout the server can count).
//! * The handlers take the transaction of one store type, so each fixture
//!   defines its own with [`handlers!`] (thin wrappers around the bodies
//!   here), which also implements [`StressHandlers`].
//! * The crash scenarios re-run the test binary as a child process, which
//!   runs a test named `crash_child`; each binary declares it (ignored) as
//!   `stress::crash_child::<Fixture>()`.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::store::TxStore;
use idem_runtime::{ClaimOrder, Error, Key, Outcome, RoundTrips, StoreError};

/// How a consumer's transaction-mode handlers write their dedup row: the
/// claim order, and how the row travels (a store that cannot merge it
/// into the `COMMIT`, or claims first, sends it on its own whatever this
/// says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Way(pub(crate) ClaimOrder, pub(crate) RoundTrips);

impl Way {
    /// Claiming last, the row a statement of its own.
    pub(crate) const LAST: Way = Way(ClaimOrder::Last, RoundTrips::Separate);
    /// Claiming first.
    pub(crate) const FIRST: Way = Way(ClaimOrder::First, RoundTrips::Separate);
    /// Claiming last, the row in the `COMMIT`'s message.
    pub(crate) const LAST_MERGED: Way = Way(ClaimOrder::Last, RoundTrips::Merged);

    /// The name a crash test's child reads back.
    fn name(self) -> &'static str {
        match self {
            Way::FIRST => "first",
            Way::LAST_MERGED => "last_merged",
            _ => "last",
        }
    }

    fn named(name: &str) -> Way {
        match name {
            "first" => Way::FIRST,
            "last_merged" => Way::LAST_MERGED,
            _ => Way::LAST,
        }
    }
}
use idem_tests::{or_skip, unique_table};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------
// The fixture

/// A server's admin pool, and what the scenarios do on that server.
pub(crate) trait StressFixture: Sized + Send + Sync + 'static {
    type Store: TxStore + Clone + Send + Sync + 'static;
    /// The connection under the store's transaction (`&mut **tx`), which
    /// the bodies write through.
    type Conn;
    /// The server's id of a connection, to kill it with.
    type ConnId: Send;
    /// An admin transaction holding a key's uncommitted claim row.
    type Holder: Send;
    /// Drops its tables at the end of its scope.
    type Cleanup;

    /// The start of the tables' names (`pg`, `my`).
    const PREFIX: &'static str;
    /// The lock timeout of [`lock_waiting`](Self::lock_waiting): one the
    /// server can count (MySQL: whole seconds).
    const LOCK_TIMEOUT: Duration;

    /// An admin pool, or `None` (after saying why) when the server is
    /// unreachable, which `IDEM_REQUIRE_SERVICES=1` turns into a failure.
    async fn admin() -> Option<Self>;
    /// Drops `tables` when the returned value goes.
    fn drop_later(tables: &[&str]) -> Self::Cleanup;
    /// A store on the admin pool over `dedup`, claiming in `order`.
    fn store_on_admin(&self, dedup: &str, order: Way) -> Self::Store;
    /// Creates the store's table.
    fn migrate(store: &Self::Store) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// A consumer of its own: a store on a single connection over `dedup`,
    /// and the server's id of that connection.
    fn consumer(
        dedup: &str,
        order: Way,
    ) -> impl Future<Output = (Self::Store, Self::ConnId)> + Send;
    /// A store that makes its own pool from the URL, as a process would.
    fn connect(
        dedup: &str,
        order: Way,
    ) -> impl Future<Output = Result<Self::Store, StoreError>> + Send;
    /// A store whose claims wait on a row lock at most
    /// [`LOCK_TIMEOUT`](Self::LOCK_TIMEOUT), and know it.
    async fn lock_waiting(dedup: &str, order: Way) -> Option<Self::Store>;
    /// Kills the connection `id` from the admin pool.
    async fn kill(&self, id: Self::ConnId);
    /// Whether a store refuses `table` as its table's name.
    fn refuses_table(&self, table: &str) -> bool;

    /// Creates a business table of the test's own: `message_id` and how
    /// often the message was `applied`.
    async fn business_table(&self) -> String;
    /// The business table's rows, by message.
    async fn applied(&self, table: &str) -> Vec<(i64, i64)>;
    /// How many rows the dedup table holds.
    async fn dedup_rows(&self, dedup: &str) -> i64;
    /// The dedup table's columns, in order.
    async fn columns(&self, dedup: &str) -> Vec<String>;
    /// Inserts `handler`'s claim of `key` in an admin transaction left open,
    /// as an in-flight first delivery between its claim and its commit.
    async fn hold(&self, dedup: &str, handler: &str, key: &Key) -> Self::Holder;
    /// Rolls the holder's transaction back.
    async fn release(holder: Self::Holder);

    /// In a body: adds one to the message's row, returning the new count.
    async fn bump(conn: &mut Self::Conn, msg: &Effect) -> Result<i64, sqlx::Error>;
    /// In a body: reads the message's count.
    async fn read(conn: &mut Self::Conn, msg: &Effect) -> Result<i64, sqlx::Error>;
}

/// The scenarios' handlers on a fixture's transaction type (see
/// [`handlers!`]).
pub(crate) trait StressHandlers: StressFixture {
    /// The registered name of [`apply_effect`](Self::apply_effect).
    const EFFECT: &'static str;

    /// Adds one to the message's row: an effect applied twice shows as 2.
    fn apply_effect(store: &Self::Store, msg: &Effect) -> impl Future<Output = Applied> + Send;
    /// As `apply_effect`, parking on `gate` after the business write.
    fn apply_parked(
        store: &Self::Store,
        msg: &Effect,
        gate: &Gate,
    ) -> impl Future<Output = Applied> + Send;
}

/// What a delivery returns.
pub(crate) type Applied = Result<Outcome<i64>, Error<sqlx::Error>>;

// ---------------------------------------------------------------------------
// Messages and bodies

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Effect {
    /// The business table the body writes (one per test).
    pub(crate) table: String,
    pub(crate) message_id: i64,
    /// Crash tests: what the body does before returning.
    #[serde(default)]
    pub(crate) park: Park,
}

impl Effect {
    pub(crate) fn new(table: &str, message_id: i64) -> Effect {
        Effect {
            table: table.to_owned(),
            message_id,
            park: Park::No,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Park {
    #[default]
    No,
    /// Print READY and hang inside the body (the process is then killed).
    InsideBody,
}

/// Where a body parks: it signals `parked` after its business write, then
/// waits for `release`. One per call, so no wake-up leaks between tests.
#[derive(Default)]
pub(crate) struct Gate {
    parked: tokio::sync::Notify,
    release: tokio::sync::Notify,
    /// Released, the body reads its row once more through its transaction
    /// before returning (so a connection dropped while it was parked fails
    /// the body's own statement, not the commit).
    read_after_release: bool,
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The body of `apply_effect`.
pub(crate) async fn effect_body<F: StressFixture>(
    conn: &mut F::Conn,
    msg: &Effect,
) -> Result<i64, sqlx::Error> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    let applied = F::bump(conn, msg).await?;
    match msg.park {
        Park::No => {}
        Park::InsideBody => {
            println!("READY");
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
    }
    Ok(applied)
}

/// The body of `apply_parked`.
pub(crate) async fn parked_body<F: StressFixture>(
    conn: &mut F::Conn,
    msg: &Effect,
    gate: &Gate,
) -> Result<i64, sqlx::Error> {
    let applied = F::bump(conn, msg).await?;
    gate.parked.notify_one();
    gate.release.notified().await;
    if gate.read_after_release {
        return F::read(conn, msg).await;
    }
    Ok(applied)
}

/// The scenarios' two handlers on the transaction type `$Tx` of the fixture
/// `$Fx`, registered under the names given, and the fixture's
/// [`StressHandlers`].
#[allow(unused_macros)]
macro_rules! handlers {
    (
        $Fx:ident, tx: $Tx:ident, store: $store:tt,
        names: { effect: $effect:tt, parked: $parked:tt $(,)? } $(,)?
    ) => {
        mod stress_handlers {
            use super::$Fx;
            use crate::common::stress::{self, Effect, Gate};
            use idem_runtime::{idempotent, $Tx};

            #[idempotent(key = "message_id", ttl = "1h", store = $store, name = $effect)]
            pub(crate) async fn apply_effect(
                tx: &mut $Tx<'_>,
                msg: &Effect,
            ) -> Result<i64, sqlx::Error> {
                stress::effect_body::<$Fx>(&mut **tx, msg).await
            }

            #[idempotent(key = "msg.message_id", ttl = "1h", store = $store, name = $parked)]
            pub(crate) async fn apply_parked(
                tx: &mut $Tx<'_>,
                msg: &Effect,
                gate: &Gate,
            ) -> Result<i64, sqlx::Error> {
                stress::parked_body::<$Fx>(&mut **tx, msg, gate).await
            }
        }

        impl crate::common::stress::StressHandlers for $Fx {
            const EFFECT: &'static str = $effect;

            fn apply_effect(
                store: &Self::Store,
                msg: &crate::common::stress::Effect,
            ) -> impl std::future::Future<Output = crate::common::stress::Applied> + Send {
                stress_handlers::apply_effect(store, msg)
            }

            fn apply_parked(
                store: &Self::Store,
                msg: &crate::common::stress::Effect,
                gate: &crate::common::stress::Gate,
            ) -> impl std::future::Future<Output = crate::common::stress::Applied> + Send {
                stress_handlers::apply_parked(store, msg, gate)
            }
        }
    };
}

#[allow(unused_imports)]
pub(crate) use handlers;

// ---------------------------------------------------------------------------
// Setup

/// A test's tables: its business table and dedup table (dropped at the
/// end, even on failure), the admin fixture, and a migrated store on them.
pub(crate) struct Setup<F: StressFixture> {
    pub(crate) fx: F,
    pub(crate) dedup: String,
    pub(crate) table: String,
    pub(crate) store: F::Store,
    /// Declared last: the tables go when everything else has.
    pub(crate) _cleanup: F::Cleanup,
}

/// The usual start of a test, or `None` (skip) without a server.
pub(crate) async fn setup<F: StressFixture>(name: &str, order: Way) -> Option<Setup<F>> {
    let fx = F::admin().await?;
    let dedup = unique_table(&format!("{}_{name}", F::PREFIX));
    let table = fx.business_table().await;
    let _cleanup = F::drop_later(&[&dedup, &table]);
    let store = fx.store_on_admin(&dedup, order);
    F::migrate(&store).await.expect("migrate");
    Some(Setup {
        fx,
        dedup,
        table,
        store,
        _cleanup,
    })
}

// ---------------------------------------------------------------------------
// The scenarios

/// 16 consumers on their own connections deliver the same 1,000 messages,
/// each 3 to 5 times, at the same moment.
pub(crate) async fn contention<F: StressHandlers>(order: Way) {
    let Setup {
        fx,
        dedup,
        table,
        store: _,
        _cleanup,
    } = or_skip!(setup::<F>("dedup", order).await);

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
            let (store, _) = F::consumer(&dedup, order).await;
            barrier.wait().await;
            let (mut executed, mut duplicate, mut retries) = (0usize, 0usize, 0usize);
            for id in queue {
                let msg = Effect::new(&table, id);
                loop {
                    match F::apply_effect(&store, &msg).await {
                        Ok(Outcome::Executed(_)) => executed += 1,
                        Ok(Outcome::Duplicate(_)) => duplicate += 1,
                        // Another consumer holds the key, or (InnoDB) this
                        // transaction was chosen as a deadlock victim:
                        // redeliver.
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
    let rows = fx.applied(&table).await;
    assert_eq!(rows.len(), MESSAGES as usize, "every message took effect");
    let twice: Vec<_> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        twice.is_empty(),
        "effects applied more than once: {twice:?}"
    );
    assert_eq!(
        fx.dedup_rows(&dedup).await,
        MESSAGES,
        "one record a message"
    );
}

/// The child side of the crash scenarios: run by the parent as a separate
/// process of the test binary (its test `crash_child`), killed with SIGKILL
/// where it parks. Without the parent's variables it does nothing.
pub(crate) async fn crash_child<F: StressHandlers>() {
    let Ok(mode) = std::env::var("IDEM_CRASH_MODE") else {
        return;
    };
    let dedup = std::env::var("IDEM_CRASH_DEDUP").expect("dedup table");
    let table = std::env::var("IDEM_CRASH_TABLE").expect("business table");
    let order = Way::named(&std::env::var("IDEM_CRASH_ORDER").unwrap_or_default());
    let store = F::connect(&dedup, order).await.expect("child connects");
    let msg = Effect {
        park: if mode == "inside_body" {
            Park::InsideBody
        } else {
            Park::No
        },
        ..Effect::new(&table, 1)
    };
    let outcome = F::apply_effect(&store, &msg).await.expect("child delivery");
    assert!(outcome.is_executed());
    // Committed, but the consumer dies before it can ack.
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Runs `crash_child` in a new process, waits until it prints READY (parked
/// where `mode` says), and kills it with SIGKILL.
fn run_and_kill(mode: &str, dedup: &str, table: &str, order: Way) {
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
        .env("IDEM_CRASH_ORDER", order.name())
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

/// Where the crash scenarios kill the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crash {
    /// Parked inside the body, before the commit.
    InsideBody,
    /// After the commit, before the ack.
    AfterCommit,
}

/// A consumer process is SIGKILLed where `crash` says; the redelivery runs
/// the body again if nothing committed, or is a duplicate if it did, and the
/// effect stands exactly once.
pub(crate) async fn crash<F: StressHandlers>(crash: Crash, order: Way) {
    let Setup {
        fx,
        dedup,
        table,
        store,
        _cleanup,
    } = or_skip!(setup::<F>("crash_dedup", order).await);

    let mode = match crash {
        Crash::InsideBody => "inside_body",
        Crash::AfterCommit => "after_commit",
    };
    let (dedup2, table2) = (dedup.clone(), table.clone());
    tokio::task::spawn_blocking(move || run_and_kill(mode, &dedup2, &table2, order))
        .await
        .expect("crash run");

    // The broker redelivers. Until the server notices the dead connection,
    // its transaction may still hold the key: the redelivery is told to come
    // back; then the server has rolled back whatever was not committed.
    let msg = Effect::new(&table, 1);
    let mut outcome = None;
    for _ in 0..200 {
        match F::apply_effect(&store, &msg).await {
            Ok(o) => {
                outcome = Some(o);
                break;
            }
            Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("redelivery failed: {e:?}"),
        }
    }
    let outcome = outcome.expect("redelivery completes");
    match crash {
        Crash::InsideBody => {
            assert!(outcome.is_executed(), "nothing committed, so it runs again")
        }
        Crash::AfterCommit => assert!(
            outcome.is_duplicate(),
            "committed before the kill, so a duplicate"
        ),
    }
    assert_eq!(outcome.into_inner(), 1);
    // Once more for good measure.
    assert!(
        F::apply_effect(&store, &msg)
            .await
            .expect("again")
            .is_duplicate()
    );
    assert_eq!(
        fx.applied(&table).await,
        vec![(1, 1)],
        "the effect stands exactly once"
    );
}

/// The consumer's connection is killed while the body is parked in its
/// transaction: whether the failure then meets the commit or the body's own
/// next statement (which returns the body's `Err(sqlx::Error)`), the call is
/// a store error to retry, never the body's business error, and nothing
/// stays.
pub(crate) async fn killed_connection<F: StressHandlers>() {
    for (order, read_after_release) in [
        (Way::LAST, false),
        (Way::FIRST, false),
        (Way::LAST_MERGED, false),
        (Way::LAST, true),
        (Way::FIRST, true),
        (Way::LAST_MERGED, true),
    ] {
        let Setup {
            fx,
            dedup,
            table,
            store: _,
            _cleanup,
        } = or_skip!(setup::<F>("drop_dedup", order).await);
        // The consumer's own single connection, so we know which to kill.
        let (store, id) = F::consumer(&dedup, order).await;
        let msg = Effect::new(&table, 7);
        let gate = Arc::new(Gate {
            read_after_release,
            ..Gate::default()
        });
        let body_gate = gate.clone();
        let call = tokio::spawn(async move { F::apply_parked(&store, &msg, &body_gate).await });
        // The body has written through its transaction and is parked in it.
        tokio::time::timeout(Duration::from_secs(10), gate.parked.notified())
            .await
            .expect("the body parks in its transaction");
        fx.kill(id).await;
        gate.release.notify_one();
        let r = call.await.expect("call task");
        assert!(
            matches!(r, Err(Error::Store { .. })),
            "{order:?}, failing in the body: {read_after_release}: expected Error::Store, got {r:?}"
        );
        assert!(
            fx.applied(&table).await.is_empty(),
            "{order:?}: no business effect"
        );
        assert_eq!(fx.dedup_rows(&dedup).await, 0, "{order:?}: no dedup record");
    }
}

/// Another transaction holds the key (an in-flight first delivery between
/// its claim and its commit): the claim waits on the key's row, gives up at
/// the lock timeout with `InProgress`, and leaves no effect; once the other
/// transaction is gone the delivery runs.
pub(crate) async fn claim_waiting_past_the_lock_timeout<F: StressHandlers>() {
    for order in [Way::LAST, Way::FIRST, Way::LAST_MERGED] {
        let Setup {
            fx,
            dedup,
            table,
            store: _,
            _cleanup,
        } = or_skip!(setup::<F>("lock_dedup", order).await);
        let store = or_skip!(F::lock_waiting(&dedup, order).await);

        // The other delivery's uncommitted claim row.
        let key = Key::from_parts(&[&3i64]).expect("key");
        let holder = fx.hold(&dedup, F::EFFECT, &key).await;

        let msg = Effect::new(&table, 3);
        let started = std::time::Instant::now();
        match F::apply_effect(&store, &msg).await {
            Err(Error::InProgress {
                retry_after,
                key: k,
                ..
            }) => {
                assert_eq!(retry_after, F::LOCK_TIMEOUT, "{order:?}");
                assert_eq!(k, key);
            }
            other => panic!("{order:?}: expected InProgress, got {other:?}"),
        }
        let waited = started.elapsed();
        assert!(
            waited >= F::LOCK_TIMEOUT * 9 / 10,
            "{order:?}: it waited for the lock, {waited:?}"
        );
        assert!(
            fx.applied(&table).await.is_empty(),
            "{order:?}: no effect while in progress"
        );

        // The other delivery fails.
        F::release(holder).await;
        assert!(
            F::apply_effect(&store, &msg)
                .await
                .expect("runs")
                .is_executed()
        );
        assert!(
            F::apply_effect(&store, &msg)
                .await
                .expect("after")
                .is_duplicate()
        );
        assert_eq!(fx.applied(&table).await, vec![(3, 1)], "{order:?}");
    }
}

/// Eight processes migrate the same table at once: all succeed, the table
/// has the store's columns and serves a delivery; a store refuses table
/// names that are not plain identifiers.
pub(crate) async fn migrate_from_many_connections_at_once<F: StressHandlers>() {
    let fx = or_skip!(F::admin().await);
    let dedup = unique_table(&format!("{}_migrate", F::PREFIX));
    let table = fx.business_table().await;
    let _cleanup = F::drop_later(&[&dedup, &table]);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let dedup = dedup.clone();
        tasks.push(tokio::spawn(async move {
            let store = F::connect(&dedup, Way::LAST).await?;
            F::migrate(&store).await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("concurrent migrate succeeds");
    }
    assert_eq!(
        fx.columns(&dedup).await,
        [
            "handler",
            "key",
            "status",
            "token",
            "outcome",
            "attempts",
            "failures",
            "last_error",
            "fingerprint",
            "created_at",
            "updated_at",
            "expires_at",
            "max_attempts",
            "traceparent"
        ]
    );
    let store = fx.store_on_admin(&dedup, Way::LAST);
    assert!(
        F::apply_effect(&store, &Effect::new(&table, 1))
            .await
            .expect("runs")
            .is_executed()
    );
    for bad in ["bad name", "public.x; drop", "x; drop table y"] {
        assert!(fx.refuses_table(bad), "{bad:?} is refused");
    }
}
