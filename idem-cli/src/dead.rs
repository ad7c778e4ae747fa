//! `idem dead`: the consumers' dead letters on RabbitMQ, NATS JetStream,
//! Kafka or RocketMQ, through [`idem_runtime::consume::dead`]: list, group
//! by cause, show, replay (edited, too), purge; as text (tables as `list`
//! writes them) or JSON.

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};

use crate::Failure;

/// `idem dead`'s arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
The broker is one of --rabbitmq URL, --nats URL, --kafka BROKERS or --rocketmq
NAMESRV, with the consumer's --queue, --stream, --topic or --group (its dead
letters are QUEUE.idem.dead, <stream>_DEAD, <topic>-dlt or %DLQ%<group>), or
--dead-letters NAME for another name.

Examples:
  idem dead list --rabbitmq amqp://guest:guest@127.0.0.1:5672/%2f --queue orders
  idem dead groups --kafka 127.0.0.1:9092 --topic orders
  idem dead show 12 --nats nats://127.0.0.1:4222 --stream ORDERS
  idem dead replay --kafka 127.0.0.1:9092 --topic orders --reason 'out of stock' --older-than 10m
  idem dead replay --kafka 127.0.0.1:9092 --topic orders --in-group 3f0a9c1e2b4d
  idem dead replay --nats nats://127.0.0.1:4222 --stream ORDERS --id 12 --payload fixed.json
  idem dead purge --rabbitmq amqp://127.0.0.1:5672/%2f --queue orders --all
  idem dead list --rocketmq 127.0.0.1:9876 --group idem-orders

Each broker is a cargo feature of idem-cli, off by default:
  cargo install idem-cli --features rabbitmq,nats,kafka,rocketmq   (or one of them)

A replay leaves a dead letter older than its handler's ttl where it is and says
so: a record of its key may have expired, so it would run as a new message.
--expired replays such dead letters anyway.

Exit codes: 0 done, 1 broker error, 2 usage (a replay or purge without a filter
or --all, a broker this build has no feature for), 3 no such dead letters or id,
4 refused (Kafka cannot delete one record).")]
pub(crate) struct DeadArgs {
    #[command(subcommand)]
    pub(crate) action: Action,
}

