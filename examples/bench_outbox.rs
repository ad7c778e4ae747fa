//! What the outbox costs, as ratios measured in one run: PostgreSQL
//! (`DATABASE_URL`) and NATS JetStream (`NATS_URL`) on loopback.
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres,nats --example bench_outbox
//! SECS=5 ROUNDS=5 TASKS=8 ROWS=5000 cargo run --release -p idem-examples --features postgres,nats --example bench_outbox
//! ```
//!
//! * **Staging**: `TASKS` consumers call a transaction-mode handler that
//!   deducts one unit of stock (`UPDATE`, as `bench_postgres`) and records
//!   its outcome; one variant stages one message (a 60-byte JSON payload,
//!   with a key) in the same transaction, the other stages none. Each runs
//!   `SECS` a round, interleaved, `ROUNDS` rounds; the ratio is of the
//!   median throughputs.
//! * **Relaying**: `ROWS` rows staged in as many lanes are published by a
//!   running relay (4 passes of 16 at once: 64 publishes in flight, each
//!   row deleted once JetStream acknowledged it), against the client
//!   publishing as many messages itself, 64 at a time with their
//!   acknowledgements awaited and the same `Nats-Msg-Id` header: the
//!   relay's publish rate against the client's raw rate, per round,
//!   interleaved. The same relay to a destination that takes each message
//!   at once gives what the database's side of relaying (take with a lock,
//!   delete, commit) allows on its own.
//! * **Latency**: with a relay running, messages are staged and committed
//!   (`Outbox::commit`, which wakes the relay) at 200 a second; a core
//!   subscription on the subject takes them. The time from each commit to
//!   its arrival: p50, p90, p99.
//!
//! The relaying rounds start from a vacuumed outbox table (a running system
//! has autovacuum for that). Each round prints what the machine did meanwhile (busy, idle, steal,
//! from `/proc/stat`). The last line holds the two ratios.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem_examples::cpu::{Rounds, Watch};
use idem_examples::{env, median, messages_per_second};
use idem_runtime::outbox::{Destination, Message, NatsDestination, Outbox, Outgoing, Relay};
use idem_runtime::{BoxError, PgStore, PgTx, idempotent};
use serde::Deserialize;
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Deserialize)]
struct Deduct {
    message_id: i64,
    sku: i64,
}

async fn deduct(conn: &mut sqlx::PgConnection, sku: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE bench_outbox_inventory SET stock = stock - 1 WHERE sku = $1")
        .bind(sku)
        .execute(conn)
        .await?;
    Ok(())
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_outbox_none"
)]
async fn stages_none(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, BoxError> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_outbox_one"
)]
async fn stages_one(tx: &mut PgTx<'_>, msg: &Deduct, outbox: &mut Outbox) -> Result<i64, BoxError> {
    deduct(tx, msg.sku).await?;
    let payload = format!(
        r#"{{"message_id":{},"sku":{},"left":"some"}}"#,
        msg.message_id, msg.sku
    );
    outbox
        .stage(
            tx,
            Message::new("bench.stock", payload).key(msg.sku.to_string()),
        )
        .await?;
    Ok(msg.sku)
}

