//! `idem outbox`: the messages transaction-mode bodies staged that no relay
//! has published yet, in a SQL store's outbox table (`<table>_outbox`):
//! list, show, count, send now, delete; as text or JSON.

use std::time::{Duration, UNIX_EPOCH};

use clap::{ArgGroup, Args, Subcommand};
use idem_runtime::BoxError;
use idem_runtime::clock::{Clock as _, SystemClock};
use idem_runtime::outbox::{Destination, MessageId, Outgoing, Relay};
use idem_runtime::store::sql::{Dialect, OutboxTable};
use idem_runtime::tls::Tls;
use serde::Serialize;

use crate::Failure;
use crate::open::Store;
use crate::render::{cut, relative, table, utc};
use crate::tls::explained;

/// `idem outbox`'s arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
The outbox table is the dedup table's (--table, default idem_keys) with
_outbox after it, in the SQL store of --store.

Examples:
  idem --store postgres://app@db/shop outbox stats
  idem --store postgres://app@db/shop outbox list --limit 20
  idem --store sqlite:data/idem.db outbox show 0b6e...-8f1a
  idem --store postgres://app@db/shop outbox send --all --kafka 127.0.0.1:9092
  idem --store postgres://app@db/shop outbox delete 0b6e...-8f1a

`send` reaches a broker through a cargo feature of idem-cli, off by default:
  cargo install idem-cli --features rabbitmq,nats,kafka   (or one of them)

Exit codes: 0 done, 1 store or broker error (a publish that failed), 2 usage,
3 no such message.")]
pub(crate) struct OutboxArgs {
    #[command(subcommand)]
    pub(crate) action: Action,
}

/// What to do with the outbox.
#[derive(Debug, Subcommand)]
pub(crate) enum Action {
    /// How many messages wait, and how long the oldest has
    Stats,
    /// List the messages waiting, oldest first: place, id, producer,
    /// destination, age, attempts, last error
    List {
        /// At most this many
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: u32,
        /// From this place (`seq`) on
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        from: i64,
    },
    /// Show one message: its row, headers and payload
    Show {
        /// Its id (a UUID, as `list` shows it)
        id: String,
    },
    /// Publish messages now, each deleted once the broker confirmed it:
    /// with --all every one, lane by lane as a relay does; or the ids
    /// given, in the order given, whatever their lanes hold before them
    /// and whether a relay is publishing them too (under the same id)
    Send {
        /// The messages' ids
        #[arg(value_name = "ID", required_unless_present = "all")]
        ids: Vec<String>,
        /// Every message waiting
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        #[command(flatten)]
        to: To,
    },
    /// Delete messages without publishing them (one no broker will take)
    Delete {
        /// The messages' ids
        #[arg(value_name = "ID", required = true)]
        ids: Vec<String>,
    },
}

/// The broker `send` publishes to.
#[derive(Debug, Args)]
#[command(next_help_heading = "Broker")]
#[command(group(ArgGroup::new("broker").required(true).args(["rabbitmq", "nats", "kafka"])))]
pub(crate) struct To {
    /// A RabbitMQ broker (amqp://user:pass@host:5672/vhost): the message's
    /// destination is the routing key
    #[arg(long, value_name = "URL")]
    rabbitmq: Option<String>,
    /// The exchange to publish to [default: the default exchange]
    #[arg(long, value_name = "NAME", requires = "rabbitmq")]
    exchange: Option<String>,
    /// A NATS server with JetStream (nats://host:4222): the destination is
    /// the subject
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Kafka brokers (host:port, comma-separated): the destination is the
    /// topic
    #[arg(long, value_name = "BROKERS")]
    kafka: Option<String>,
}