/// What to do with the dead letters.
#[derive(Debug, Subcommand)]
pub(crate) enum Action {
    /// List the dead letters, oldest first: id, when dead-lettered,
    /// attempts, replays, origin, size, message id, reason
    List {
        #[command(flatten)]
        at: Where,
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Group the dead letters by cause (handler, error kind and the error
    /// with numbers and ids taken out), the biggest first: group id,
    /// messages (copies counted once), dead letters, replays, first and
    /// last seen, handler, kind, fingerprint
    Groups {
        #[command(flatten)]
        at: Where,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Show one dead letter: what `list` says, its headers and its payload
    Show {
        /// Its id, as `list` shows it (RabbitMQ: a UUID; NATS: the dead
        /// stream's sequence; Kafka: partition:offset; RocketMQ: a UUID)
        id: String,
        #[command(flatten)]
        at: Where,
    },
    /// Publish dead letters back to the queue, subject or topic they came
    /// from (confirmed by the broker before the dead letter is removed),
    /// with their failure counts reset and x-idem-replays one more; each
    /// message once (later copies are removed); needs a filter or --all
    Replay {
        #[command(flatten)]
        at: Where,
        #[command(flatten)]
        filter: FilterArgs,
        /// Every dead letter
        #[arg(long, conflicts_with_all = ["reason", "older_than", "id", "in_group"])]
        all: bool,
        /// At most this many
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Replay dead letters older than their handler's ttl too (they run
        /// as new messages: a record of their key may have expired)
        #[arg(long)]
        expired: bool,
        /// Replay the one dead letter --id names with this payload instead
        /// of its own (a file, or - for standard input); the copy carries
        /// x-idem-edited
        #[arg(
            long,
            value_name = "FILE",
            requires = "id",
            conflicts_with_all = ["all", "reason", "older_than", "in_group", "limit"]
        )]
        payload: Option<std::path::PathBuf>,
    },
    /// Delete dead letters for good; needs a filter or --all (Kafka: --all
    /// only, where the broker deletes records)
    Purge {
        #[command(flatten)]
        at: Where,
        #[command(flatten)]
        filter: FilterArgs,
        /// Every dead letter
        #[arg(long, conflicts_with_all = ["reason", "older_than", "id", "in_group"])]
        all: bool,
        /// At most this many
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
}

/// Where the dead letters are: one broker, and the work queue, stream or
/// topic whose dead letters they are (or their own name).
#[derive(Debug, Args)]
#[command(next_help_heading = "Dead letters")]
#[command(group(ArgGroup::new("broker").required(true).args(["rabbitmq", "nats", "kafka", "rocketmq"])))]
pub(crate) struct Where {
    /// A RabbitMQ broker (amqp://user:pass@host:5672/vhost), with --queue
    #[arg(long, value_name = "URL")]
    rabbitmq: Option<String>,
    /// A NATS server with JetStream (nats://host:4222), with --stream
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Kafka brokers (host:port, comma-separated), with --topic
    #[arg(long, value_name = "BROKERS")]
    kafka: Option<String>,
    /// RocketMQ name servers (host:port, `;`-separated), with --group
    #[arg(long, value_name = "NAMESRV")]
    rocketmq: Option<String>,
    /// The consumer's work queue: its dead letters are QUEUE.idem.dead
    #[arg(long, value_name = "QUEUE", requires = "rabbitmq")]
    queue: Option<String>,
    /// The consumer's stream: its dead letters are STREAM_DEAD
    #[arg(long, value_name = "STREAM", requires = "nats")]
    stream: Option<String>,
    /// The consumer's topic: its dead letters are TOPIC-dlt
    #[arg(long, value_name = "TOPIC", requires = "kafka")]
    topic: Option<String>,
    /// The consumer's group: its dead letters are %DLQ%GROUP
    #[arg(long, value_name = "GROUP", requires = "rocketmq")]
    group: Option<String>,
    /// The dead-letter queue, stream or topic itself, instead of the one
    /// derived from --queue, --stream, --topic or --group
    #[arg(long, value_name = "NAME")]
    dead_letters: Option<String>,
}

/// The filters of `list`, `replay` and `purge`; together, all must hold.
#[derive(Debug, Args)]
#[command(next_help_heading = "Filters (together, all must hold)")]
pub(crate) struct FilterArgs {
    /// Only those whose reason holds this text (ignoring case)
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Only those dead-lettered at least this long ago: 90s, 10m, 2h, 1d,
    /// 1h30m
    #[arg(long, value_name = "AGE", value_parser = age)]
    older_than: Option<Duration>,
    /// Only this one (repeatable)
    #[arg(long, value_name = "ID")]
    id: Vec<String>,
    /// Only those of this group, as `groups` shows it (repeatable)
    #[arg(long, value_name = "GROUP")]
    in_group: Vec<String>,
}

/// Reads an age: whole numbers with units `ms`, `s`, `m`, `h`, `d`, one
/// after another (`1h30m`).
pub(crate) fn age(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not an age: write it as 90s, 10m, 2h, 1d or 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3_600),
            "d" => Duration::from_secs(86_400),
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let n = u32::try_from(n).map_err(|_| bad())?;
        total = total.checked_add(unit * n).ok_or_else(bad)?;
    }
    Ok(total)
}

