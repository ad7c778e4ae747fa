//! Consumers whose clocks disagree by a minute, for real: one consumer runs
//! as a child process of this test binary under libfaketime (`FAKETIME=+60s`
//! or `-60s`: its `SystemTime::now()` is a minute off, which the test
//! checks), the other in the test process on the real clock.
//!
//! The SQL stores take every time from the database, so on PostgreSQL and
//! MariaDB neither consumer takes over the other's live lease, nor counts
//! the other's live record as expired, and the records carry the
//! database's time. (With times from the consumer's clock, the consumer a
//! minute ahead would find a 30 s lease or record of the other run out and
//! run the body again; the records of the one a minute off would be written
//! a minute off.) Each scenario counts the bodies' executions in the
//! database.
//!
//! SQLite is embedded: its clock is the clock of the process that runs the
//! statement, the consumer's own. A consumer under libfaketime is a SQLite
//! whose clock is off too, which the SQLite test shows; SQLite consumers
//! share one host (WAL needs one), and so one clock.
//!
//! Without libfaketime (`apt-get install faketime`) the tests skip, and fail
//! under `IDEM_REQUIRE_SERVICES=1`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::store::Status;
use idem_runtime::store::sql::{Dialect, SqlStore};
use idem_runtime::{
    ClaimOrder, Error, Key, MySqlStore, MySqlTx, Outcome, PgStore, PgTx, SqliteStore, SqliteTx,
    idempotent,
};
use idem_tests::{
    ChildTest, DropMySqlTables, DropTables, LIBFAKETIME, mysql_url, or_skip, pg_url, unavailable,
    unique_table,
};
use sqlx::AssertSqlSafe;
use tokio::sync::Notify;

/// How far the child's clock is off.
const AHEAD: &str = "+60s";
const BEHIND: &str = "-60s";

/// How long a wait on the child may take.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
}

/// A delivery of message `id`, whose body writes a row of `ledger`.
#[derive(Debug)]
struct Job {
    id: String,
    ledger: String,
}

/// Where a lease-mode body parks until the test lets it go on.
#[derive(Debug, Default)]
struct Gate {
    hold: bool,
    parked: Notify,
    open: Notify,
}

impl Gate {
    fn holding() -> Gate {
        Gate {
            hold: true,
            ..Gate::default()
        }
    }
}

/// How many bodies ran in this process.
static BODIES: AtomicUsize = AtomicUsize::new(0);

/// The database a scenario runs on, and the pools its bodies write through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pg,
    MySql,
    Sqlite,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pg => "postgres",
            Kind::MySql => "mysql",
            Kind::Sqlite => "sqlite",
        }
    }

    fn parse(name: &str) -> Kind {
        match name {
            "postgres" => Kind::Pg,
            "mysql" => Kind::MySql,
            "sqlite" => Kind::Sqlite,
            other => panic!("unknown kind {other}"),
        }
    }
}

/// The store of a consumer, on one of the databases.
#[derive(Debug, Clone)]
enum Store {
    Pg(PgStore),
    MySql(MySqlStore),
    Sqlite(SqliteStore),
}

/// The statement reading `store`'s database clock, as its statements do.
fn now_sql<D: Dialect>(_store: &SqlStore<D>) -> String {
    format!("SELECT {}", D::NOW)
}

impl Store {
    /// The store of a consumer on `kind`'s database, on `dedup` (`sqlite`:
    /// the database file).
    async fn open(kind: Kind, dedup: &str, sqlite: &str) -> Store {
        match kind {
            Kind::Pg => Store::Pg(
                PgStore::connect(&pg_url())
                    .await
                    .expect("PostgreSQL")
                    .with_table(dedup)
                    .expect("table")
                    .with_claim_order(ClaimOrder::First),
            ),
            Kind::MySql => Store::MySql(
                MySqlStore::connect(&mysql_url())
                    .await
                    .expect("MariaDB")
                    .with_table(dedup)
                    .expect("table")
                    .with_claim_order(ClaimOrder::First),
            ),
            Kind::Sqlite => Store::Sqlite(
                SqliteStore::open(sqlite)
                    .await
                    .expect("SQLite")
                    .with_table(dedup)
                    .expect("table"),
            ),
        }
    }

