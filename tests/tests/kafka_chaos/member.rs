//! A member: this test binary re-run as a child process, consuming until
//! told to stop, and its log.

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::PgStore;
use idem_runtime::consume::{CancellationToken, Policy, kafka};
use idem_tests::brokers::{TANSU_ONE_RECORD_A_BATCH, kafka_brokers};
use idem_tests::pg_url;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tracing::level_filters::LevelFilter;

use super::SESSION_TIMEOUT;
use crate::chaos::{Applied, apply};

/// A member of the group: runs until it is killed, or until its stdin
/// closes, which shuts it down gracefully; then prints its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the chaos tests as a child process"]
async fn kafka_chaos_member() {
    let Ok(topic) = std::env::var("IDEM_KCHAOS_TOPIC") else {
        return;
    };
    let _ = tracing::subscriber::set_global_default(Log::from_env());
    let group = std::env::var("IDEM_KCHAOS_GROUP").expect("the group");
    let dedup = std::env::var("IDEM_KCHAOS_DEDUP").expect("the dedup table");
    // The dedup table's name is the run's own: its connections, and no
    // one else's, are the ones the run terminates.
    let options = PgConnectOptions::from_str(&pg_url())
        .expect("DATABASE_URL")
        .application_name(&dedup);
    let connect = || {
        PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
    };
    let pool = idem_runtime::consume::until_ok("postgres", connect, &CancellationToken::new())
        .await
        .expect("a pool");
    let store = PgStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("table");
    let mut consumer = kafka::Consumer::new(kafka_brokers(), group, topic)
        .policy(Policy {
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            max_failures: 1_000,
            concurrency: 8,
            max_store_delay: Duration::from_secs(1),
            ..Policy::default()
        })
        .set(
            "session.timeout.ms",
            SESSION_TIMEOUT.as_millis().to_string(),
        )
        .set("heartbeat.interval.ms", "1000")
        // Retries one record a batch, as the producer publishes (see
        // `Run::produce`).
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1);
    if std::env::var("IDEM_KCHAOS_OFFSETS_IN_DB").is_ok() {
        consumer = consumer.offsets_in(&store);
    }
    let handler = move |msg: Applied| {
        let (store, pool) = (store.clone(), pool.clone());
        async move {
            let result = apply(&store, &msg).await;
            // What this call came to, for the run's counts (lost when the
            // process dies first: the counts are a floor).
            let kind = match &result {
                Ok(o) if o.is_duplicate() => "duplicate",
                Ok(_) => "executed",
                Err(e) => e.kind(),
            };
            let sql = format!("INSERT INTO {}_seen (kind) VALUES ($1)", msg.table);
            for _ in 0..3 {
                let done = sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(kind)
                    .execute(&pool)
                    .await;
                if done.is_ok() {
                    break;
                }
            }
            result
        }
    };
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
        stop.cancel();
    });
    println!("READY");
    let report = consumer
        .run(handler, stopped)
        .await
        .expect("the consumer ran");
    println!(
        "REPORT {} {} {} {} {} {}",
        report.acked,
        report.duplicates,
        report.retried,
        report.dead_lettered,
        report.rebalances,
        report.alerts
    );
}

/// The members' log: assignments and warnings go to stdout for the run's
/// counts; what `RUST_LOG` enables goes to stderr.
struct Log {
    /// `RUST_LOG`'s directives: a target prefix (none for every target)
    /// and its level.
    directives: Vec<(Option<String>, LevelFilter)>,
}

impl Log {
    fn from_env() -> Log {
        let spec = std::env::var("RUST_LOG").unwrap_or_default();
        let directives = spec
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .filter_map(|d| match d.split_once('=') {
                Some((target, level)) => Some((
                    Some(target.trim().to_owned()),
                    LevelFilter::from_str(level.trim()).ok()?,
                )),
                None => Some((None, LevelFilter::from_str(d.trim()).ok()?)),
            })
            .collect();
        Log { directives }
    }

    /// Whether `RUST_LOG` asks for `meta`: the longest target prefix that
    /// matches decides.
    fn wanted(&self, meta: &tracing::Metadata<'_>) -> bool {
        self.directives
            .iter()
            .filter(|(t, _)| t.as_deref().is_none_or(|t| meta.target().starts_with(t)))
            .max_by_key(|(t, _)| t.as_deref().map_or(0, str::len))
            .is_some_and(|(_, level)| meta.level() <= level)
    }

    fn ours(meta: &tracing::Metadata<'_>) -> bool {
        meta.target().starts_with("idem_runtime")
    }
}

/// An event's message and its other fields.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl tracing::Subscriber for Log {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        Self::ours(meta) || self.wanted(meta)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if Self::ours(meta) {
            if fields.message == "partitions assigned" {
                // `partitions=t/0,t/1`: how many.
                let list = fields.rest.split_once('=').map_or("", |(_, l)| l.trim());
                println!(
                    "ASSIGNED {}",
                    list.split(',').filter(|p| !p.is_empty()).count()
                );
            } else if fields.message == "partitions revoked" {
                println!("REVOKED");
            } else if *meta.level() <= tracing::Level::WARN {
                println!("EVENT {} {}", meta.level(), fields.message);
            }
        }
        if self.wanted(meta) {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() % 100_000_000);
            eprintln!(
                "{ms} [member {}] {} {}: {}{}",
                std::process::id(),
                meta.level(),
                meta.target(),
                fields.message,
                fields.rest
            );
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
