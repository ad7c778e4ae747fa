//! Which statement the MySQL/MariaDB store claims a key with: the two
//! candidates, measured against each other in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --features mysql --example bench_mysql_claim
//! MYSQL_URL=mysql://... SECS=3 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --features mysql --example bench_mysql_claim
//! ```
//!
//! * `ignore`: `INSERT IGNORE` of the claim row. It affects one row when it
//!   took the key and none when a row stands; only then does the claim read
//!   that row (and, were it expired, take it over with a conditional
//!   `UPDATE`).
//! * `upsert`: `INSERT ... ON DUPLICATE KEY UPDATE col = IF(expires_at <=
//!   VALUES(created_at), VALUES(col), col)`, which takes an absent or expired
//!   key in one statement. sqlx's driver always sets `CLIENT_FOUND_ROWS`, so
//!   a live row left as it was counts 1 affected row, as a fresh insert does
//!   (the counts are printed first): the statement cannot say whether it took
//!   the key, and the claim must read the row back (its token) every time.
//!
//! Both run on the store's own table (`MySqlStore::migrate`). Each round runs
//! both candidates for `SECS` seconds with `TASKS` concurrent clients on a
//! pool of as many connections, first on fresh keys, then on keys that have a
//! live completed record (duplicates), candidates interleaved round by round;
//! the table is emptied before each run. Each round ends with what the
//! machine did meanwhile (busy, idle and steal shares from `/proc/stat`,
//! marked `STOLEN` above 5 % steal; see `examples/src/cpu.rs`). It prints
//! the median claims per second of each and `ignore/upsert`, over all
//! rounds and over the unmarked ones.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::cpu::{Rounds, Watch};
use idem_examples::{env, messages_per_second};
use idem_runtime::MySqlStore;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Row};

const LIVE_UNTIL: i64 = i64::MAX / 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    Ignore,
    Upsert,
}

#[derive(Debug, Clone)]
struct Sql {
    ignore: String,
    take_over: String,
    upsert: String,
    read: String,
}

/// The columns the claims and the prepared records write; the table's
/// others keep their defaults.
const COLUMNS: &str =
    "handler, `key`, status, token, outcome, attempts, created_at, updated_at, expires_at";

impl Sql {
    fn new(t: &str) -> Sql {
        let columns = COLUMNS;
        let take = "expires_at <= VALUES(created_at)";
        Sql {
            ignore: format!(
                "INSERT IGNORE INTO {t} ({columns}) VALUES (?, ?, 'in_progress', ?, NULL, 1, ?, ?, ?)"
            ),
            take_over: format!(
                "UPDATE {t} SET attempts = IF(status = 'in_progress', attempts + 1, 1),
                    status = 'in_progress', token = ?, outcome = NULL,
                    created_at = ?, updated_at = ?, expires_at = ?
                 WHERE handler = ? AND `key` = ? AND expires_at <= ?"
            ),
            upsert: format!(
                "INSERT INTO {t} ({columns}) VALUES (?, ?, 'in_progress', ?, NULL, 1, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE
                    attempts = IF({take}, IF(status = 'in_progress', attempts + 1, 1), attempts),
                    status = IF({take}, VALUES(status), status),
                    token = IF({take}, VALUES(token), token),
                    outcome = IF({take}, VALUES(outcome), outcome),
                    updated_at = IF({take}, VALUES(updated_at), updated_at),
                    created_at = IF({take}, VALUES(created_at), created_at),
                    expires_at = IF(expires_at <= VALUES(updated_at), VALUES(expires_at), expires_at)"
            ),
            read: format!(
                "SELECT status, token, outcome, expires_at FROM {t} WHERE handler = ? AND `key` = ?"
            ),
        }
    }
}

/// Claims `key` with a fresh token; `true` when it took the key.
async fn claim(pool: &MySqlPool, sql: &Sql, how: Candidate, key: &str, now: i64) -> bool {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let until = now + 30_000;
    let insert = match how {
        Candidate::Ignore => &sql.ignore,
        Candidate::Upsert => &sql.upsert,
    };
    let n = sqlx::query(AssertSqlSafe(insert.as_str()))
        .bind("bench")
        .bind(key)
        .bind(&token)
        .bind(now)
        .bind(now)
        .bind(until)
        .execute(pool)
        .await
        .expect("claim")
        .rows_affected();
    if how == Candidate::Ignore && n == 1 {
        return true;
    }
    let row = sqlx::query(AssertSqlSafe(sql.read.as_str()))
        .bind("bench")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("read the row");
    let (held_by, expires_at): (Option<String>, i64) = (row.get("token"), row.get("expires_at"));
    match how {
        Candidate::Upsert => held_by.as_deref() == Some(token.as_str()),
        Candidate::Ignore if expires_at > now => false,
        Candidate::Ignore => {
            sqlx::query(AssertSqlSafe(sql.take_over.as_str()))
                .bind(&token)
                .bind(now)
                .bind(now)
                .bind(until)
                .bind("bench")
                .bind(key)
                .bind(now)
                .execute(pool)
                .await
                .expect("take over")
                .rows_affected()
                == 1
        }
    }
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis(),
    )
    .expect("in range")
}