/// Runs `args` on the outbox table of `store` (a SQL store's).
pub(crate) async fn run(
    args: &OutboxArgs,
    store: &Store,
    json: bool,
    tls: Option<&Tls>,
) -> Result<String, Failure> {
    match store {
        Store::Sqlite(s) => on_table(args, &s.outbox_table(), json, tls).await,
        Store::Postgres(s) => on_table(args, &s.outbox_table(), json, tls).await,
        Store::MySql(s) => on_table(args, &s.outbox_table(), json, tls).await,
        Store::Redis(_) => Err(Failure::Usage(
            "a Redis store has no outbox: messages are staged in a SQL store's transaction (sqlite:, postgres://, mysql://)".into(),
        )),
    }
}

async fn on_table<D: Dialect>(
    args: &OutboxArgs,
    outbox: &OutboxTable<D>,
    json: bool,
    tls: Option<&Tls>,
) -> Result<String, Failure> {
    let failed = store_failed(outbox);
    let now = SystemClock.now_millis();
    match &args.action {
        Action::Stats => {
            let backlog = outbox.backlog().await.map_err(failed)?;
            if json {
                return Ok(to_json(&StatsJson {
                    table: outbox.name(),
                    rows: backlog.rows,
                    oldest_age_ms: u64::try_from(backlog.oldest_age.as_millis())
                        .unwrap_or(u64::MAX),
                }));
            }
            Ok(format!(
                "{}: {} waiting{}\n",
                outbox.name(),
                backlog.rows,
                if backlog.rows > 0 {
                    format!(", the oldest for {}", age(backlog.oldest_age))
                } else {
                    String::new()
                }
            ))
        }
        Action::List { limit, from } => {
            let rows = outbox.list(*from, *limit).await.map_err(failed)?;
            if json {
                let rows: Vec<RowJson<'_>> = rows.iter().map(|r| RowJson::of(r, false)).collect();
                return Ok(to_json(&rows));
            }
            if rows.is_empty() {
                return Ok(format!("{}: nothing waiting\n", outbox.name()));
            }
            let cells: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    vec![
                        r.seq.to_string(),
                        r.id.to_string(),
                        r.handler.clone(),
                        cut(&r.destination, 32),
                        relative(millis(r), now),
                        r.attempts.to_string(),
                        cut(r.last_error.as_deref().unwrap_or(""), 60),
                    ]
                })
                .collect();
            Ok(table(
                &[
                    "SEQ",
                    "ID",
                    "PRODUCER",
                    "DESTINATION",
                    "STAGED",
                    "ATTEMPTS",
                    "LAST ERROR",
                ],
                &cells,
            ))
        }
        Action::Show { id } => {
            let rows = outbox
                .find(&MessageId::from_stored(id))
                .await
                .map_err(failed)?;
            if rows.is_empty() {
                return Err(Failure::NotFound(format!(
                    "no message {id} waits in {}: it was published (or never staged)",
                    outbox.name()
                )));
            }
            if json {
                let rows: Vec<RowJson<'_>> = rows.iter().map(|r| RowJson::of(r, true)).collect();
                return Ok(to_json(&rows));
            }
            Ok(rows.iter().map(|r| row_text(r, now)).collect())
        }
        Action::Delete { ids } => {
            let mut deleted = 0;
            let mut missing = Vec::new();
            for id in ids {
                let n = outbox
                    .delete(&MessageId::from_stored(id))
                    .await
                    .map_err(failed)?;
                if n == 0 {
                    missing.push(id.as_str());
                }
                deleted += n;
            }
            if !missing.is_empty() {
                return Err(Failure::NotFound(format!(
                    "no message {} waits in {} ({deleted} deleted)",
                    missing.join(", "),
                    outbox.name()
                )));
            }
            Ok(format!("{deleted} deleted\n"))
        }
        Action::Send { ids, all, to } => {
            let to = to.destination(tls).await?;
            if *all {
                return send_all(outbox, to).await;
            }
            send_ids(outbox, &to, ids).await
        }
    }
}