/// The `q`-quantile of sorted `samples`.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// Stages `rows` messages for `subject`, each in a lane of its own, in
/// transactions of 100.
async fn stage_rows(
    store: &PgStore,
    subject: &str,
    rows: usize,
    round: usize,
) -> Result<(), BoxError> {
    for chunk in 0..rows.div_ceil(100) {
        let mut tx = store.pool().begin().await?;
        let mut outbox = store.outbox("bench_outbox_producer", &format!("{round}-{chunk}"));
        for i in 0..100.min(rows - chunk * 100) {
            let n = chunk * 100 + i;
            let m = Message::new(
                subject,
                format!(r#"{{"n":{n},"round":{round},"padding":"........"}}"#),
            )
            .lane(n.to_string());
            outbox.stage(&mut tx, m).await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let rows: usize = env("ROWS", 5000);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());

    let pool = PgPoolOptions::new()
        .max_connections(tasks as u32 + 4)
        .connect(&url)
        .await?;
    for sql in [
        "DROP TABLE IF EXISTS bench_outbox_inventory, bench_outbox_keys, bench_outbox_keys_outbox",
        "CREATE TABLE bench_outbox_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL)",
        "INSERT INTO bench_outbox_inventory SELECT g, 1000000000 FROM generate_series(1, 10000) g",
    ] {
        sqlx::query(AssertSqlSafe(sql)).execute(&pool).await?;
    }
    let store = PgStore::from_pool(pool.clone()).with_table("bench_outbox_keys")?;
    store.migrate().await?;
    let next_id = Arc::new(std::sync::atomic::AtomicI64::new(0));

    // Staging.
    println!("staging: {tasks} consumers, {secs} s a variant, {rounds} rounds");
    let (mut none_rates, mut one_rates, mut staging_rounds) =
        (Vec::new(), Vec::new(), Rounds::default());
    for round in 0..rounds {
        let watch = Watch::start()?;
        let mut rates = [0.0; 2];
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for variant in order {
            sqlx::query("TRUNCATE bench_outbox_keys_outbox")
                .execute(&pool)
                .await?;
            let (store, next_id) = (store.clone(), Arc::clone(&next_id));
            rates[variant] = messages_per_second(secs, tasks, move |_, r| {
                let (store, next_id) = (store.clone(), Arc::clone(&next_id));
                async move {
                    while r.going() {
                        let id = next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let msg = Deduct {
                            message_id: id,
                            sku: 1 + id % 10_000,
                        };
                        let done = if variant == 0 {
                            stages_none(&store, &msg).await.map(drop)
                        } else {
                            stages_one(&store, &msg).await.map(drop)
                        };
                        done.expect("a call");
                        r.handled();
                    }
                }
            })
            .await;
        }
        let cpu = staging_rounds.push(watch.stop()?);
        println!(
            "  round {}: none {:.0}/s, one {:.0}/s, ratio {:.3} ({cpu})",
            round + 1,
            rates[0],
            rates[1],
            rates[1] / rates[0]
        );
        none_rates.push(rates[0]);
        one_rates.push(rates[1]);
    }
    let staging = median(one_rates.clone()) / median(none_rates.clone());
    println!(
        "  medians: none {:.0}/s, one {:.0}/s: staging one message / none = {staging:.3} ({})",
        median(none_rates),
        median(one_rates),
        staging_rounds.summary()
    );

    // Relaying.
    let client = async_nats::connect(&nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let subject = format!("bench.outbox.{run}");
    let stream_name = format!("BENCH_OUTBOX_{run}");
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: stream_name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await?;
    sqlx::query("TRUNCATE bench_outbox_keys_outbox")
        .execute(&pool)
        .await?;
    println!("relaying: {rows} rows a round, 64 at a time, against the client's raw publish");
    let (mut relay_rates, mut raw_rates, mut relay_rounds) =
        (Vec::new(), Vec::new(), Rounds::default());
    let mut db_rates = Vec::new();
    for round in 0..rounds {
        let watch = Watch::start()?;
        let relay_rate = relayed(
            &pool,
            &store,
            &subject,
            rows,
            round,
            Some(NatsDestination::from_client(client.clone())),
        )
        .await?;
        // The same relay to a destination that takes each message at once:
        // what the database's side of relaying allows.
        let db_rate = relayed(&pool, &store, &subject, rows, round, None).await?;
        db_rates.push(db_rate);
        let began = Instant::now();
        for chunk in 0..rows.div_ceil(64) {
            let sends = (chunk * 64..(chunk * 64 + 64).min(rows)).map(|n| {
                let js = js.clone();
                let subject = subject.clone();
                let id = format!("raw-{run}-{round}-{n}");
                async move {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    let payload = format!(r#"{{"n":{n},"round":{round},"padding":"........"}}"#);
                    js.publish_with_headers(subject, headers, payload.into())
                        .await?
                        .await?;
                    Ok::<_, BoxError>(())
                }
            });
            for done in futures_util::future::join_all(sends).await {
                done?;
            }
        }
        let raw_rate = rows as f64 / began.elapsed().as_secs_f64();
        let cpu = relay_rounds.push(watch.stop()?);
        println!(
            "  round {}: relay {relay_rate:.0}/s, raw {raw_rate:.0}/s, ratio {:.3}; relay to nowhere {:.0}/s ({cpu})",
            round + 1,
            relay_rate / raw_rate,
            db_rates[round]
        );
        relay_rates.push(relay_rate);
        raw_rates.push(raw_rate);
    }
    let relaying = median(relay_rates.clone()) / median(raw_rates.clone());
    let db_side = median(relay_rates.clone()) / median(db_rates.clone());
    println!(
        "  medians: relay {:.0}/s, raw {:.0}/s, relay to nowhere {:.0}/s: relay / raw = {relaying:.3}, relay / relay to nowhere = {db_side:.3} ({})",
        median(relay_rates),
        median(raw_rates),
        median(db_rates),
        relay_rounds.summary()
    );

    // Latency.
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut sub = client.subscribe(subject.clone()).await?;
    let listen = {
        let (committed, latencies) = (Arc::clone(&committed), Arc::clone(&latencies));
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let at = Instant::now();
                let Some(id) = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) else {
                    continue;
                };
                if let Some(start) = committed.lock().unwrap().remove(id.as_str()) {
                    latencies.lock().unwrap().push(at - start);
                }
            }
        })
    };
    let stop = tokio_util_like_stop();
    let running = tokio::spawn(
        Relay::new(
            store.outbox_table(),
            NatsDestination::from_client(client.clone()),
        )
        .run(stop.1),
    );
    let total = (200.0 * secs * 2.0) as usize;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for n in 0..total {
        tick.tick().await;
        let mut tx = store.pool().begin().await?;
        let mut outbox = store.outbox("bench_outbox_latency", &n.to_string());
        let id = outbox
            .stage(
                &mut tx,
                Message::new(subject.as_str(), format!(r#"{{"n":{n}}}"#)),
            )
            .await?;
        // stamped just before the commit, which wakes the relay
        committed
            .lock()
            .unwrap()
            .insert(id.to_string(), Instant::now());
        outbox.commit(tx).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.0.send(());
    let _ = running.await;
    listen.abort();
    let mut seen = latencies.lock().unwrap().clone();
    seen.sort();
    if seen.is_empty() {
        return Err("no message arrived".into());
    }
    println!(
        "latency, commit to arrival, {} of {total} messages at 200/s: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        seen.len(),
        quantile(&seen, 0.5),
        quantile(&seen, 0.9),
        quantile(&seen, 0.99),
        seen[seen.len() - 1]
    );

    let _ = js.delete_stream(&stream_name).await;
    sqlx::query(
        "DROP TABLE IF EXISTS bench_outbox_inventory, bench_outbox_keys, bench_outbox_keys_outbox",
    )
    .execute(&pool)
    .await?;
    println!(
        "outbox ratios: staging one / none = {staging:.3}, relay / raw publish = {relaying:.3}, relay / relay to nowhere = {db_side:.3}"
    );
    Ok(())
}

/// A destination that counts what it published, and says when `rows`
/// were: to NATS, or (`to: None`) nowhere, taking each message at once.
struct Counted {
    to: Option<NatsDestination>,
    sent: Arc<std::sync::atomic::AtomicUsize>,
    all: Arc<tokio::sync::Notify>,
    rows: usize,
}

impl Destination for Counted {
    fn kind(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        if let Some(to) = &self.to {
            to.publish(message).await?;
        }
        if self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == self.rows {
            self.all.notify_one();
        }
        Ok(())
    }
}

/// Stages `rows` rows in a vacuumed outbox table (the deletes of the rounds
/// before would otherwise slow the relays' scans more each round), and
/// relays them to `to` (nowhere: `None`) with 4 passes of 16: the rate.
async fn relayed(
    pool: &sqlx::PgPool,
    store: &PgStore,
    subject: &str,
    rows: usize,
    round: usize,
    to: Option<NatsDestination>,
) -> Result<f64, BoxError> {
    sqlx::query("VACUUM bench_outbox_keys_outbox")
        .execute(pool)
        .await?;
    stage_rows(store, subject, rows, round).await?;
    let counted = Counted {
        to,
        sent: Arc::default(),
        all: Arc::default(),
        rows,
    };
    let all = Arc::clone(&counted.all);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let began = Instant::now();
    let relay = tokio::spawn(
        Relay::new(store.outbox_table(), counted)
            .with_batch(16)
            .with_passes(4)
            .run(async {
                let _ = stopped.await;
            }),
    );
    tokio::time::timeout(Duration::from_secs(120), all.notified()).await?;
    let rate = rows as f64 / began.elapsed().as_secs_f64();
    let _ = stop.send(());
    relay.await?;
    if store.outbox_table().backlog().await?.rows != 0 {
        return Err("the relay left rows behind".into());
    }
    Ok(rate)
}

/// A stop signal: the sender, and the future the relay runs until.
fn tokio_util_like_stop() -> (
    tokio::sync::oneshot::Sender<()>,
    impl std::future::Future<Output = ()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}