    /// Migrates the store and creates `ledger`.
    async fn create(&self, ledger: &str) {
        let sql = format!("CREATE TABLE {ledger} (id VARCHAR(64) NOT NULL)");
        match self {
            Store::Pg(s) => {
                s.migrate().await.expect("migrate");
                sqlx::query(AssertSqlSafe(sql))
                    .execute(s.pool())
                    .await
                    .map(drop)
            }
            Store::MySql(s) => {
                s.migrate().await.expect("migrate");
                sqlx::query(AssertSqlSafe(sql))
                    .execute(s.pool())
                    .await
                    .map(drop)
            }
            Store::Sqlite(s) => {
                s.migrate().await.expect("migrate");
                sqlx::query(AssertSqlSafe(sql))
                    .execute(s.pool())
                    .await
                    .map(drop)
            }
        }
        .expect("the ledger");
    }

    /// A lease-mode body's effect: a ledger row, through the pool.
    async fn add(&self, ledger: &str, id: &str) -> Result<(), sqlx::Error> {
        let pg = format!("INSERT INTO {ledger} (id) VALUES ($1)");
        let my = format!("INSERT INTO {ledger} (id) VALUES (?)");
        match self {
            Store::Pg(s) => sqlx::query(AssertSqlSafe(pg))
                .bind(id)
                .execute(s.pool())
                .await
                .map(drop),
            Store::MySql(s) => sqlx::query(AssertSqlSafe(my))
                .bind(id)
                .execute(s.pool())
                .await
                .map(drop),
            Store::Sqlite(s) => sqlx::query(AssertSqlSafe(pg))
                .bind(id)
                .execute(s.pool())
                .await
                .map(drop),
        }
    }

    /// How many times bodies took effect for `id`: the executions, counted
    /// in the database.
    async fn executions(&self, ledger: &str, id: &str) -> i64 {
        let pg = format!("SELECT COUNT(*) FROM {ledger} WHERE id = $1");
        let my = format!("SELECT COUNT(*) FROM {ledger} WHERE id = ?");
        match self {
            Store::Pg(s) => {
                sqlx::query_scalar(AssertSqlSafe(pg))
                    .bind(id)
                    .fetch_one(s.pool())
                    .await
            }
            Store::MySql(s) => {
                sqlx::query_scalar(AssertSqlSafe(my))
                    .bind(id)
                    .fetch_one(s.pool())
                    .await
            }
            Store::Sqlite(s) => {
                sqlx::query_scalar(AssertSqlSafe(pg))
                    .bind(id)
                    .fetch_one(s.pool())
                    .await
            }
        }
        .expect("count the executions")
    }

    /// The database's clock, as the store's statements read it.
    async fn db_now(&self) -> i64 {
        match self {
            Store::Pg(s) => {
                sqlx::query_scalar(AssertSqlSafe(now_sql(s)))
                    .fetch_one(s.pool())
                    .await
            }
            Store::MySql(s) => {
                sqlx::query_scalar(AssertSqlSafe(now_sql(s)))
                    .fetch_one(s.pool())
                    .await
            }
            Store::Sqlite(s) => {
                sqlx::query_scalar(AssertSqlSafe(now_sql(s)))
                    .fetch_one(s.pool())
                    .await
            }
        }
        .expect("the database's clock")
    }

    async fn record(&self, handler: &str, key: &Key) -> idem_runtime::store::Record {
        match self {
            Store::Pg(s) => s.record(handler, key).await,
            Store::MySql(s) => s.record(handler, key).await,
            Store::Sqlite(s) => s.record(handler, key).await,
        }
        .expect("read the record")
        .expect("a record")
    }

