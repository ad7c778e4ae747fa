//! Messages per second through an idempotent Redis handler against raw
//! round trips at the same concurrency, interleaved in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --features redis --example bench_redis
//! REDIS_URL=redis://... SECS=3 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --features redis --example bench_redis
//! ```
//!
//! Every variant uses one multiplexed connection and `TASKS` concurrent
//! consumers, every message fresh. Each round starts without the keys of
//! the rounds before (deleted between rounds, outside the timing), so no
//! variant pays for a keyspace another grew. The variants:
//!
//! * `raw`: the bare dedup step many consumers write by hand (`SET key 1
//!   NX PX ttl`, one round trip, no recorded outcome, no lease);
//! * `two`: that, then `SET key <outcome> XX PX ttl`: the two round trips
//!   a recorded outcome takes, without a fencing token (a consumer whose
//!   lease ran out would overwrite the next one's claim);
//! * `fenced`: `SET key <token> NX PX ttl`, then a function of this
//!   benchmark's own that writes the outcome only if the key still holds
//!   the token (Redis 7.0 has no compare-and-set command): the least a
//!   lease with a fencing token and a recorded outcome costs, the limit of
//!   idem's lease mode;
//! * `idem`: a lease-mode handler with an empty body (claim with a fencing
//!   token, then record the outcome).
//!
//! Each round (all variants) prints its rates and what the machine did
//! meanwhile: busy, idle and steal shares from `/proc/stat`, marked
//! `STOLEN` above 5 % steal (see `examples/src/cpu.rs`); the medians are
//! given over all rounds and over the unmarked ones.
//!
//! Where the time goes, per message over the timed rounds of each variant:
//! the server's CPU (`INFO cpu`, user + system of redis-server), the
//! server's time per command (`INFO commandstats`: calls and µs per
//! message; a script's µs include those of the commands it runs, which are
//! listed as well), and this process's CPU (user + system, from
//! `/proc/self/stat`, Linux only). Then the commands one fresh message and
//! one duplicate send and the scripts run, from `MONITOR`, and the ratio,
//! last: `idem/raw: <ratio>`. Other clients of the same Redis add to the
//! server's figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::cpu::{Rounds, Watch, load_average, process_seconds};
use idem_examples::{env, messages_per_second};
use idem_runtime::{RedisStore, idempotent};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "10m", store = "redis", name = "bench_redis")]
async fn handle(msg: &Msg) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

/// What a round runs for each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Raw,
    Two,
    Fenced,
    Idem,
}

impl Variant {
    const ALL: [Variant; 4] = [Variant::Raw, Variant::Two, Variant::Fenced, Variant::Idem];

    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw",
            Variant::Two => "two",
            Variant::Fenced => "fenced",
            Variant::Idem => "idem",
        }
    }
}

/// The `fenced` variant's completion, a library and function named `name`
/// (this process's own, so that two runs on one server keep out of each
/// other's way): writes `ARGV[2]` for `ARGV[3]` ms if the key still holds
/// the token `ARGV[1]`; 1 written, 0 not.
fn fenced_library(name: &str) -> String {
    format!(
        "#!lua name={name}
redis.register_function('{name}', function(keys, argv)
  if redis.call('GET', keys[1]) ~= argv[1] then return 0 end
  redis.call('SET', keys[1], argv[2], 'PX', argv[3])
  return 1
end)"
    )
}

/// `SET key value <condition> PX 600000`: whether it was set.
async fn set(
    conn: &mut redis::aio::ConnectionManager,
    key: &str,
    value: &str,
    condition: &str,
) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg(condition)
        .arg("PX")
        .arg(600_000)
        .query_async(conn)
        .await
        .expect("SET");
    set.is_some()
}

