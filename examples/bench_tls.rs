//! What TLS costs a transaction-mode handler on PostgreSQL, as a ratio
//! measured in one run: the same handler on the same server
//! (`DATABASE_URL`, which must offer TLS: Debian's PostgreSQL has
//! `ssl = on` with its snakeoil certificate), through a pool in plain text
//! (`sslmode=disable`) and a pool over TLS
//! ([`PgStore::connect_tls`](idem_runtime::PgStore::connect_tls), which
//! verifies; here without verification, since the snakeoil certificate
//! names no host: the handshakes are at connect, and what each message
//! pays, the encryption, is the same).
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres,tls --example bench_tls
//! SECS=5 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --features postgres,tls --example bench_tls
//! ```
//!
//! `TASKS` consumers call the handler (it deducts one unit of stock with an
//! `UPDATE` and records its outcome, as `bench_postgres` and
//! `bench_outbox`); each variant runs `SECS` a round, interleaved (their
//! order alternates), `ROUNDS` rounds; the ratio is of the median
//! throughputs. Each round prints what the machine did meanwhile (busy,
//! idle, steal, from `/proc/stat`).

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use idem_examples::cpu::{Rounds, Watch};
use idem_examples::{env, median, messages_per_second};
use idem_runtime::tls::Tls;
use idem_runtime::{BoxError, PgStore, PgTx, idempotent};
use serde::Deserialize;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

#[derive(Debug, Deserialize)]
struct Deduct {
    message_id: i64,
    sku: i64,
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_tls"
)]
async fn deduct(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, BoxError> {
    sqlx::query("UPDATE bench_tls_inventory SET stock = stock - 1 WHERE sku = $1")
        .bind(msg.sku)
        .execute(&mut **tx)
        .await?;
    Ok(msg.sku)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let options = PgConnectOptions::from_str(&url)?;
    let pool = |options: PgConnectOptions| {
        PgPoolOptions::new()
            .max_connections(tasks as u32 + 2)
            .min_connections(tasks as u32)
            .connect_with(options)
    };
    let plain = pool(options.clone().ssl_mode(PgSslMode::Disable)).await?;
    let tls = Tls::new().danger_accept_invalid_certs();
    let encrypted = pool(tls.postgres(options)?).await?;
    let tls_on: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&encrypted)
            .await?;
    let plain_on: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&plain)
            .await?;
    assert!(tls_on && !plain_on, "the server must offer TLS (ssl = on)");
    for sql in [
        "DROP TABLE IF EXISTS bench_tls_inventory, bench_tls_keys",
        "CREATE TABLE bench_tls_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL)",
        "INSERT INTO bench_tls_inventory SELECT g, 1000000000 FROM generate_series(1, 10000) g",
    ] {
        sqlx::query(AssertSqlSafe(sql)).execute(&plain).await?;
    }
    let stores = [
        PgStore::from_pool(plain).with_table("bench_tls_keys")?,
        PgStore::from_pool(encrypted).with_table("bench_tls_keys")?,
    ];
    stores[0].migrate().await?;
    let next_id = Arc::new(AtomicI64::new(0));

    println!("{tasks} consumers, {secs} s a variant, {rounds} rounds");
    let (mut rates, mut watched) = ([Vec::new(), Vec::new()], Rounds::default());
    for round in 0..rounds {
        let watch = Watch::start()?;
        let mut this = [0.0; 2];
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for variant in order {
            let (store, next_id) = (stores[variant].clone(), Arc::clone(&next_id));
            this[variant] = messages_per_second(secs, tasks, move |_, r| {
                let (store, next_id) = (store.clone(), Arc::clone(&next_id));
                async move {
                    while r.going() {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        let msg = Deduct {
                            message_id: id,
                            sku: 1 + id % 10_000,
                        };
                        deduct(&store, &msg).await.expect("a call").into_inner();
                        r.handled();
                    }
                }
            })
            .await;
        }
        let cpu = watched.push(watch.stop()?);
        println!(
            "  round {}: plain {:.0}/s, TLS {:.0}/s, ratio {:.3} ({cpu})",
            round + 1,
            this[0],
            this[1],
            this[1] / this[0]
        );
        rates[0].push(this[0]);
        rates[1].push(this[1]);
    }
    let (plain, tls) = (median(rates[0].clone()), median(rates[1].clone()));
    println!(
        "medians: plain {plain:.0}/s, TLS {tls:.0}/s: TLS / plain = {:.3} ({})",
        tls / plain,
        watched.summary()
    );
    Ok(())
}