    /// Delivers `msg` to the lease-mode handler.
    async fn lease(&self, msg: &Job, gate: &Gate) -> Result<Outcome<u32>, Error<AppError>> {
        match self {
            Store::Pg(s) => lease_job(s, msg, self, gate).await,
            Store::MySql(s) => lease_job(s, msg, self, gate).await,
            Store::Sqlite(s) => lease_job(s, msg, self, gate).await,
        }
    }

    /// Delivers `msg` to the transaction-mode handler of the store.
    async fn tx(&self, msg: &Job) -> Result<Outcome<u32>, Error<AppError>> {
        match self {
            Store::Pg(s) => tx_pg(s, msg).await,
            Store::MySql(s) => tx_mysql(s, msg).await,
            Store::Sqlite(s) => tx_sqlite(s, msg).await,
        }
    }
}

/// A lease of 30 s: half the clocks' skew.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "30s",
    store = "postgres",
    name = "skew_lease"
)]
async fn lease_job(msg: &Job, store: &Store, gate: &Gate) -> Result<u32, AppError> {
    BODIES.fetch_add(1, Ordering::SeqCst);
    store.add(&msg.ledger, &msg.id).await?;
    if gate.hold {
        gate.parked.notify_one();
        gate.open.notified().await;
    }
    Ok(1)
}

