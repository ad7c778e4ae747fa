//! Pieces shared by the examples: a throw-away database file, Redis clean-up,
//! the benchmarks' medians and settings, a TCP proxy that delays traffic
//! like a network ([`delay_proxy`]), the brokers of the `consume`
//! example (the module `broker`, built with a broker's feature), an
//! HTTP client (the module `http`, with the `http` feature), and the
//! payment routes the HTTP benchmark and the instruction count share (the
//! module `payments`, with the `http` and `postgres` features).

// The RocketMQ broker of the `consume` example holds rocketmq-client-rust's
// producer, whose types are deep.
#![recursion_limit = "256"]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(any(
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "rocketmq"
))]
pub mod broker;
pub mod cpu;
pub mod delay_proxy;
#[cfg(feature = "http")]
pub mod http;
#[cfg(all(feature = "http", feature = "postgres"))]
pub mod payments;

/// A fresh SQLite file under the system's temp directory, removed (with its
/// WAL files) when dropped.
#[derive(Debug)]
pub struct TempDb {
    path: PathBuf,
}

impl TempDb {
    /// A new, not yet existing, database path named after `name`.
    pub fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("idem-{name}-{}-{nanos}.db", std::process::id()));
        TempDb { path }
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Deletes every Redis key under `prefix:` (the examples' own keys). With
/// the `redis` feature.
#[cfg(feature = "redis")]
pub async fn delete_redis_prefix(url: &str, prefix: &str) -> Result<u64, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_manager().await?;
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            deleted += n;
        }
        cursor = next;
        if cursor == 0 {
            return Ok(deleted);
        }
    }
}

/// The process ids of the PostgreSQL backends of `pool`'s first `n`
/// connections, held at once so that each is a different one: with a pool
/// of `n` connections that stay open, the processes whose CPU
/// ([`cpu::pids_seconds`]) is the server's share of the pool's work. With
/// the `postgres` feature.
#[cfg(feature = "postgres")]
pub async fn pg_backends(
    pool: &sqlx::PgPool,
    n: usize,
) -> Result<Vec<u32>, Box<dyn std::error::Error + Send + Sync>> {
    let mut held = Vec::with_capacity(n);
    let mut pids = Vec::with_capacity(n);
    for _ in 0..n {
        let mut conn = pool.acquire().await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        pids.push(u32::try_from(pid)?);
        held.push(conn);
    }
    Ok(pids)
}

/// The mean bytes of a row of `table` (`pg_column_size` of the whole
/// row; 0 when it is empty): what the benchmarks print to show that a
/// limit's rows are as wide as idem's. `table` is the program's own name,
/// not user input. With the `postgres` feature.
#[cfg(feature = "postgres")]
pub async fn row_bytes(pool: &sqlx::PgPool, table: &str) -> Result<f64, sqlx::Error> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COALESCE(avg(pg_column_size(t.*)), 0)::float8 FROM {table} t"
    )))
    .fetch_one(pool)
    .await
}

/// The median of benchmark samples (the upper middle one for an even count).
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A benchmark setting from the environment, or `default`.
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The statements sqlx sends, for the benchmarks' "statements per message"
/// lines: a `tracing` subscriber that keeps each `sqlx::query` event's
/// summary (the statement's first words).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
/// let _guard = tracing::subscriber::set_default(idem_examples::statement_log::StatementLog);
/// let seen = idem_examples::statement_log::statements_of(async {
///     sqlx::query("SELECT 1").execute(&pool).await.map(drop)
/// })
/// .await;
/// println!("{} statements: {}", seen.len(), seen.join(", "));
/// # Ok(()) }
/// ```
pub mod statement_log {
    use std::sync::Mutex;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// The subscriber; install it with `tracing::subscriber::set_default`.
    #[derive(Debug)]
    pub struct StatementLog;

    struct Summary(Option<String>);

    impl Visit for Summary {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "summary" {
                self.0 = Some(value.to_owned());
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "summary" {
                self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
            }
        }
    }

    impl Subscriber for StatementLog {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            meta.target() == "sqlx::query"
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, event: &Event<'_>) {
            if event.metadata().target() == "sqlx::query" {
                let mut summary = Summary(None);
                event.record(&mut summary);
                if let Ok(mut seen) = SEEN.lock() {
                    seen.push(summary.0.unwrap_or_default());
                }
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    /// The statements sqlx logged while `call` ran, in order. sqlx's MySQL
    /// driver logs the `BEGIN` of a transaction; its Postgres driver does
    /// not (see [`with_begin`]).
    pub async fn statements_of<F: std::future::Future>(call: F) -> Vec<String> {
        if let Ok(mut seen) = SEEN.lock() {
            seen.clear();
        }
        call.await;
        SEEN.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `seen` with the `BEGIN` that a driver sent outside its log: unless it
    /// starts with one, or with the MySQL store's own opening of a
    /// transaction-mode call's transaction (`SET autocommit = 0, ...; START
    /// TRANSACTION`, one message).
    pub fn with_begin(mut seen: Vec<String>) -> Vec<String> {
        let opens = |s: &String| s.starts_with("BEGIN") || s.starts_with("SET autocommit = 0");
        if !seen.first().is_some_and(opens) {
            seen.insert(0, "BEGIN".to_owned());
        }
        seen
    }
}

/// Runs `tasks` consumers at once for `secs` seconds and returns the
/// messages they handled per second. `consumer(t, round)` is consumer `t`:
/// it sets itself up, then handles messages while `round.going()`, calling
/// `round.handled()` after each. A call that fails panics in the consumer.
///
/// ```no_run
/// # async fn demo() {
/// let rate = idem_examples::messages_per_second(3.0, 8, |t, round| async move {
///     while round.going() {
///         let _message = t; // handle one message
///         round.handled();
///     }
/// })
/// .await;
/// println!("{rate:.0} msg/s");
/// # }
/// ```
pub async fn messages_per_second<F, Fut>(secs: f64, tasks: usize, consumer: F) -> f64
where
    F: Fn(usize, Round) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let round = Round::default();
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(consumer(t, round.clone())))
        .collect();
    let start = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
    round.stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("consumer task");
    }
    round.done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// One timed round of [`messages_per_second`], as its consumers see it.
#[derive(Debug, Clone, Default)]
pub struct Round {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
}

impl Round {
    /// Whether the round is still on.
    pub fn going(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Counts one message handled.
    pub fn handled(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` messages handled (a batch).
    pub fn handled_many(&self, n: usize) {
        self.done.fetch_add(n as u64, Ordering::Relaxed);
    }
}