/// What a store error of `outbox`'s reads as: the table, then the error.
fn store_failed<D: Dialect>(
    outbox: &OutboxTable<D>,
) -> impl Fn(idem_runtime::StoreError) -> Failure + Copy + '_ {
    |e| Failure::Store(format!("{}: {e}", outbox.name()))
}

/// Publishes every row, as a relay's passes do, until none is left or a
/// publish fails.
async fn send_all<D: Dialect>(outbox: &OutboxTable<D>, to: Any) -> Result<String, Failure> {
    let relay = Relay::new(outbox.clone(), to);
    let mut sent = 0;
    loop {
        let pass = relay.pass().await.map_err(store_failed(outbox))?;
        sent += pass.published;
        if pass.failed > 0 {
            return Err(Failure::Store(format!(
                "{sent} sent; {} failed and wait in {} (`idem outbox list` shows why)",
                pass.failed,
                outbox.name()
            )));
        }
        if pass.published == 0 {
            return Ok(format!("{sent} sent\n"));
        }
    }
}

/// Publishes the rows of `ids`, deleting each id's rows once the broker
/// confirmed them.
async fn send_ids<D: Dialect>(
    outbox: &OutboxTable<D>,
    to: &Any,
    ids: &[String],
) -> Result<String, Failure> {
    let mut sent = 0;
    for id in ids {
        let id = MessageId::from_stored(id);
        let rows = outbox.find(&id).await.map_err(store_failed(outbox))?;
        if rows.is_empty() {
            return Err(Failure::NotFound(format!(
                "no message {id} waits in {} ({sent} sent)",
                outbox.name()
            )));
        }
        for row in &rows {
            to.publish(row)
                .await
                .map_err(|e| Failure::Store(format!("{sent} sent; {id} was not: {e}")))?;
        }
        outbox.delete(&id).await.map_err(store_failed(outbox))?;
        sent += rows.len();
    }
    Ok(format!("{sent} sent\n"))
}

/// When `row` was staged, in ms since the epoch.
fn millis(row: &Outgoing) -> i64 {
    row.staged_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A duration as `list` writes ages: `42s`, `3m 20s`, `2h 5m`.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// `show`'s text of one row.
fn row_text(r: &Outgoing, now: i64) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| out.push_str(&format!("{name:<12} {value}\n"));
    line("id", r.id.to_string());
    line("seq", r.seq.to_string());
    line("producer", r.handler.clone());
    line("destination", r.destination.clone());
    line("key", r.key.clone().unwrap_or_else(|| "-".into()));
    line("lane", r.lane.clone());
    line(
        "staged",
        format!("{} ({})", utc(millis(r)), relative(millis(r), now)),
    );
    line("attempts", r.attempts.to_string());
    line(
        "last error",
        r.last_error.clone().unwrap_or_else(|| "-".into()),
    );
    for (name, value) in &r.headers {
        line("header", format!("{name}: {value}"));
    }
    line(
        "payload",
        match std::str::from_utf8(&r.payload) {
            Ok(text) => text.to_owned(),
            Err(_) => format!("{} bytes, not UTF-8", r.payload.len()),
        },
    );
    out.push('\n');
    out
}

#[derive(Serialize)]
struct StatsJson<'a> {
    table: &'a str,
    rows: u64,
    oldest_age_ms: u64,
}

/// A row as JSON: stable field names.
#[derive(Serialize)]
struct RowJson<'a> {
    seq: i64,
    id: &'a str,
    producer: &'a str,
    destination: &'a str,
    key: Option<&'a str>,
    lane: &'a str,
    staged_at_ms: i64,
    staged_at: String,
    attempts: u32,
    last_error: Option<&'a str>,
    headers: &'a [(String, String)],
    /// The payload as text, when it is UTF-8 and asked for (`show`).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    payload_bytes: usize,
}