// One argument each: what a round needs.
#[allow(clippy::too_many_arguments)]
async fn run(
    variant: Variant,
    fenced: &str,
    store: &RedisStore,
    raw: &redis::aio::ConnectionManager,
    prefix: &str,
    secs: f64,
    tasks: usize,
    next: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |_, round| {
        let (store, mut raw, next) = (store.clone(), raw.clone(), next.clone());
        let (prefix, fenced) = (prefix.to_owned(), fenced.to_owned());
        async move {
            while round.going() {
                let id = next.fetch_add(1, Ordering::Relaxed);
                // Only the raw variants make their key here: idem's is the
                // store's to make.
                let key = || format!("{prefix}:raw:{id}");
                match variant {
                    Variant::Idem => {
                        let outcome = handle(&store, &Msg { id }).await.expect("idem call");
                        assert!(outcome.is_executed());
                    }
                    Variant::Raw => assert!(set(&mut raw, &key(), "1", "NX").await),
                    Variant::Two => {
                        let key = key();
                        assert!(set(&mut raw, &key, "1", "NX").await);
                        assert!(set(&mut raw, &key, &id.to_string(), "XX").await);
                    }
                    Variant::Fenced => {
                        // A token per message, as a lease's.
                        let (key, token) = (key(), format!("{id:032x}"));
                        assert!(set(&mut raw, &key, &token, "NX").await);
                        let written: i64 = redis::cmd("FCALL")
                            .arg(&fenced)
                            .arg(1)
                            .arg(&key)
                            .arg(&token)
                            .arg(id)
                            .arg(600_000)
                            .query_async(&mut raw)
                            .await
                            .expect("FCALL of the fenced completion");
                        assert_eq!(written, 1);
                    }
                }
                round.handled();
            }
        }
    })
    .await
}

/// What the server and this process spent, read before and after a run.
#[derive(Debug, Clone, Default)]
struct Costs {
    /// redis-server's user + system CPU, µs (`INFO cpu`).
    server_cpu_us: f64,
    /// Per command: calls and µs (`INFO commandstats`).
    commands: BTreeMap<String, (u64, u64)>,
    /// This process's user + system CPU, µs (`/proc/self/stat`).
    client_cpu_us: f64,
    /// Messages handled.
    messages: u64,
}

