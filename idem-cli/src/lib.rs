//! # idem: the operator's tool for idempotent handlers' records
//!
//! `idem` answers "was this message processed, when, with what result; how
//! often did it fail, and why" from the store the handlers use, and lets an
//! operator forget a key (so that its message runs again) or sweep expired
//! records. It reads the store through
//! [`idem_runtime::store::Inspect`], so it sees exactly what the runtime
//! wrote.
//!
//! ```text
//! idem --store sqlite:data/idem.db show deduct_stock A-17 apple
//! idem --store postgres://app@db/shop list deduct_stock --stuck
//! IDEM_STORE_URL=redis://127.0.0.1:6379 idem stats --json
//! idem --store mysql://root@127.0.0.1/test forget deduct_stock A-17 apple
//! idem dead list --rabbitmq amqp://guest:guest@127.0.0.1:5672/%2f --queue orders
//! idem --store postgres://app@db/shop outbox list
//! ```
//!
//! `idem dead` lists, shows, replays and purges the consumers' dead letters
//! on RabbitMQ, NATS JetStream or Kafka (`dead.rs`; no store needed).
//! `idem outbox` counts, lists, shows, sends now and deletes the messages
//! staged in a SQL store's outbox that no relay has published yet
//! (`outbox.rs`).
//!
//! A key is given by its parts, in the order of the handler's key
//! expression (`key = "order_id + sku"`: `A-17 apple`), each encoded as its
//! text exactly as the runtime derives it; or by its stored form with
//! `--raw 4:A-17|5:apple` (as a log line or the table shows it).
//!
//! # Stores
//!
//! | URL | store | options |
//! | --- | --- | --- |
//! | `sqlite:PATH`, `sqlite://PATH` | SQLite (the file must exist) | `--table` (default `idem_keys`) |
//! | `postgres://...`, `postgresql://...` | PostgreSQL | `--table` |
//! | `mysql://...`, `mariadb://...` | MySQL / MariaDB | `--table` |
//! | `redis://...`, `rediss://...` | Redis; `--cluster` for a Redis Cluster (any node, or several separated by `,`) | `--prefix` (default `idem`) |
//!
//! The URL is `--store URL`, or `IDEM_STORE_URL`. Passwords in URLs are
//! never printed.
//!
//! # Output
//!
//! Human-readable text by default; `--json` prints one JSON document on
//! stdout whose field names are stable: records carry `handler`, `key`
//! (stored form), `key_parts`, `status`, `outcome` (the recorded JSON),
//! `unrecordable` (why the body's result could not be recorded, for a key
//! settled because of it, or `null`),
//! `attempts`, `failures`, `last_error`, `fingerprint`, `token` (the lease
//! holder; a completed record keeps the token of the claim that completed
//! it), `trace` and `trace_id` (the W3C `traceparent` of the execution that
//! settled the record, and its trace id, or `null`), `created_at_ms`,
//! `updated_at_ms`, `expires_at_ms` (ms since the
//! epoch), `created_at`, `updated_at`, `expires_at` (UTC, RFC 3339) and
//! `expired`.
//!
//! # Exit codes
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done |
//! | 1 | the store (or, for `dead`, the broker) failed: unreachable, timed out, no table, an error |
//! | 2 | usage: bad arguments, a bad URL, a malformed key, a key of another number of parts than the handler's records, an invalid table name or prefix |
//! | 3 | not found: no record of the key (`show`, `forget`), a handler with no records (`show`, `list`, `forget`), no table (`schema`); no such dead letters or id (`dead`) |
//! | 4 | refused: `forget` of a key a live claim holds, without `--force`; what the broker cannot do (`dead purge` on Kafka) |
//!
//! Every error is one line on stderr, starting `idem: `.
//!
//! # Features
//!
//! Every store (SQLite, PostgreSQL, MySQL / MariaDB, Redis) is always built:
//! their drivers are Rust but for SQLite's C library, which builds in
//! seconds. The brokers of `idem dead` are cargo features, off by default,
//! because Kafka's client compiles librdkafka from C (minutes):
//!
//! | feature | `idem dead` on |
//! | --- | --- |
//! | `rabbitmq` | RabbitMQ (`--rabbitmq URL`) |
//! | `nats` | NATS JetStream (`--nats URL`) |
//! | `kafka` | Kafka (`--kafka BROKERS`; builds librdkafka) |
//!
//! ```text
//! cargo install idem-cli                                   # the records' commands
//! cargo install idem-cli --features kafka                  # and idem dead on Kafka
//! cargo install idem-cli --features rabbitmq,nats,kafka    # and on every broker
//! ```
//!
//! `idem dead` on a broker the build has no feature for fails with exit
//! code 2 and names the feature to build with.

