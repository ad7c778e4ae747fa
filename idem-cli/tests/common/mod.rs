//! The `idem` binary's suite, written once and run on every store it
//! reaches (`sqlite.rs`, `postgres.rs`, `mysql.rs`, `redis.rs`, and
//! `redis_cluster.rs`): the runtime writes real records through the
//! stores' `LeaseStore` methods (in progress, stuck past its lease,
//! completed, failed for good, waiting for a retry, out of attempts,
//! expired), then the real binary is run against the same store and its
//! output and exit code are checked. Each fixture has a table (or a Redis
//! prefix) of its own and removes it.

// Each test binary uses a part of these.
#![allow(dead_code)]

pub(crate) mod fixtures;
pub(crate) mod suite;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_runtime::clock::{Clock as _, SystemClock};
use idem_runtime::registry::{HandlerSpec, Mode};
use idem_runtime::store::{Claim, Failure, LeaseStore};
use idem_runtime::{Key, idempotent};

/// What a run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) args: Vec<String>,
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `idem` with `args`, without `IDEM_STORE_URL` unless `env` sets it.
pub(crate) fn idem_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args).env_remove("IDEM_STORE_URL");
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = cmd.output().expect("the idem binary runs");
    Run {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `idem` with `args`.
pub(crate) fn idem(args: &[&str]) -> Run {
    idem_env(args, &[])
}

impl Run {
    /// Asserts success (exit 0, nothing on stderr); the run.
    #[track_caller]
    pub(crate) fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "idem {:?} failed: {}{}",
            self.args, self.stderr, self.stdout
        );
        assert_eq!(self.stderr, "", "idem {:?} wrote to stderr", self.args);
        self
    }

    /// The JSON document on stdout of a successful run.
    #[track_caller]
    pub(crate) fn json(self) -> serde_json::Value {
        let run = self.ok();
        serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("idem {:?} printed no JSON ({e}): {}", run.args, run.stdout))
    }

    /// Asserts a failure with `code` and exactly one line, `idem: ...`, on
    /// stderr, nothing on stdout; the line.
    #[track_caller]
    pub(crate) fn fails(self, code: i32) -> String {
        assert_eq!(
            self.code, code,
            "idem {:?}: expected exit {code}; stderr: {} stdout: {}",
            self.args, self.stderr, self.stdout
        );
        assert_eq!(self.stdout, "", "idem {:?} printed on stdout", self.args);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "idem {:?}: one line on stderr, got {:?}",
            self.args,
            self.stderr
        );
        assert!(lines[0].starts_with("idem: "), "{}", lines[0]);
        lines[0].to_owned()
    }
}

/// Now, by the system clock (ms since the epoch).
pub(crate) fn now() -> i64 {
    SystemClock.now_millis()
}

/// Two hours ago: when the records of the past are written.
pub(crate) fn two_hours_ago() -> i64 {
    now() - 2 * 3_600_000
}

/// The handler most scenarios write under.
pub(crate) const ORDERS: &str = "cli_orders";
/// A second handler, for counts by handler.
pub(crate) const SMS: &str = "cli_sms";

const fn spec(
    name: &'static str,
    ttl_secs: u64,
    lease_secs: u64,
    max_attempts: Option<u32>,
) -> HandlerSpec {
    HandlerSpec {
        name,
        function: name,
        key: "order_id + sku",
        ttl: Duration::from_secs(ttl_secs),
        lease: Duration::from_secs(lease_secs),
        store: "sqlite",
        mode: Mode::Lease,
        module: module_path!(),
        file: file!(),
        line: line!(),
        fingerprint: None,
        max_attempts,
    }
}