/// Which broker, and the dead letters' name there.
#[derive(Debug)]
#[cfg_attr(
    not(all(
        feature = "rabbitmq",
        feature = "nats",
        feature = "kafka",
        feature = "rocketmq"
    )),
    allow(dead_code)
)]
enum Target<'a> {
    RabbitMq { url: &'a str, name: String },
    Nats { url: &'a str, name: String },
    Kafka { brokers: &'a str, name: String },
    RocketMq { name_server: &'a str, name: String },
}

impl Target<'_> {
    /// The cargo feature this broker needs, and whether this build has it.
    fn feature(&self) -> (&'static str, bool) {
        match self {
            Target::RabbitMq { .. } => ("rabbitmq", cfg!(feature = "rabbitmq")),
            Target::Nats { .. } => ("nats", cfg!(feature = "nats")),
            Target::Kafka { .. } => ("kafka", cfg!(feature = "kafka")),
            Target::RocketMq { .. } => ("rocketmq", cfg!(feature = "rocketmq")),
        }
    }

    /// Refuses a broker this build has no feature for, saying which feature
    /// to build with.
    fn built(self) -> Result<Self, Failure> {
        let (feature, built) = self.feature();
        if built {
            return Ok(self);
        }
        Err(Failure::Usage(format!(
            "this idem was built without the cargo feature `{feature}`, which `idem dead --{feature}` needs: \
             install it with `cargo install idem-cli --features {feature}` \
             (or --features rabbitmq,nats,kafka,rocketmq for every broker)"
        )))
    }
}

impl Where {
    fn target(&self) -> Result<Target<'_>, Failure> {
        self.named_target()?.built()
    }

    fn named_target(&self) -> Result<Target<'_>, Failure> {
        let named = |work: &Option<String>, flag: &str, derive: fn(&str) -> String| match (
            &self.dead_letters,
            work,
        ) {
            (Some(name), _) if !name.trim().is_empty() => Ok(name.clone()),
            (_, Some(work)) if !work.trim().is_empty() => Ok(derive(work)),
            _ => Err(Failure::Usage(format!(
                "which dead letters? pass {flag} (the consumer's, whose dead letters are derived from it) or --dead-letters NAME"
            ))),
        };
        if let Some(url) = &self.rabbitmq {
            let name = named(&self.queue, "--queue QUEUE", |q| format!("{q}.idem.dead"))?;
            return Ok(Target::RabbitMq { url, name });
        }
        if let Some(url) = &self.nats {
            let name = named(&self.stream, "--stream STREAM", |s| format!("{s}_DEAD"))?;
            return Ok(Target::Nats { url, name });
        }
        if let Some(brokers) = &self.kafka {
            let name = named(&self.topic, "--topic TOPIC", |t| format!("{t}-dlt"))?;
            return Ok(Target::Kafka { brokers, name });
        }
        if let Some(name_server) = &self.rocketmq {
            let name = named(&self.group, "--group GROUP", |g| format!("%DLQ%{g}"))?;
            return Ok(Target::RocketMq { name_server, name });
        }
        Err(Failure::Usage(
            "which broker? pass --rabbitmq URL, --nats URL, --kafka BROKERS or --rocketmq NAMESRV"
                .into(),
        ))
    }
}

#[cfg(any(
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "rocketmq"
))]
pub(crate) use brokers::run;

/// A build without any broker: `target` refuses every broker, naming the
/// feature to build with.
#[cfg(not(any(
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "rocketmq"
)))]
pub(crate) async fn run(
    args: &DeadArgs,
    _json: bool,
    _timeout: Duration,
    _tls: Option<&idem_runtime::tls::Tls>,
) -> Result<String, Failure> {
    let (Action::List { at, .. }
    | Action::Groups { at, .. }
    | Action::Show { at, .. }
    | Action::Replay { at, .. }
    | Action::Purge { at, .. }) = &args.action;
    at.target().map(|_| String::new())
}

/// The commands, on the brokers this build has.
#[cfg(any(
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "rocketmq"
))]
mod brokers {
    use std::time::Duration;

    use idem_runtime::consume::dead::{
        DeadLetter, DeadLetterError, Edit, Group, Purged, Replayed, Selection, groups,
    };
    use serde::Serialize;

    use idem_runtime::tls::Tls;

    use super::{Action, DeadArgs, FilterArgs, Target};
    use crate::Failure;
    use crate::render::{cut, relative, table, when};
    use crate::tls::explained;

    impl FilterArgs {
        fn filter(&self, all: bool, limit: Option<usize>) -> Selection {
            let mut f = if all {
                Selection::all()
            } else {
                Selection::new()
            };
            for id in &self.id {
                f = f.id(id);
            }
            if let Some(reason) = &self.reason {
                f = f.reason(reason);
            }
            if let Some(age) = self.older_than {
                f = f.older_than(age);
            }
            for group in &self.in_group {
                f = f.group(group);
            }
            if let Some(n) = limit {
                f = f.limit(n);
            }
            f
        }
    }

    impl Target<'_> {
        fn name(&self) -> &str {
            match self {
                Target::RabbitMq { name, .. }
                | Target::Nats { name, .. }
                | Target::Kafka { name, .. }
                | Target::RocketMq { name, .. } => name,
            }
        }

        /// `queue `x` (RabbitMQ)`.
        fn described(&self) -> String {
            let (kind, broker) = match self {
                Target::RabbitMq { .. } => ("queue", "RabbitMQ"),
                Target::Nats { .. } => ("stream", "NATS"),
                Target::Kafka { .. } => ("topic", "Kafka"),
                Target::RocketMq { .. } => ("topic", "RocketMQ"),
            };
            format!("{kind} `{}` ({broker})", self.name())
        }