/// Records that count for 30 s: half the clocks' skew.
#[idempotent(key = "id", ttl = "30s", store = "postgres", name = "skew_tx_pg")]
async fn tx_pg(tx: &mut PgTx<'_>, msg: &Job) -> Result<u32, AppError> {
    BODIES.fetch_add(1, Ordering::SeqCst);
    let sql = format!("INSERT INTO {} (id) VALUES ($1)", msg.ledger);
    sqlx::query(AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

#[idempotent(key = "id", ttl = "30s", store = "mysql", name = "skew_tx_mysql")]
async fn tx_mysql(tx: &mut MySqlTx<'_>, msg: &Job) -> Result<u32, AppError> {
    BODIES.fetch_add(1, Ordering::SeqCst);
    let sql = format!("INSERT INTO {} (id) VALUES (?)", msg.ledger);
    sqlx::query(AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

#[idempotent(key = "id", ttl = "30s", store = "sqlite", name = "skew_tx_sqlite")]
async fn tx_sqlite(tx: &mut SqliteTx<'_>, msg: &Job) -> Result<u32, AppError> {
    BODIES.fetch_add(1, Ordering::SeqCst);
    let sql = format!("INSERT INTO {} (id) VALUES (?)", msg.ledger);
    sqlx::query(AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

/// What a delivery came to, as the child reports it.
fn kind_of(result: &Result<Outcome<u32>, Error<AppError>>) -> String {
    match result {
        Ok(Outcome::Executed(_)) => "executed".to_owned(),
        Ok(Outcome::Duplicate(_)) => "duplicate".to_owned(),
        Err(Error::InProgress { .. }) => "in_progress".to_owned(),
        Err(e) => format!("error: {e}"),
    }
}

fn system_now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

/// The other consumer: a child process of this binary, its clock set off by
/// the parent (libfaketime). It prints `CLOCK <its SystemTime, ms>` and
/// `DBNOW <its database's clock, ms>`, then plays `IDEM_SKEW_ROLE`:
///
/// * `clock`: nothing more;
/// * `deliver-lease`, `deliver-tx`: delivers the message once;
/// * `hold-lease`: delivers it and parks in the body (`PARKED`) until a
///   line on stdin;
///
/// and prints `RESULT <what the delivery came to> <bodies it ran>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the skewed-clock tests as a child process"]
async fn skewed_consumer() {
    let Ok(role) = std::env::var("IDEM_SKEW_ROLE") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let kind = Kind::parse(&var("IDEM_SKEW_KIND"));
    let store = Store::open(kind, &var("IDEM_SKEW_DEDUP"), &var("IDEM_SKEW_SQLITE")).await;
    println!("CLOCK {}", system_now_ms());
    println!("DBNOW {}", store.db_now().await);
    let msg = Job {
        id: var("IDEM_SKEW_ID"),
        ledger: var("IDEM_SKEW_LEDGER"),
    };
    let result = match role.as_str() {
        "clock" => return,
        "deliver-lease" => store.lease(&msg, &Gate::default()).await,
        "deliver-tx" => store.tx(&msg).await,
        "hold-lease" => {
            let gate = std::sync::Arc::new(Gate::holding());
            let call = {
                let (store, gate) = (store.clone(), std::sync::Arc::clone(&gate));
                tokio::spawn(async move { store.lease(&msg, &gate).await })
            };
            gate.parked.notified().await;
            println!("PARKED");
            tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).expect("read stdin");
            })
            .await
            .expect("wait for the parent");
            gate.open.notify_one();
            call.await.expect("the delivery")
        }
        other => panic!("unknown role {other}"),
    };
    println!(
        "RESULT {} {}",
        kind_of(&result),
        BODIES.load(Ordering::SeqCst)
    );
}

/// A scenario's tables and the test process's own consumer.
struct Fx {
    kind: Kind,
    store: Store,
    dedup: String,
    ledger: String,
    sqlite: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<DropTables>,
    _my: Option<DropMySqlTables>,
}

impl Fx {
    /// `None` (after saying why) when libfaketime or the server is missing.
    async fn open(kind: Kind) -> Option<Fx> {
        if !std::path::Path::new(LIBFAKETIME).exists() {
            return unavailable(
                "libfaketime",
                LIBFAKETIME,
                "not installed: apt-get install faketime",
            );
        }
        let dedup = unique_table("skew_dedup");
        let ledger = unique_table("skew_ledger");
        let (mut dir, mut pg, mut my, mut sqlite) = (None, None, None, String::new());
        match kind {
            Kind::Pg => {
                idem_tests::pg_pool(1).await?;
                pg = Some(DropTables::new(&[&dedup, &ledger]));
            }
            Kind::MySql => {
                idem_tests::mysql_pool(1, 5).await?;
                my = Some(DropMySqlTables::new(&[&dedup, &ledger]));
            }
            Kind::Sqlite => {
                let d = tempfile::tempdir().expect("a temporary directory");
                sqlite = d.path().join("idem.db").display().to_string();
                dir = Some(d);
            }
        }
        let store = Store::open(kind, &dedup, &sqlite).await;
        store.create(&ledger).await;
        Some(Fx {
            kind,
            store,
            dedup,
            ledger,
            sqlite,
            _dir: dir,
            _pg: pg,
            _my: my,
        })
    }

    fn job(&self, id: &str) -> Job {
        Job {
            id: id.to_owned(),
            ledger: self.ledger.clone(),
        }
    }

    /// The other consumer, playing `role` on message `id` with its clock
    /// `skew` off; returns once it has shown that its clock is.
    async fn child(&self, role: &str, id: &str, skew: &str) -> ChildTest {
        let mut child = ChildTest::spawn(
            "skewed_clock::skewed_consumer",
            &[
                ("LD_PRELOAD", LIBFAKETIME),
                ("FAKETIME", skew),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                ("IDEM_SKEW_ROLE", role),
                ("IDEM_SKEW_KIND", self.kind.name()),
                ("IDEM_SKEW_DEDUP", &self.dedup),
                ("IDEM_SKEW_LEDGER", &self.ledger),
                ("IDEM_SKEW_SQLITE", &self.sqlite),
                ("IDEM_SKEW_ID", id),
            ],
        );
        let clock: i64 = child.line("CLOCK", WAIT).await.parse().expect("ms");
        let off = clock - system_now_ms();
        let want: i64 = if skew.starts_with('-') {
            -60_000
        } else {
            60_000
        };
        // Read a moment after the child printed it: a little less.
        assert!(
            (want - 5_000..=want + 1_000).contains(&off),
            "the child's clock is {off} ms off, not {skew}: libfaketime did not take"
        );
        child
    }

    /// The records `handler` wrote for `id` carry the database's time:
    /// written within the last seconds of its clock, not a minute off.
    async fn assert_database_times(&self, handler: &str, id: &str, hold_ms: i64) {
        let key = Key::from_parts(&[&id]).expect("a key");
        let rec = self.store.record(handler, &key).await;
        let now = self.store.db_now().await;
        assert_eq!(rec.status, Status::Completed, "{rec:?}");
        for at in [rec.created_at_ms, rec.updated_at_ms] {
            assert!(
                (now - 10_000..=now).contains(&at),
                "written at {at}, {} ms from the database's now {now}: {rec:?}",
                at - now
            );
        }
        assert_eq!(rec.expires_at_ms, rec.updated_at_ms + hold_ms, "{rec:?}");
    }
}

/// What the child's delivery came to, and how many bodies it ran.
fn parse_result(line: &str) -> (String, usize) {
    let (kind, bodies) = line.rsplit_once(' ').expect("RESULT <kind> <bodies>");
    (kind.to_owned(), bodies.parse().expect("a count"))
}

/// The test process holds a live 30 s lease (its body parked); a consumer
/// whose clock is a minute ahead delivers the same key: the lease is in
/// progress, its body does not run; the body runs once in all.
async fn a_consumer_a_minute_ahead_finds_a_live_lease_in_progress(kind: Kind) {
    let fx = or_skip!(Fx::open(kind).await);
    let id = "ahead-1";
    let gate = std::sync::Arc::new(Gate::holding());
    let held = {
        let (store, gate, msg) = (fx.store.clone(), std::sync::Arc::clone(&gate), fx.job(id));
        tokio::spawn(async move { store.lease(&msg, &gate).await })
    };
    gate.parked.notified().await;

    let mut child = fx.child("deliver-lease", id, AHEAD).await;
    let (result, bodies) = parse_result(&child.line("RESULT", WAIT).await);
    assert_eq!(
        (result.as_str(), bodies),
        ("in_progress", 0),
        "the consumer a minute ahead took over a live lease"
    );
    child.finish(WAIT).await;

    gate.open.notify_one();
    assert_eq!(held.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(fx.store.executions(&fx.ledger, id).await, 1);
    fx.assert_database_times("skew_lease", id, 3_600_000).await;
}

/// A consumer whose clock is `skew` off holds a live 30 s lease (its body
/// parked); the test process delivers the same key: in progress, no body
/// runs; the body runs once in all, and its records carry the database's
/// time, not the child's.
async fn a_live_lease_of_a_consumer_a_minute_off_is_in_progress(kind: Kind, skew: &str) {
    let fx = or_skip!(Fx::open(kind).await);
    let id = "holder-1";
    let mut child = fx.child("hold-lease", id, skew).await;
    child.line("PARKED", WAIT).await;

    let out = fx.store.lease(&fx.job(id), &Gate::default()).await;
    assert_eq!(
        kind_of(&out),
        "in_progress",
        "a live lease of the consumer {skew} was taken over: {out:?}"
    );

    child.send("go");
    let (result, bodies) = parse_result(&child.line("RESULT", WAIT).await);
    assert_eq!((result.as_str(), bodies), ("executed", 1));
    child.finish(WAIT).await;
    assert_eq!(fx.store.executions(&fx.ledger, id).await, 1);
    fx.assert_database_times("skew_lease", id, 3_600_000).await;
}

/// Transaction mode (claiming first): the test process records a key
/// whose record counts 30 s; a consumer a minute ahead delivers it: a
/// duplicate, its body does not run.
async fn a_consumer_a_minute_ahead_finds_a_live_record(kind: Kind, handler: &str) {
    let fx = or_skip!(Fx::open(kind).await);
    let id = "tx-ahead-1";
    assert_eq!(
        fx.store.tx(&fx.job(id)).await.unwrap(),
        Outcome::Executed(1)
    );

    let mut child = fx.child("deliver-tx", id, AHEAD).await;
    let (result, bodies) = parse_result(&child.line("RESULT", WAIT).await);
    assert_eq!(
        (result.as_str(), bodies),
        ("duplicate", 0),
        "the consumer a minute ahead counted a live record as expired"
    );
    child.finish(WAIT).await;
    assert_eq!(fx.store.executions(&fx.ledger, id).await, 1);
    fx.assert_database_times(handler, id, 30_000).await;
}

/// Transaction mode: a consumer a minute behind records a key whose
/// record counts 30 s; the test process delivers it: a duplicate, with the
/// database's times.
async fn a_record_of_a_consumer_a_minute_behind_is_live(kind: Kind, handler: &str) {
    let fx = or_skip!(Fx::open(kind).await);
    let id = "tx-behind-1";
    let mut child = fx.child("deliver-tx", id, BEHIND).await;
    let (result, bodies) = parse_result(&child.line("RESULT", WAIT).await);
    assert_eq!((result.as_str(), bodies), ("executed", 1));
    child.finish(WAIT).await;

    let out = fx.store.tx(&fx.job(id)).await;
    assert_eq!(
        kind_of(&out),
        "duplicate",
        "the record of the consumer a minute behind counted as expired: {out:?}"
    );
    assert_eq!(fx.store.executions(&fx.ledger, id).await, 1);
    fx.assert_database_times(handler, id, 30_000).await;
}

macro_rules! skew_tests {
    ($module:ident, $kind:expr, $tx_handler:literal) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lease_a_consumer_a_minute_ahead_finds_a_live_lease_in_progress() {
                a_consumer_a_minute_ahead_finds_a_live_lease_in_progress($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lease_a_live_lease_of_a_consumer_a_minute_behind_is_in_progress() {
                a_live_lease_of_a_consumer_a_minute_off_is_in_progress($kind, BEHIND).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lease_a_live_lease_of_a_consumer_a_minute_ahead_is_in_progress() {
                a_live_lease_of_a_consumer_a_minute_off_is_in_progress($kind, AHEAD).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tx_a_consumer_a_minute_ahead_finds_a_live_record() {
                a_consumer_a_minute_ahead_finds_a_live_record($kind, $tx_handler).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tx_a_record_of_a_consumer_a_minute_behind_is_live() {
                a_record_of_a_consumer_a_minute_behind_is_live($kind, $tx_handler).await;
            }
        }
    };
}

skew_tests!(pg, Kind::Pg, "skew_tx_pg");
skew_tests!(mysql, Kind::MySql, "skew_tx_mysql");

/// PostgreSQL's and MariaDB's clocks are the server's: the child's database
/// clock is the test process's, whatever libfaketime does to the child.
/// SQLite's is the process's own: under libfaketime, the child's SQLite is
/// a minute off along with the child, so on SQLite the scenarios above
/// cannot hold (and need not: SQLite's consumers share one host's clock).
async fn whose_clock_the_database_reads(kind: Kind) {
    let fx = or_skip!(Fx::open(kind).await);
    let mut child = fx.child("clock", "-", AHEAD).await;
    let theirs: i64 = child.line("DBNOW", WAIT).await.parse().expect("ms");
    child.finish(WAIT).await;
    let ours = fx.store.db_now().await;
    let off = theirs - ours;
    if kind == Kind::Sqlite {
        assert!(
            (55_000..=61_000).contains(&off),
            "the child's SQLite reads {off} ms off: not the child's own clock"
        );
    } else {
        assert!(
            (-5_000..=1_000).contains(&off),
            "the child's database reads {off} ms off the test process's: not the server's clock"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_s_clock_is_the_server_s_whatever_the_consumer_s() {
    whose_clock_the_database_reads(Kind::Pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_s_clock_is_the_server_s_whatever_the_consumer_s() {
    whose_clock_the_database_reads(Kind::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_s_clock_is_the_consumer_process_s_own() {
    whose_clock_the_database_reads(Kind::Sqlite).await;
}