impl Costs {
    /// A snapshot now (`messages` left at 0).
    async fn now(admin: &mut redis::aio::ConnectionManager) -> Costs {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(admin)
            .await
            .expect("INFO cpu commandstats");
        let mut costs = Costs {
            client_cpu_us: process_seconds().map_or(f64::NAN, |s| s * 1e6),
            ..Costs::default()
        };
        for line in info.lines() {
            if let Some((name, value)) = line.split_once(':') {
                if matches!(name, "used_cpu_sys" | "used_cpu_user") {
                    costs.server_cpu_us += value.trim().parse::<f64>().unwrap_or(0.0) * 1e6;
                }
                if let Some(cmd) = name.strip_prefix("cmdstat_") {
                    let field = |f: &str| {
                        value
                            .split(',')
                            .find_map(|kv| kv.strip_prefix(f)?.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    costs
                        .commands
                        .insert(cmd.to_owned(), (field("calls="), field("usec=")));
                }
            }
        }
        costs
    }

    /// What was spent between `before` and `self`, for `messages`.
    fn since(&self, before: &Costs, messages: u64) -> Costs {
        let commands = self
            .commands
            .iter()
            .map(|(cmd, &(calls, usec))| {
                let (c0, u0) = before.commands.get(cmd).copied().unwrap_or((0, 0));
                (cmd.clone(), (calls - c0, usec - u0))
            })
            .filter(|(cmd, (calls, _))| *calls > 0 && cmd != "info")
            .collect();
        Costs {
            server_cpu_us: self.server_cpu_us - before.server_cpu_us,
            commands,
            client_cpu_us: self.client_cpu_us - before.client_cpu_us,
            messages,
        }
    }

    fn add(&mut self, other: &Costs) {
        self.server_cpu_us += other.server_cpu_us;
        self.client_cpu_us += other.client_cpu_us;
        self.messages += other.messages;
        for (cmd, (calls, usec)) in &other.commands {
            let e = self.commands.entry(cmd.clone()).or_default();
            e.0 += calls;
            e.1 += usec;
        }
    }

    /// Per message: `(server CPU µs, client CPU µs, [(command, calls, µs)])`,
    /// commands by µs, most first.
    fn per_message(&self) -> (f64, f64, Vec<(String, f64, f64)>) {
        let n = self.messages.max(1) as f64;
        let mut commands: Vec<(String, f64, f64)> = self
            .commands
            .iter()
            .map(|(cmd, &(calls, usec))| (cmd.clone(), calls as f64 / n, usec as f64 / n))
            .collect();
        commands.sort_by(|a, b| b.2.total_cmp(&a.2));
        (self.server_cpu_us / n, self.client_cpu_us / n, commands)
    }
}

/// The commands the server ran for `call`, from `MONITOR`: those a client
/// sent (round trips) and those a script ran, each as its name, for the
/// keys under `prefix`.
async fn commands_of<F: std::future::Future>(
    url: &str,
    prefix: &str,
    call: F,
) -> (Vec<String>, Vec<String>) {
    use std::sync::atomic::AtomicBool;
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client.get_connection().expect("a monitor connection");
    conn.send_packed_command(&redis::cmd("MONITOR").get_packed_command())
        .expect("MONITOR");
    let _ok = conn.recv_response().expect("MONITOR's OK");
    conn.set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .expect("a read timeout");
    let stop = Arc::new(AtomicBool::new(false));
    let lines = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            loop {
                match conn.recv_response() {
                    Ok(redis::Value::SimpleString(line)) => lines.push(line),
                    Ok(_) => {}
                    Err(_) if stop.load(Ordering::SeqCst) => return lines,
                    Err(_) => {}
                }
            }
        })
    };
    call.await;
    // MONITOR lines arrive after the commands ran; let them through.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let lines = tokio::task::spawn_blocking(move || lines.join().expect("monitor thread"))
        .await
        .expect("join");
    let (mut sent, mut scripted) = (Vec::new(), Vec::new());
    for line in lines.iter().filter(|l| l.contains(prefix)) {
        // `<time> [<db> <client>] "CMD" "arg" ...`; a script's are `[<db> lua]`.
        let Some((source, rest)) = line.split_once("] ") else {
            continue;
        };
        let name = rest.split('"').nth(1).unwrap_or_default().to_uppercase();
        if source.ends_with(" lua") {
            scripted.push(name);
        } else {
            sent.push(name);
        }
    }
    (sent, scripted)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let prefix = format!("idem-bench-{}", std::process::id());
    let store = RedisStore::connect(&url).await?.with_prefix(&prefix)?;
    let client = redis::Client::open(url.as_str())?;
    let raw = client.get_connection_manager().await?;
    let mut admin = client.get_connection_manager().await?;
    let next = Arc::new(AtomicU64::new(1));

    let fenced = format!("idem_bench_fenced_{}", std::process::id());
    let mut library = client.get_connection_manager().await?;
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(fenced_library(&fenced))
        .query_async(&mut library)
        .await?;
    // Whatever happens below, the library and the keys go afterwards.
    let measured = async {
        println!(
            "{tasks} consumers, {rounds} rounds of {secs} s per variant, interleaved; load average {}",
            load_average()
        );
        for variant in Variant::ALL {
            run(variant, &fenced, &store, &raw, &prefix, 1.0, tasks, &next).await;
        }
        idem_examples::delete_redis_prefix(&url, &prefix).await?;
        let n = Variant::ALL.len();
        let mut tps: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut costs: Vec<Costs> = vec![Costs::default(); n];
        let mut marks = Rounds::default();
        for round in 0..rounds {
            let watch = Watch::start()?;
            // Each round starts with another variant, in turn.
            for i in 0..n {
                let v = (round + i) % n;
                let (before, first) = (Costs::now(&mut admin).await, next.load(Ordering::SeqCst));
                let t = run(
                    Variant::ALL[v],
                    &fenced,
                    &store,
                    &raw,
                    &prefix,
                    secs,
                    tasks,
                    &next,
                )
                .await;
                let spent = Costs::now(&mut admin)
                    .await
                    .since(&before, next.load(Ordering::SeqCst) - first);
                // Every round starts on the same server: without the last
                // round's keys (a few hundred thousand), which would make the
                // later rounds pay for a bigger keyspace (and its rehashing).
                idem_examples::delete_redis_prefix(&url, &prefix).await?;
                tps[v].push(t);
                costs[v].add(&spent);
            }
            let cpu = marks.push(watch.stop()?);
            let rates: Vec<String> = Variant::ALL
                .iter()
                .zip(&tps)
                .map(|(variant, t)| format!("{} {:.0}", variant.name(), t[round]))
                .collect();
            println!("round {}: {} msg/s ({cpu})", round + 1, rates.join(", "));
        }
        println!("{}", marks.summary());
        let medians: Vec<_> = tps.iter().map(|t| marks.medians(t)).collect();
        let at = |variant| Variant::ALL.iter().position(|v| *v == variant).unwrap_or(0);
        let (raw_at, fenced_at, idem_at) = (at(Variant::Raw), at(Variant::Fenced), at(Variant::Idem));
        for (variant, m) in Variant::ALL.iter().zip(&medians) {
            println!(
                "{:<7} median {m} msg/s, of raw over all rounds and unmarked ones: {:.3}",
                variant.name(),
                m.ratio(&medians[raw_at])
            );
        }
        println!(
            "idem/fenced (the limit of a fenced lease with a recorded outcome) over all rounds and unmarked ones: {:.3}",
            medians[idem_at].ratio(&medians[fenced_at])
        );

        // Where the time goes, per message, over every timed round.
        println!(
            "per message, server CPU (redis-server user+sys, INFO cpu) and client CPU (this process user+sys, /proc/self/stat):"
        );
        let per: Vec<_> = costs.iter().map(Costs::per_message).collect();
        for (variant, (server, client, _)) in Variant::ALL.iter().zip(&per) {
            println!(
                "  {:<7} server {server:.2} µs, client {client:.2} µs",
                variant.name()
            );
        }
        println!(
            "server command time per message (INFO commandstats: calls, µs; a script's µs include the commands it runs, listed too):"
        );
        for (variant, (_, _, cmds)) in Variant::ALL.iter().zip(&per) {
            let shown: Vec<String> = cmds
                .iter()
                .filter(|(_, calls, _)| *calls >= 0.001)
                .map(|(cmd, calls, us)| format!("{cmd} {calls:.2} {us:.2} µs"))
                .collect();
            println!("  {:<7} {}", variant.name(), shown.join(" | "));
        }

        let id = next.fetch_add(1, Ordering::Relaxed);
        let fresh = commands_of(&url, &prefix, async {
            assert!(
                handle(&store, &Msg { id })
                    .await
                    .expect("fresh")
                    .is_executed()
            );
        })
        .await;
        let duplicate = commands_of(&url, &prefix, async {
            assert!(
                handle(&store, &Msg { id })
                    .await
                    .expect("dup")
                    .is_duplicate()
            );
        })
        .await;
        for (what, (sent, scripted)) in [("fresh", &fresh), ("duplicate", &duplicate)] {
            println!(
                "idem {what}: sent {} (scripts ran {})",
                sent.join(", "),
                if scripted.is_empty() {
                    "nothing".to_owned()
                } else {
                    scripted.join(", ")
                }
            );
        }
        println!(
            "round trips per message: raw 1, two 2, fenced 2; idem fresh {}, duplicate {} (from MONITOR)",
            fresh.0.len(),
            duplicate.0.len()
        );

        let ratio = medians[idem_at].all / medians[raw_at].all;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(ratio)
    }
    .await;
    idem_examples::delete_redis_prefix(&url, &prefix).await?;
    let _: () = redis::cmd("FUNCTION")
        .arg("DELETE")
        .arg(&fenced)
        .query_async(&mut library)
        .await?;
    println!("idem/raw: {:.3}", measured?);
    Ok(())
}