mod commands;
mod dead;
mod open;
mod outbox;
mod render;
mod tls;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_runtime::store::{Filter, Status};

/// Shows, lists, counts, forgets and sweeps the records of idempotent
/// handlers (`#[idempotent]`) in their store.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
#[command(
    after_help = "Exit codes: 0 done, 1 store or broker error, 2 usage, 3 not found, 4 refused."
)]
pub(crate) struct Cli {
    /// Where the records are: sqlite:PATH, postgres://..., mysql://...,
    /// mariadb://..., redis://... or rediss://...
    #[arg(
        long,
        global = true,
        env = "IDEM_STORE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,

    /// The dedup table of a SQL store [default: idem_keys]
    #[arg(long, global = true, value_name = "TABLE")]
    table: Option<String>,

    /// The key prefix of a Redis store [default: idem]
    #[arg(long, global = true, value_name = "PREFIX")]
    prefix: Option<String>,

    /// The Redis URL names nodes of a Redis Cluster (one, or several
    /// separated by `,`)
    #[arg(long, global = true)]
    cluster: bool,

    /// Print JSON (stable field names) instead of text
    #[arg(long, global = true)]
    json: bool,

    /// How long to wait for the store to answer a connection, in seconds
    #[arg(long, global = true, value_name = "SECS", default_value_t = 10)]
    timeout: u64,

    #[command(flatten)]
    tls: tls::TlsArgs,

    #[command(subcommand)]
    command: Top,
}

/// The records' commands, and the dead letters'.
#[derive(Debug, Subcommand)]
pub(crate) enum Top {
    #[command(flatten)]
    Records(Command),
    /// The consumers' dead letters on RabbitMQ, NATS JetStream, Kafka or
    /// RocketMQ: list, group by cause, show, replay, purge (no store needed)
    Dead(Box<dead::DeadArgs>),
    /// The messages staged in a SQL store's outbox and not yet published:
    /// stats, list, show, send now, delete
    Outbox(outbox::OutboxArgs),
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show one record: status, outcome, attempts, failures, last error,
    /// fingerprint, times, the lease holder and the trace that settled it
    Show(KeyArgs),
    /// List a handler's records, oldest claim first
    List(ListArgs),
    /// Count the records by handler and status, with the oldest claim in
    /// progress and the expired records not yet swept
    Stats,
    /// Delete a record so that its message runs again (refused while a live
    /// claim holds the key, unless --force)
    Forget(ForgetArgs),
    /// Delete every expired record now (Redis expires records by itself; a
    /// PostgreSQL table partitioned by time drops each partition whose
    /// records have all expired)
    Sweep,
    /// The dedup table's schema version
    Schema,
}

/// A handler and one of its keys.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct KeyArgs {
    /// The handler's registered name (its `name = "..."`, or the function's)
    pub(crate) handler: String,
    /// The key's parts, in the order of the handler's key expression
    #[arg(value_name = "PART")]
    pub(crate) parts: Vec<String>,
    /// The key in its stored form instead of its parts (`4:A-17|5:apple`)
    #[arg(long, value_name = "STORED_KEY", conflicts_with = "parts")]
    pub(crate) raw: Option<String>,
}

/// `list`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The handler's registered name
    pub(crate) handler: String,
    /// Only records of this status: in_progress, completed, failed, retry;
    /// or exhausted (retry records out of attempts)
    #[arg(long, value_name = "STATUS", value_parser = status, conflicts_with_all = ["stuck", "failed"])]
    pub(crate) status: Option<Filter>,
    /// Only claims in progress past their lease
    #[arg(long, conflicts_with = "failed")]
    pub(crate) stuck: bool,
    /// Only records that saw a failure (failures > 0, failed or retry)
    #[arg(long)]
    pub(crate) failed: bool,
    /// At most this many records
    #[arg(long, value_name = "N", default_value_t = idem_runtime::store::DEFAULT_LIMIT)]
    pub(crate) limit: u32,
    /// Newest claim first
    #[arg(long)]
    pub(crate) newest_first: bool,
}