        async fn open(&self, timeout: Duration, tls: Option<&Tls>) -> Result<Opened, Failure> {
            let connect = async {
                match self {
                    #[cfg(feature = "rabbitmq")]
                    Target::RabbitMq { url, name } => {
                        use idem_runtime::consume::rabbitmq::dead::DeadLetters;
                        match tls {
                            Some(tls) => DeadLetters::connect_tls(url, name, tls).await,
                            None => DeadLetters::connect(url, name).await,
                        }
                        .map(|d| Opened::RabbitMq(Box::new(d)))
                    }
                    #[cfg(feature = "nats")]
                    Target::Nats { url, name } => {
                        use idem_runtime::consume::nats::dead::DeadLetters;
                        match tls {
                            Some(tls) => DeadLetters::connect_tls(url, name, tls).await,
                            None => DeadLetters::connect(url, name).await,
                        }
                        .map(|d| Opened::Nats(Box::new(d)))
                    }
                    #[cfg(feature = "kafka")]
                    Target::Kafka { brokers, name } => {
                        use idem_runtime::consume::kafka::dead::DeadLetters;
                        match tls {
                            Some(tls) => DeadLetters::connect_tls(brokers, name, tls).await,
                            None => DeadLetters::connect(brokers, name).await,
                        }
                        .map(|d| Opened::Kafka(Box::new(d)))
                    }
                    #[cfg(feature = "rocketmq")]
                    Target::RocketMq { name_server, name } => {
                        use idem_runtime::consume::rocketmq::dead::DeadLetters;
                        match tls {
                            Some(_) => Err(DeadLetterError::Unsupported {
                                broker: idem_runtime::consume::Broker::RocketMq,
                                what: "be reached over TLS".into(),
                                why: "idem's RocketMQ client speaks plain TCP; leave out --tls-*"
                                    .into(),
                            }),
                            None => DeadLetters::connect(name_server, name).await,
                        }
                        .map(|d| Opened::RocketMq(Box::new(d)))
                    }
                    #[allow(unreachable_patterns)]
                    other => Err(without(other)),
                }
            };
            match tokio::time::timeout(timeout, connect).await {
                Ok(opened) => opened.map_err(failure),
                Err(_) => Err(Failure::Store(format!(
                    "the broker did not answer within {}s (--timeout)",
                    timeout.as_secs()
                ))),
            }
        }
    }

    /// The error of a build without the broker's feature (which
    /// `Where::target` refuses first).
    #[allow(dead_code)]
    fn without(target: &Target<'_>) -> DeadLetterError {
        let broker = match target {
            Target::RabbitMq { .. } => idem_runtime::consume::Broker::RabbitMq,
            Target::Nats { .. } => idem_runtime::consume::Broker::Nats,
            Target::Kafka { .. } => idem_runtime::consume::Broker::Kafka,
            Target::RocketMq { .. } => idem_runtime::consume::Broker::RocketMq,
        };
        let (feature, _) = target.feature();
        DeadLetterError::Unsupported {
            broker,
            what: "be reached from this idem".into(),
            why: format!(
                "it was built without the cargo feature `{feature}` (cargo install idem-cli --features {feature})"
            ),
        }
    }

    /// The dead letters, opened on their broker.
    enum Opened {
        #[cfg(feature = "rabbitmq")]
        RabbitMq(Box<idem_runtime::consume::rabbitmq::dead::DeadLetters>),
        #[cfg(feature = "nats")]
        Nats(Box<idem_runtime::consume::nats::dead::DeadLetters>),
        #[cfg(feature = "kafka")]
        Kafka(Box<idem_runtime::consume::kafka::dead::DeadLetters>),
        #[cfg(feature = "rocketmq")]
        RocketMq(Box<idem_runtime::consume::rocketmq::dead::DeadLetters>),
    }

    /// Calls the same method on whichever broker's dead letters `opened` is.
    macro_rules! on {
        ($opened:expr, $d:ident => $call:expr) => {
            match $opened {
                #[cfg(feature = "rabbitmq")]
                Opened::RabbitMq($d) => $call,
                #[cfg(feature = "nats")]
                Opened::Nats($d) => $call,
                #[cfg(feature = "kafka")]
                Opened::Kafka($d) => $call,
                #[cfg(feature = "rocketmq")]
                Opened::RocketMq($d) => $call,
            }
        };
    }

    impl Opened {
        async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
            on!(self, d => d.list(filter).await)
        }
        async fn count(&self) -> Result<u64, DeadLetterError> {
            on!(self, d => d.count().await)
        }
        async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
            on!(self, d => d.show(id).await)
        }
        async fn replay(&self, filter: &Selection) -> Result<Replayed, DeadLetterError> {
            on!(self, d => d.replay(filter).await)
        }
        async fn replay_edited(&self, edit: &Edit) -> Result<Replayed, DeadLetterError> {
            on!(self, d => d.replay_edited(edit).await)
        }
        async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
            on!(self, d => d.purge(filter).await)
        }
        async fn close(self) {
            match self {
                #[cfg(feature = "rabbitmq")]
                Opened::RabbitMq(d) => d.close().await,
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
    }

    /// The exit code of a dead-letter error.
    fn failure(e: DeadLetterError) -> Failure {
        match e {
            e @ (DeadLetterError::Missing { .. } | DeadLetterError::NotFound { .. }) => {
                Failure::NotFound(e.to_string())
            }
            e @ (DeadLetterError::BadId { .. } | DeadLetterError::Unfiltered { .. }) => {
                Failure::Usage(e.to_string())
            }
            e @ DeadLetterError::Unsupported { .. } => Failure::Refused(e.to_string()),
            e => Failure::Store(explained(&e)),
        }
    }

    /// Runs `idem dead ...`; the text to print.
    pub(crate) async fn run(
        args: &DeadArgs,
        json: bool,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<String, Failure> {
        let now = idem_runtime::clock::Clock::now_millis(&idem_runtime::clock::SystemClock);
        let (at, action) = match &args.action {
            Action::List { at, .. }
            | Action::Groups { at, .. }
            | Action::Show { at, .. }
            | Action::Replay { at, .. }
            | Action::Purge { at, .. } => (at, &args.action),
        };
        let target = at.target()?;
        // A replay or purge that names nothing is refused before connecting.
        let chosen = match action {
            Action::Replay {
                filter, all, limit, ..
            }
            | Action::Purge {
                filter, all, limit, ..
            } => {
                let chosen = filter.filter(*all, *limit);
                if !chosen.is_selective() {
                    let verb = if matches!(action, Action::Replay { .. }) {
                        "replay"
                    } else {
                        "purge"
                    };
                    return Err(Failure::Usage(format!(
                        "{verb} takes the dead letters you name: pass --id ID, --reason TEXT, --older-than AGE or --in-group GROUP, or --all for every one"
                    )));
                }
                Some(chosen)
            }
            _ => None,
        };
        // An edited replay: its payload read before connecting.
        let edit = match action {
            Action::Replay {
                filter,
                payload: Some(path),
                expired,
                ..
            } => {
                let [id] = filter.id.as_slice() else {
                    return Err(Failure::Usage(
                        "--payload replaces the payload of one dead letter: name it with one --id"
                            .into(),
                    ));
                };
                let payload = read_payload(path)?;
                let edit = Edit::new(id.clone(), payload);
                Some(if *expired { edit.expired() } else { edit })
            }
            _ => None,
        };
        let opened = target.open(timeout, tls).await?;
        let done = match action {
            Action::List { filter, limit, .. } => {
                let filter = filter.filter(false, Some(*limit));
                list(&opened, &target, &filter, *limit, json, now).await
            }
            Action::Groups { filter, .. } => {
                let filter = filter.filter(false, None);
                grouped(&opened, &target, &filter, json, now).await
            }
            Action::Show { id, .. } => match opened.show(id).await {
                Ok(d) if json => to_json(&DeadJson::new(&d, now, true)),
                Ok(d) => Ok(shown(&d, &target, now)),
                Err(e) => Err(failure(e)),
            },
            Action::Replay { expired, .. } => {
                let done = match &edit {
                    Some(edit) => opened.replay_edited(edit).await,
                    None => {
                        let filter = chosen.unwrap_or_default();
                        let filter = if *expired { filter.expired() } else { filter };
                        opened.replay(&filter).await
                    }
                };
                match done {
                    Ok(done) => replayed(&done, &target, json),
                    Err(e) => Err(failure(e)),
                }
            }
            Action::Purge { .. } => {
                let filter = chosen.unwrap_or_default();
                match opened.purge(&filter).await {
                    Ok(done) => purged(&done, &target, json),
                    Err(e) => Err(failure(e)),
                }
            }
        };
        opened.close().await;
        done
    }

    async fn list(
        opened: &Opened,
        target: &Target<'_>,
        filter: &Selection,
        limit: usize,
        json: bool,
        now: i64,
    ) -> Result<String, Failure> {
        let found = opened.list(filter).await.map_err(failure)?;
        let total = opened.count().await.map_err(failure)?;
        if json {
            #[derive(Serialize)]
            struct Listing<'a> {
                broker: &'static str,
                dead_letters: &'a str,
                total: u64,
                count: usize,
                items: Vec<DeadJson<'a>>,
            }
            return to_json(&Listing {
                broker: broker_name(target),
                dead_letters: target.name(),
                total,
                count: found.len(),
                items: found.iter().map(|d| DeadJson::new(d, now, false)).collect(),
            });
        }
        if found.is_empty() {
            return Ok(format!(
                "no dead letters{} in {} ({total} in all)\n",
                if filter.is_selective() {
                    " matching"
                } else {
                    ""
                },
                target.described()
            ));
        }
        let rows: Vec<Vec<String>> = found
            .iter()
            .map(|d| {
                vec![
                    d.id.clone(),
                    d.group(),
                    d.dead_at_ms.map_or("-".to_owned(), |at| relative(at, now)),
                    number(d.attempts),
                    d.replays.to_string(),
                    d.origin.as_deref().map_or("-".to_owned(), |o| cut(o, 30)),
                    d.size().to_string(),
                    d.message_id
                        .as_deref()
                        .map_or("-".to_owned(), |m| cut(m, 24)),
                    d.reason.as_deref().map_or("-".to_owned(), |r| cut(r, 60)),
                ]
            })
            .collect();
        let mut out = format!(
            "{} of {total} dead letter{} in {}, oldest first:\n",
            found.len(),
            if total == 1 { "" } else { "s" },
            target.described()
        );
        out.push_str(&table(
            &[
                "ID",
                "GROUP",
                "DEAD-LETTERED",
                "ATTEMPTS",
                "REPLAYS",
                "FROM",
                "SIZE",
                "MESSAGE ID",
                "REASON",
            ],
            &rows,
        ));
        if found.len() == limit {
            out.push_str(&format!("(the first {limit}; --limit N for more)\n"));
        }
        Ok(out)
    }

    /// `idem dead groups`: the dead letters `filter` selects, by cause.
    async fn grouped(
        opened: &Opened,
        target: &Target<'_>,
        filter: &Selection,
        json: bool,
        now: i64,
    ) -> Result<String, Failure> {
        let found = opened.list(filter).await.map_err(failure)?;
        let found = groups(&found);
        if json {
            #[derive(Serialize)]
            struct GroupJson<'a> {
                id: &'a str,
                handler: Option<&'a str>,
                kind: Option<&'a str>,
                fingerprint: &'a str,
                messages: u64,
                dead_letters: u64,
                replays: u64,
                first_seen_ms: Option<i64>,
                last_seen_ms: Option<i64>,
                first_seen: Option<String>,
                last_seen: Option<String>,
                example: &'a str,
                example_reason: Option<&'a str>,
            }
            #[derive(Serialize)]
            struct Groups<'a> {
                broker: &'static str,
                dead_letters: &'a str,
                count: usize,
                groups: Vec<GroupJson<'a>>,
            }
            fn item(g: &Group) -> GroupJson<'_> {
                GroupJson {
                    id: &g.id,
                    handler: g.handler.as_deref(),
                    kind: g.kind.as_deref(),
                    fingerprint: &g.fingerprint,
                    messages: g.messages,
                    dead_letters: g.dead_letters,
                    replays: g.replays,
                    first_seen_ms: g.first_seen_ms,
                    last_seen_ms: g.last_seen_ms,
                    first_seen: g.first_seen_ms.map(crate::render::utc),
                    last_seen: g.last_seen_ms.map(crate::render::utc),
                    example: &g.example,
                    example_reason: g.example_reason.as_deref(),
                }
            }
            return to_json(&Groups {
                broker: broker_name(target),
                dead_letters: target.name(),
                count: found.len(),
                groups: found.iter().map(item).collect(),
            });
        }
        if found.is_empty() {
            return Ok(format!(
                "no dead letters{} in {}\n",
                if filter.is_selective() {
                    " matching"
                } else {
                    ""
                },
                target.described()
            ));
        }
        let seen = |at: Option<i64>| at.map_or("-".to_owned(), |at| relative(at, now));
        let rows: Vec<Vec<String>> = found
            .iter()
            .map(|g| {
                vec![
                    g.id.clone(),
                    g.messages.to_string(),
                    g.dead_letters.to_string(),
                    g.replays.to_string(),
                    seen(g.first_seen_ms),
                    seen(g.last_seen_ms),
                    g.handler.as_deref().map_or("-".to_owned(), |h| cut(h, 24)),
                    g.kind.as_deref().unwrap_or("-").to_owned(),
                    cut(&g.fingerprint, 60),
                ]
            })
            .collect();
        let n = found.len();
        let mut out = format!(
            "{n} group{} of dead letters in {}, the biggest first:\n",
            if n == 1 { "" } else { "s" },
            target.described()
        );
        out.push_str(&table(
            &[
                "GROUP",
                "MESSAGES",
                "DEAD LETTERS",
                "REPLAYS",
                "FIRST SEEN",
                "LAST SEEN",
                "HANDLER",
                "KIND",
                "ERROR",
            ],
            &rows,
        ));
        out.push_str("(replay or purge one with --in-group GROUP)\n");
        Ok(out)
    }

    fn broker_name(target: &Target<'_>) -> &'static str {
        match target {
            Target::RabbitMq { .. } => "rabbitmq",
            Target::Nats { .. } => "nats",
            Target::Kafka { .. } => "kafka",
            Target::RocketMq { .. } => "rocketmq",
        }
    }

    fn number(n: Option<u32>) -> String {
        n.map_or("-".to_owned(), |n| n.to_string())
    }

    /// A dead letter as `show` writes it: one field a line, then its headers
    /// and its payload.
    fn shown(d: &DeadLetter, target: &Target<'_>, now: i64) -> String {
        let dash = |v: Option<&str>| v.unwrap_or("-").replace(['\n', '\r'], " ");
        let mut lines = vec![
            ("id", d.id.clone()),
            ("in", target.described()),
            ("reason", dash(d.reason.as_deref())),
            ("from", dash(d.origin.as_deref())),
            (
                "dead-lettered",
                d.dead_at_ms.map_or("-".to_owned(), |at| when(at, now)),
            ),
            ("attempts", number(d.attempts)),
            ("retries", number(d.retries)),
            ("replays", d.replays.to_string()),
            ("last error", dash(d.last_error.as_deref())),
            ("group", d.group()),
            ("handler", dash(d.handler.as_deref())),
            ("error kind", dash(d.error_kind.as_deref())),
            ("error", dash(d.error.as_deref())),
            ("key", dash(d.key.as_deref())),
            (
                "ttl",
                d.ttl.map_or("-".to_owned(), |t| {
                    let note = if d.expired(now) {
                        " (it is older: a record of its key may have expired)"
                    } else {
                        ""
                    };
                    format!("{}s{note}", t.as_secs())
                }),
            ),
            ("message id", dash(d.message_id.as_deref())),
            ("size", format!("{} bytes", d.size())),
        ];
        if let Some(replaced) = &d.edited {
            lines.push((
                "edited",
                format!("replayed with an edited payload (it replaced {replaced})"),
            ));
        }
        if let Some(to) = &d.replayed_to {
            lines.push(("replayed to", to.clone()));
        }
        let mut out = String::new();
        for (label, value) in lines {
            out.push_str(&format!("{label:<15}{value}\n"));
        }
        out.push_str("headers:\n");
        for (name, value) in &d.headers {
            out.push_str(&format!("  {name}: {}\n", value.replace(['\n', '\r'], " ")));
        }
        out.push_str("payload:\n");
        out.push_str(&String::from_utf8_lossy(&d.payload));
        if !d.payload.ends_with(b"\n") {
            out.push('\n');
        }
        out
    }

    fn replayed(done: &Replayed, target: &Target<'_>, json: bool) -> Result<String, Failure> {
        if json {
            #[derive(Serialize)]
            struct Replay<'a> {
                id: &'a str,
                to: &'a str,
                replays: u32,
                edited: bool,
            }
            #[derive(Serialize)]
            struct Skip<'a> {
                id: &'a str,
                why: &'a str,
            }
            #[derive(Serialize)]
            struct Copy<'a> {
                id: &'a str,
                of: &'a str,
            }
            #[derive(Serialize)]
            struct Done<'a> {
                broker: &'static str,
                dead_letters: &'a str,
                count: usize,
                replayed: Vec<Replay<'a>>,
                copies: Vec<Copy<'a>>,
                skipped: Vec<Skip<'a>>,
            }
            return to_json(&Done {
                broker: broker_name(target),
                dead_letters: target.name(),
                count: done.count(),
                replayed: done
                    .replayed
                    .iter()
                    .map(|r| Replay {
                        id: &r.id,
                        to: &r.to,
                        replays: r.replays,
                        edited: r.edited,
                    })
                    .collect(),
                copies: done
                    .copies
                    .iter()
                    .map(|c| Copy {
                        id: &c.id,
                        of: &c.of,
                    })
                    .collect(),
                skipped: done
                    .skipped
                    .iter()
                    .map(|s| Skip {
                        id: &s.id,
                        why: &s.why,
                    })
                    .collect(),
            });
        }
        let n = done.count();
        let mut out = format!(
            "replayed {n} dead letter{} of {}\n",
            if n == 1 { "" } else { "s" },
            target.described()
        );
        for r in &done.replayed {
            let edited = if r.edited { ", edited" } else { "" };
            out.push_str(&format!(
                "  {} -> {} (replay {}{edited})\n",
                r.id, r.to, r.replays
            ));
        }
        for c in &done.copies {
            out.push_str(&format!(
                "removed {}: a copy of {}, replayed once\n",
                c.id, c.of
            ));
        }
        for s in &done.skipped {
            out.push_str(&format!("left {}: {}\n", s.id, s.why));
        }
        Ok(out)
    }

    fn purged(done: &Purged, target: &Target<'_>, json: bool) -> Result<String, Failure> {
        if json {
            #[derive(Serialize)]
            struct Done<'a> {
                broker: &'static str,
                dead_letters: &'a str,
                purged: u64,
                ids: &'a [String],
            }
            return to_json(&Done {
                broker: broker_name(target),
                dead_letters: target.name(),
                purged: done.purged,
                ids: &done.ids,
            });
        }
        let mut out = format!(
            "purged {} dead letter{} of {}\n",
            done.purged,
            if done.purged == 1 { "" } else { "s" },
            target.described()
        );
        for id in &done.ids {
            out.push_str(&format!("  {id}\n"));
        }
        Ok(out)
    }

    /// A dead letter as `--json` writes it.
    #[derive(Debug, Serialize)]
    struct DeadJson<'a> {
        id: &'a str,
        reason: Option<&'a str>,
        attempts: Option<u32>,
        retries: Option<u32>,
        replays: u32,
        last_error: Option<&'a str>,
        dead_at_ms: Option<i64>,
        dead_at: Option<String>,
        age_ms: Option<u64>,
        origin: Option<&'a str>,
        message_id: Option<&'a str>,
        size: usize,
        replayed_to: Option<&'a str>,
        group: String,
        handler: Option<&'a str>,
        error_kind: Option<&'a str>,
        error: Option<&'a str>,
        key: Option<&'a str>,
        ttl_ms: Option<u128>,
        expired: bool,
        edited: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        headers: Option<Vec<[&'a str; 2]>>,
        /// The payload as JSON if it is, else as text.
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<serde_json::Value>,
    }

    impl<'a> DeadJson<'a> {
        fn new(d: &'a DeadLetter, now: i64, whole: bool) -> Self {
            DeadJson {
                id: &d.id,
                reason: d.reason.as_deref(),
                attempts: d.attempts,
                retries: d.retries,
                replays: d.replays,
                last_error: d.last_error.as_deref(),
                dead_at_ms: d.dead_at_ms,
                dead_at: d.dead_at_ms.map(crate::render::utc),
                age_ms: d.age_ms(now),
                origin: d.origin.as_deref(),
                message_id: d.message_id.as_deref(),
                size: d.size(),
                replayed_to: d.replayed_to.as_deref(),
                group: d.group(),
                handler: d.handler.as_deref(),
                error_kind: d.error_kind.as_deref(),
                error: d.error.as_deref(),
                key: d.key.as_deref(),
                ttl_ms: d.ttl.map(|t| t.as_millis()),
                expired: d.expired(now),
                edited: d.edited.as_deref(),
                headers: whole.then(|| {
                    d.headers
                        .iter()
                        .map(|(n, v)| [n.as_str(), v.as_str()])
                        .collect()
                }),
                payload: whole.then(|| {
                    serde_json::from_slice(&d.payload).unwrap_or_else(|_| {
                        serde_json::Value::String(String::from_utf8_lossy(&d.payload).into_owned())
                    })
                }),
            }
        }
    }

    /// The payload of an edited replay: the file `path`, or standard input
    /// for `-`.
    fn read_payload(path: &std::path::Path) -> Result<Vec<u8>, Failure> {
        let read = if path == std::path::Path::new("-") {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut all).map(|_| all)
        } else {
            std::fs::read(path)
        };
        read.map_err(|e| Failure::Usage(format!("cannot read the payload {}: {e}", path.display())))
    }

    /// `value` as pretty JSON and a newline.
    fn to_json<T: Serialize>(value: &T) -> Result<String, Failure> {
        serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|e| Failure::Store(format!("cannot write JSON: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::age;
    use std::time::Duration;

    #[test]
    fn ages_read_as_written() {
        assert_eq!(age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(age("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(age("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(age("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "10", "m", "10x", "-5m", "1.5h", "99999999999d"] {
            assert!(age(bad).is_err(), "{bad}");
        }
    }
}