/// Claims per second of `how`; fresh keys from `next`, or, with `dups`, the
/// `dups` keys that have a live record.
async fn run(
    pool: &MySqlPool,
    sql: &Arc<Sql>,
    how: Candidate,
    dups: Option<u64>,
    secs: f64,
    tasks: usize,
    next: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |_, round| {
        let (pool, sql, next) = (pool.clone(), sql.clone(), next.clone());
        async move {
            while round.going() {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let key = match dups {
                    Some(d) => format!("dup-{}", n % d),
                    None => format!("k-{n}"),
                };
                let took = claim(&pool, &sql, how, &key, now_ms()).await;
                assert_eq!(took, dups.is_none(), "{how:?} on {key}");
                round.handled();
            }
        }
    })
    .await
}

/// Rows affected by `sql` for a row absent, expired, and live.
async fn affected(pool: &MySqlPool, t: &str, sql: &str) -> [u64; 3] {
    let mut out = [0; 3];
    for (i, (key, expires_at)) in [
        ("absent", None),
        ("expired", Some(1)),
        ("live", Some(LIVE_UNTIL)),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("probe-{key}");
        if let Some(expires_at) = expires_at {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {t} ({COLUMNS}) VALUES ('bench', ?, 'completed', NULL, '1', 1, 1, 1, ?)"
            )))
            .bind(&key)
            .bind(expires_at)
            .execute(pool)
            .await
            .expect("probe row");
        }
        let now = now_ms();
        out[i] = sqlx::query(AssertSqlSafe(sql))
            .bind("bench")
            .bind(&key)
            .bind("token")
            .bind(now)
            .bind(now)
            .bind(now + 1)
            .execute(pool)
            .await
            .expect("probe")
            .rows_affected();
    }
    out
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let pool = MySqlPoolOptions::new()
        .max_connections(u32::try_from(tasks)?)
        .connect(&url)
        .await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await?;
    let t = format!("idem_bench_claim_{}", std::process::id());
    // The store's own table.
    MySqlStore::from_pool(pool.clone())
        .with_table(&t)?
        .migrate()
        .await?;
    let sql = Arc::new(Sql::new(&t));
    let result = measure(&pool, &t, &sql, &version, secs, rounds, tasks).await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&pool)
        .await?;
    result
}

async fn measure(
    pool: &MySqlPool,
    t: &str,
    sql: &Arc<Sql>,
    version: &str,
    secs: f64,
    rounds: usize,
    tasks: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("server {version}; rows affected through sqlx (absent, expired, live):");
    println!(
        "  INSERT IGNORE            {:?}",
        affected(pool, t, &sql.ignore).await
    );
    sqlx::raw_sql(AssertSqlSafe(format!("TRUNCATE TABLE {t}")))
        .execute(pool)
        .await?;
    println!(
        "  ON DUPLICATE KEY UPDATE  {:?}",
        affected(pool, t, &sql.upsert).await
    );

    let dups = 10_000u64; // the live records the duplicate runs claim
    let next = Arc::new(AtomicU64::new(0));
    let mut samples: [[Vec<f64>; 2]; 2] = Default::default();
    let mut marks = Rounds::default();
    for round in 1..=rounds {
        let watch = Watch::start()?;
        for (w, dup) in [None, Some(dups)].into_iter().enumerate() {
            for (c, how) in [Candidate::Ignore, Candidate::Upsert]
                .into_iter()
                .enumerate()
            {
                sqlx::raw_sql(AssertSqlSafe(format!("TRUNCATE TABLE {t}")))
                    .execute(pool)
                    .await?;
                if dup.is_some() {
                    // 10,000 live records, `dup-0` to `dup-9999`.
                    let digit =
                        "(SELECT 0 AS i UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
                        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
                        UNION ALL SELECT 8 UNION ALL SELECT 9)";
                    sqlx::raw_sql(AssertSqlSafe(format!(
                        "INSERT INTO {t} ({COLUMNS})
                         SELECT 'bench', CONCAT('dup-', a.i + 10 * b.i + 100 * c.i + 1000 * d.i),
                                'completed', NULL, '1', 1, 1, 1, {LIVE_UNTIL}
                         FROM {digit} a, {digit} b, {digit} c, {digit} d"
                    )))
                    .execute(pool)
                    .await?;
                }
                let rate = run(pool, sql, how, dup, secs, tasks, &next).await;
                let what = if dup.is_some() { "duplicate" } else { "fresh" };
                println!("round {round}: {what:9} {how:?}: {rate:.0} claims/s");
                samples[w][c].push(rate);
            }
        }
        println!("round {round}: {}", marks.push(watch.stop()?));
    }
    println!("{}", marks.summary());
    for (w, what) in ["fresh keys", "duplicates"].into_iter().enumerate() {
        let ignore = marks.medians(&samples[w][0]);
        let upsert = marks.medians(&samples[w][1]);
        println!(
            "{what}: ignore {ignore}/s, upsert {upsert}/s, ignore/upsert: {:.3}",
            ignore.ratio(&upsert)
        );
    }
    Ok(())
}