impl<'a> RowJson<'a> {
    fn of(r: &'a Outgoing, payload: bool) -> RowJson<'a> {
        RowJson {
            seq: r.seq,
            id: r.id.as_str(),
            producer: &r.handler,
            destination: &r.destination,
            key: r.key.as_deref(),
            lane: &r.lane,
            staged_at_ms: millis(r),
            staged_at: utc(millis(r)),
            attempts: r.attempts,
            last_error: r.last_error.as_deref(),
            headers: &r.headers,
            payload: payload
                .then(|| std::str::from_utf8(&r.payload).ok())
                .flatten(),
            payload_bytes: r.payload.len(),
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into());
    text.push('\n');
    text
}

/// The broker of `send`, whichever this build has.
enum Any {
    #[cfg(feature = "rabbitmq")]
    RabbitMq(Box<idem_runtime::outbox::RabbitMqDestination>),
    #[cfg(feature = "nats")]
    Nats(Box<idem_runtime::outbox::NatsDestination>),
    #[cfg(feature = "kafka")]
    Kafka(Box<idem_runtime::outbox::KafkaDestination>),
}

impl To {
    /// Connects to the broker named, or names the feature this build lacks.
    async fn destination(&self, tls: Option<&Tls>) -> Result<Any, Failure> {
        let (feature, given) = match (&self.rabbitmq, &self.nats, &self.kafka) {
            (Some(url), _, _) => ("rabbitmq", url),
            (_, Some(url), _) => ("nats", url),
            (_, _, Some(brokers)) => ("kafka", brokers),
            _ => {
                return Err(Failure::Usage(
                    "no broker: pass --rabbitmq, --nats or --kafka".into(),
                ));
            }
        };
        let unreachable =
            |e: BoxError| Failure::Store(format!("cannot reach {feature}: {}", explained(&*e)));
        let _ = (&unreachable, tls);
        match feature {
            #[cfg(feature = "rabbitmq")]
            "rabbitmq" => {
                use idem_runtime::outbox::RabbitMqDestination;
                let to = match tls {
                    Some(tls) => RabbitMqDestination::connect_tls(given, tls).await,
                    None => RabbitMqDestination::connect(given).await,
                }
                .map_err(unreachable)?;
                Ok(Any::RabbitMq(Box::new(match &self.exchange {
                    Some(exchange) => to.exchange(exchange),
                    None => to,
                })))
            }
            #[cfg(feature = "nats")]
            "nats" => {
                use idem_runtime::outbox::NatsDestination;
                let to = match tls {
                    Some(tls) => NatsDestination::connect_tls(given, tls).await,
                    None => NatsDestination::connect(given).await,
                }
                .map_err(unreachable)?;
                Ok(Any::Nats(Box::new(to)))
            }
            #[cfg(feature = "kafka")]
            "kafka" => {
                use idem_runtime::outbox::KafkaDestination;
                let to = match tls {
                    Some(tls) => KafkaDestination::connect_tls(given, tls),
                    None => KafkaDestination::connect(given),
                }
                .map_err(unreachable)?;
                Ok(Any::Kafka(Box::new(to)))
            }
            _ => {
                let _ = given;
                Err(Failure::Usage(format!(
                    "this idem is built without {feature}: install it with `cargo install idem-cli --features {feature}`"
                )))
            }
        }
    }
}

impl Destination for Any {
    fn kind(&self) -> &'static str {
        match *self {
            #[cfg(feature = "rabbitmq")]
            Any::RabbitMq(ref to) => to.kind(),
            #[cfg(feature = "nats")]
            Any::Nats(ref to) => to.kind(),
            #[cfg(feature = "kafka")]
            Any::Kafka(ref to) => to.kind(),
        }
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        let _ = message;
        match *self {
            #[cfg(feature = "rabbitmq")]
            Any::RabbitMq(ref to) => to.publish(message).await,
            #[cfg(feature = "nats")]
            Any::Nats(ref to) => to.publish(message).await,
            #[cfg(feature = "kafka")]
            Any::Kafka(ref to) => to.publish(message).await,
        }
    }
}