/// `forget`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct ForgetArgs {
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// Forget the key even while a live claim holds it (its body may then
    /// run twice at once)
    #[arg(long)]
    pub(crate) force: bool,
}

/// Reads a status as the store writes it (`in-progress` is taken too), or
/// `exhausted`: the filter of `list --status`.
fn status(text: &str) -> Result<Filter, String> {
    if text == "exhausted" {
        return Ok(Filter::Exhausted);
    }
    Status::parse(&text.replace('-', "_"))
        .map(Filter::Status)
        .ok_or_else(|| {
            let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
            format!("expected one of {}, exhausted", names.join(", "))
        })
}

/// Why a command did not succeed, and its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The store failed (1).
    Store(String),
    /// Bad arguments (2).
    Usage(String),
    /// Nothing to show (3).
    NotFound(String),
    /// Refused (4).
    Refused(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Store(_) => 1,
            Failure::Usage(_) => 2,
            Failure::NotFound(_) => 3,
            Failure::Refused(_) => 4,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Store(m) | Failure::Usage(m) | Failure::NotFound(m) | Failure::Refused(m) => m,
        }
    }
}

/// Runs `idem` with the process's arguments: the binary's `main`. Exits
/// with the codes above.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors to stderr
            // with 2, as clap writes them.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Failure::Store(format!("cannot start: {e}"))),
    };
    match runtime.block_on(run(&cli)) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`idem list ... | head`) is not an error of ours.
            let _ = stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush());
            ExitCode::SUCCESS
        }
        Err(failure) => fail(&failure),
    }
}

/// Prints `failure` as one line on stderr and returns its exit code.
fn fail(failure: &Failure) -> ExitCode {
    let line: String = failure
        .message()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let _ = writeln!(std::io::stderr().lock(), "idem: {line}");
    ExitCode::from(failure.code())
}

/// Opens the store and runs the command; the text to print.
async fn run(cli: &Cli) -> Result<String, Failure> {
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let tls = cli.tls.tls()?;
    // The records' command, or (`None`) the outbox's.
    let (command, outbox) = match &cli.command {
        Top::Dead(args) => return dead::run(args, cli.json, timeout, tls.as_ref()).await,
        Top::Records(command) => (Some(command), None),
        Top::Outbox(args) => (None, Some(args)),
    };
    let Some(url) = cli.store.as_deref().filter(|u| !u.trim().is_empty()) else {
        return Err(Failure::Usage(
            "no store: pass --store URL or set IDEM_STORE_URL (sqlite:PATH, postgres://..., mysql://..., redis://...)".into(),
        ));
    };
    // A key given on the command line is checked before connecting.
    let key = match command {
        Some(Command::Show(key) | Command::Forget(ForgetArgs { key, .. })) => {
            Some(commands::stored_key(key)?)
        }
        _ => None,
    };
    let target = open::Target::parse(
        url,
        cli.table.as_deref(),
        cli.prefix.as_deref(),
        cli.cluster,
    )?;
    let store = target.open(timeout, tls.as_ref()).await?;
    if let Some(args) = outbox {
        return outbox::run(args, &store, cli.json, tls.as_ref()).await;
    }
    let Some(command) = command else {
        return Err(Failure::Usage("no command".into()));
    };
    let ctx = commands::Context {
        json: cli.json,
        store: target.kind(),
        table: target.table(),
    };
    match &store {
        open::Store::Sqlite(s) => commands::run(s, &ctx, command, key.as_ref()).await,
        open::Store::Postgres(s) => commands::run(s, &ctx, command, key.as_ref()).await,
        open::Store::MySql(s) => commands::run(s, &ctx, command, key.as_ref()).await,
        open::Store::Redis(s) => commands::run(s, &ctx, command, key.as_ref()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory as _;

    #[test]
    fn the_arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn statuses_are_read_as_stored() {
        use idem_runtime::store::{Filter, Status};
        let in_progress = Filter::Status(Status::InProgress);
        assert_eq!(super::status("in_progress"), Ok(in_progress));
        assert_eq!(super::status("in-progress"), Ok(in_progress));
        assert_eq!(super::status("exhausted"), Ok(Filter::Exhausted));
        assert!(super::status("done").is_err());
    }
}