/// `cli_orders`: records kept an hour, leases of ten minutes (long enough
/// that a claim made now stays live through a test, and that Redis keeps
/// a claim written two hours ago while the test reads it).
pub(crate) static ORDERS_SPEC: HandlerSpec = spec(ORDERS, 3_600, 600, Some(3));
/// `cli_sms`: as `cli_orders`, without `max_attempts`.
pub(crate) static SMS_SPEC: HandlerSpec = spec(SMS, 3_600, 600, None);
/// `cli_orders` with a ttl of zero: its records expire as they are
/// completed (on Redis, the key vanishes after a millisecond).
pub(crate) static SHORT_SPEC: HandlerSpec = spec(ORDERS, 0, 600, None);

/// Handlers whose names hold glob characters, and names of the same
/// length they would match as globs.
pub(crate) static GLOB_SPECS: [HandlerSpec; 4] = [
    spec("a*b", 3_600, 600, None),
    spec("axb", 3_600, 600, None),
    spec("a?c", 3_600, 600, None),
    spec("abc", 3_600, 600, None),
];

/// A message of `cli_reserve`.
pub(crate) struct Reserve {
    pub(crate) order_id: String,
    pub(crate) sku: String,
}

impl Reserve {
    pub(crate) fn new(order_id: &str, sku: &str) -> Reserve {
        Reserve {
            order_id: order_id.to_owned(),
            sku: sku.to_owned(),
        }
    }
}

/// The name `cli_reserve` is registered under.
pub(crate) const RESERVE: &str = "cli_reserve";

/// A handler allowed three failed deliveries per key, whose warehouse is
/// always down: each run counts in `runs` and fails with an error that may
/// pass. Lease mode, so it runs on every store of the suite.
#[idempotent(
    key = "msg.order_id + msg.sku",
    ttl = "1h",
    lease = "10m",
    store = "sqlite",
    name = "cli_reserve",
    max_attempts = 3
)]
pub(crate) async fn reserve(msg: &Reserve, runs: &AtomicU32) -> Result<u32, std::io::Error> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    Err(std::io::Error::other(format!(
        "warehouse down (run {run} for {})",
        msg.order_id
    )))
}

/// The name `cli_ratio` is registered under.
pub(crate) const RATIO: &str = "cli_ratio";

/// A handler whose result, a NaN, JSON cannot carry: its body takes effect
/// (counted in `runs`) and its key is settled as unrecordable.
#[idempotent(
    key = "msg.order_id + msg.sku",
    ttl = "1h",
    lease = "10m",
    store = "sqlite",
    name = "cli_ratio"
)]
pub(crate) async fn ratio(msg: &Reserve, runs: &AtomicU32) -> Result<f64, std::io::Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    let _ = &msg.order_id;
    Ok(f64::NAN)
}

/// A key of `cli_orders`: `order_id + sku`.
pub(crate) fn key(order: &str, sku: &str) -> Key {
    Key::from_parts(&[&order, &sku]).expect("a key")
}

/// A payload fingerprint as the runtime writes them (32 hex digits).
pub(crate) const FINGERPRINT: &str = "0123456789abcdef0123456789abcdef";

/// Claims `key`; the claim's token.
pub(crate) async fn claim<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
) -> String {
    match store.claim(spec, key, fingerprint).await.expect("claim") {
        Claim::Fresh { token } => token,
        other => panic!("{key:?} was not claimed: {other:?}"),
    }
}

/// A completed record of `key` with `outcome`.
pub(crate) async fn complete<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    outcome: &str,
) {
    let token = claim(store, spec, key, None).await;
    assert!(store.complete(spec, key, &token, outcome).await.unwrap());
}

/// A record of `key` whose delivery failed with `failure`.
pub(crate) async fn fail<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    failure: Failure<'_>,
) {
    let token = claim(store, spec, key, None).await;
    assert!(store.fail(spec, key, &token, failure).await.unwrap());
}

/// Asserts that `key` of `spec` can be claimed (as a first delivery: one
/// attempt), and releases the claim.
pub(crate) async fn claimable_afresh<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
) {
    match store.claim(spec, key, None).await.expect("claim") {
        Claim::Fresh { token } => store.release(spec, key, &token).await.unwrap(),
        other => panic!("{key:?} is not claimable again: {other:?}"),
    }
}
