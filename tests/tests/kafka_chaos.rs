//! Chaos on Kafka: a producer publishes 3,000 messages keyed by their id, a
//! fifth of them twice, to a topic of 4 partitions; three members of one
//! consumer group (this test binary, re-run as `kafka_chaos_member`) apply
//! them through a transaction-mode Postgres handler. One member is killed
//! with SIGKILL at random intervals and started again, so that the group
//! rebalances under load, and the members' Postgres connections are
//! terminated now and then. Then the members stop gracefully, and a fresh
//! set drains what is left (see `chaos` for why). At the end the truth is
//! read from the business table (every message applied exactly once: 0
//! doubled, 0 lost) and from the broker (every partition of the topic and of
//! its retry topics committed at its end). Three poison messages among them
//! are dead-lettered, some maybe twice (a member killed between a dead
//! letter's forward and its offset's commit writes it again): their dead
//! letters make one group of three messages, and the group's replay runs
//! each once and removes the copies. Run twice:
//! offsets in the broker, then in the handler's transaction (`offsets_in`).
//! Each run is bounded to 120 s; the counts are printed, with the seed
//! (`IDEM_KCHAOS_SEED` replays one). `RUST_LOG` (`warn`,
//! `idem_runtime=debug`...) shows the members' logs on stderr.

mod chaos;

#[path = "kafka_chaos/member.rs"]
mod member;
#[path = "kafka_chaos/scenario.rs"]
mod scenario;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chaos::Applied;
use futures_util::future::join_all;
use idem_runtime::PgStore;
use idem_runtime::consume::kafka;
use idem_tests::brokers::{DeleteTopics, Kafka, TANSU_ONE_RECORD_A_BATCH, kafka_brokers};
use idem_tests::{DropTables, pg_pool, unique_table};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::AssertSqlSafe;

/// Logical messages, and how many of them are published twice.
const MESSAGES: i64 = 3_000;
const TWICE_EVERY: i64 = 5;
const PUBLISHED_TWICE: i64 = (MESSAGES + TWICE_EVERY - 1) / TWICE_EVERY;
/// Messages that do not decode, published among the others (in these
/// slices of 100) and dead-lettered.
const POISON_SLICES: [usize; 3] = [3, 10, 20];
const POISON: i64 = POISON_SLICES.len() as i64;
const PARTITIONS: i32 = 4;
const MEMBERS: usize = 3;
/// Members killed in a run; the group settles and drains after the last.
const KILLS: u32 = 6;
/// How long the whole run may take before it fails.
const DEADLINE: Duration = Duration::from_secs(120);
/// The members' session timeout: a killed member's partitions go to the
/// others this long after its last heartbeat.
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// One at a time: the two runs share the machine's two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a member printed at its graceful end.
#[derive(Debug, Default, Clone, Copy)]
struct MemberReport {
    acked: u64,
    duplicates: u64,
    retried: u64,
    dead_lettered: u64,
    rebalances: u64,
    alerts: u64,
}

impl MemberReport {
    fn parse(line: &str) -> Option<MemberReport> {
        let n: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [
            acked,
            duplicates,
            retried,
            dead_lettered,
            rebalances,
            alerts,
        ] = n[..]
        else {
            return None;
        };
        Some(MemberReport {
            acked,
            duplicates,
            retried,
            dead_lettered,
            rebalances,
            alerts,
        })
    }
}

/// What every member, killed or not, said while it ran.
#[derive(Debug, Default)]
struct Heard {
    /// Assignments of one partition or more the members took (each
    /// member's rebalance callback).
    assignments: AtomicU64,
    /// Warnings and errors the members logged, by message.
    warnings: Mutex<BTreeMap<String, u64>>,
}

/// A member process of this binary.
struct Member {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Partitions the member holds, by its last assignment or revocation.
    holds: Arc<AtomicU64>,
    report: Arc<Mutex<Option<MemberReport>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    /// Starts a member and waits until it is about to join the group.
    fn start(env: &[(&str, String)], heard: &Arc<Heard>) -> Member {
        let exe = std::env::current_exe().expect("test binary");
        let mut command = Command::new(exe);
        command
            .args([
                "member::kafka_chaos_member",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start a member");
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("READY") => break,
                Some(_) => {}
                None => panic!("a member exited before it was ready"),
            }
        }
        let report = Arc::new(Mutex::new(None));
        let holds = Arc::new(AtomicU64::new(0));
        let (heard, into, held) = (Arc::clone(heard), Arc::clone(&report), Arc::clone(&holds));
        // Keep reading so the child never blocks on a full pipe.
        let reader = std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Some(at) = line.find("ASSIGNED ") {
                    let n: u64 = line[at + "ASSIGNED ".len()..].trim().parse().unwrap_or(0);
                    held.store(n, Ordering::SeqCst);
                    if n > 0 {
                        heard.assignments.fetch_add(1, Ordering::SeqCst);
                    }
                } else if line.contains("REVOKED") {
                    held.store(0, Ordering::SeqCst);
                } else if let Some(at) = line.find("EVENT ") {
                    let what = line[at + "EVENT ".len()..].to_owned();
                    *heard.warnings.lock().unwrap().entry(what).or_default() += 1;
                } else if let Some(at) = line.find("REPORT ") {
                    *into.lock().unwrap() = MemberReport::parse(&line[at + "REPORT ".len()..]);
                }
            }
        });
        Member {
            child,
            stdin,
            holds,
            report,
            reader: Some(reader),
        }
    }

    /// SIGKILL: no leave, no commit; the group finds out at the session's end.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes the member's stdin: it stops taking, settles what is in
    /// flight, commits, leaves the group, prints its report and exits.
    fn stop(mut self) -> MemberReport {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("the member's status") {
                assert!(status.success(), "a member failed at its end: {status}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a member did not shut down within 30 s of its stdin closing"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let report = *self.report.lock().unwrap();
        report.expect("a member ended without its report")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Random intervals and victims; the seed is printed, and
/// `IDEM_KCHAOS_SEED` replays one.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("IDEM_KCHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        Rng(seed.max(1))
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One run's names: the topic and group, the tables, and their guards.
struct Run {
    kafka: Kafka,
    topic: String,
    group: String,
    retry_topics: Vec<String>,
    dead_letter_topic: String,
    table: String,
    dedup: String,
    offsets_table: String,
    offsets_in_db: bool,
    admin: sqlx::PgPool,
    /// Each partition's end, from the producer's delivery reports.
    produced: Mutex<BTreeMap<i32, i64>>,
    _topics: DeleteTopics,
    _tables: DropTables,
}

impl Run {
    async fn open(offsets_in_db: bool) -> Option<Run> {
        let admin = pg_pool(4).await?;
        let kafka = idem_tests::brokers::kafka().await?;
        let topic = unique_table("kchaos");
        let group = format!("{topic}-group");
        let names = kafka::Consumer::new(kafka_brokers(), group.clone(), topic.clone());
        let (retry_topics, dead_letter_topic) = (names.retry_topics(), names.dead_letter_topic());
        let mut all = vec![
            topic.clone(),
            dead_letter_topic.clone(),
            kafka::dead::DeadLetters::ledger_name(&dead_letter_topic),
        ];
        all.extend(retry_topics.iter().cloned());
        let topics = DeleteTopics::new(all);
        let (table, dedup) = (unique_table("kchaos_effects"), unique_table("kchaos_dedup"));
        let (seen, offsets_table) = (format!("{table}_seen"), format!("{dedup}_kafka_offsets"));
        let tables = DropTables::new(&[&table, &seen, &dedup, &offsets_table]);
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {seen} (kind TEXT NOT NULL)"
        )))
        .execute(&admin)
        .await
        .expect("counts table");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)"
        )))
        .execute(&admin)
        .await
        .expect("business table");
        PgStore::from_pool(admin.clone())
            .with_table(&dedup)
            .expect("table")
            .migrate()
            .await
            .expect("migrate");
        kafka.create_topic(&topic, PARTITIONS).await;
        Some(Run {
            kafka,
            topic,
            group,
            retry_topics,
            dead_letter_topic,
            table,
            dedup,
            offsets_table,
            offsets_in_db,
            admin,
            produced: Mutex::default(),
            _topics: topics,
            _tables: tables,
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("IDEM_KCHAOS_TOPIC", self.topic.clone()),
            ("IDEM_KCHAOS_GROUP", self.group.clone()),
            ("IDEM_KCHAOS_DEDUP", self.dedup.clone()),
        ];
        if self.offsets_in_db {
            env.push(("IDEM_KCHAOS_OFFSETS_IN_DB", "1".to_owned()));
        }
        env
    }

    /// Publishes every message, a fifth of them twice, keyed by id, in
    /// slices over a few seconds so that the chaos meets them in flight.
    /// One record a batch: tansu 0.6 answers a fetch from an offset inside
    /// a batch with the next batch, so a member resuming from a commit in
    /// the middle of one would never see the rest of it.
    async fn produce(&self) {
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .set("acks", "all")
            .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
            .create()
            .expect("a producer");
        let ids: Vec<i64> = (0..MESSAGES).collect();
        for (n, slice) in ids.chunks(100).enumerate() {
            let mut records = Vec::new();
            if POISON_SLICES.contains(&n) {
                records.push((
                    format!("poison-{n}"),
                    format!(r#"{{"poison":{n}}}"#).into_bytes(),
                ));
            }
            for id in slice {
                let payload = serde_json::to_vec(&Applied {
                    message_id: *id,
                    table: self.table.clone(),
                })
                .expect("encode");
                let copies = if id % TWICE_EVERY == 0 { 2 } else { 1 };
                for _ in 0..copies {
                    records.push((id.to_string(), payload.clone()));
                }
            }
            let sent = join_all(records.iter().map(|(key, payload)| {
                producer.send(
                    FutureRecord::to(&self.topic).key(key).payload(payload),
                    Duration::from_secs(10),
                )
            }))
            .await;
            for s in sent {
                let d = s.map_err(|(e, _)| e).expect("publish");
                let mut ends = self.produced.lock().unwrap();
                let end = ends.entry(d.partition).or_default();
                *end = (*end).max(d.offset + 1);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// How many messages took effect so far.
    async fn applied(&self) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {}",
            self.table
        )))
        .fetch_one(&self.admin)
        .await
        .expect("count")
    }

    /// The topic and its retry topics.
    fn consumed_topics(&self) -> Vec<String> {
        let mut all = vec![self.topic.clone()];
        all.extend(self.retry_topics.iter().cloned());
        all
    }

    /// Partitions of the consumed topics whose committed offset is not at
    /// their end, as `topic/partition committed end`; with offsets in the
    /// database, those whose offsets row is not.
    async fn behind(&self, ends: &Ends, in_db: bool) -> Vec<String> {
        let stored: Vec<(String, i32, i64)> = if in_db {
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT topic, partition_id, next_offset FROM {} WHERE consumer_group = $1",
                self.offsets_table
            )))
            .bind(&self.group)
            .fetch_all(&self.admin)
            .await
            .unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut behind = Vec::new();
        for topic in self.consumed_topics() {
            let committed: Vec<(i32, Option<i64>)> = if in_db {
                stored
                    .iter()
                    .filter(|(t, _, _)| *t == topic)
                    .map(|(_, p, o)| (*p, Some(*o)))
                    .collect()
            } else {
                self.kafka.committed(&self.group, &topic).await
            };
            for p in 0..PARTITIONS {
                let end = ends.of(&topic, p);
                let at = committed
                    .iter()
                    .find(|(cp, _)| *cp == p)
                    .and_then(|(_, o)| *o);
                if at.unwrap_or(0) != end {
                    behind.push(format!("{topic}/{p} {at:?} {end}"));
                }
            }
        }
        behind
    }

    /// Where the run is at the end: everything applied, and committed at
    /// every partition's end where the mode keeps its offsets.
    async fn done(&self) -> bool {
        if self.applied().await < MESSAGES {
            return false;
        }
        let ends = Ends::scan(self.all_topics()).await;
        self.behind(&ends, self.offsets_in_db).await.is_empty()
    }

    /// The topic, its retry topics and its dead-letter topic.
    fn all_topics(&self) -> Vec<String> {
        let mut all = self.consumed_topics();
        all.push(self.dead_letter_topic.clone());
        all
    }

    /// Terminates the members' Postgres connections; how many.
    async fn terminate_backends(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&self.dedup)
        .fetch_one(&self.admin)
        .await
        .expect("terminate")
    }
}

/// The partitions' ends (one past their last offset) of some topics, read
/// by consuming them from the beginning until nothing more comes: the high
/// watermarks tansu 0.6 answers (`Kafka::ends`) are one past the first
/// offset of a partition's last batch, short of the rest of that batch.
#[derive(Debug, Default)]
struct Ends {
    ends: BTreeMap<(String, i32), i64>,
    /// Where each message id's copies are: `topic/partition@offset`.
    copies: BTreeMap<i64, Vec<String>>,
}

impl Ends {
    async fn scan(topics: Vec<String>) -> Ends {
        tokio::task::spawn_blocking(move || {
            let c: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", kafka_brokers())
                .set("group.id", unique_table("kchaos_scan"))
                .set("enable.auto.commit", "false")
                .create()
                .expect("a client");
            let mut tpl = TopicPartitionList::new();
            let (mut ends, mut copies) = (BTreeMap::new(), BTreeMap::<i64, Vec<String>>::new());
            for t in &topics {
                for p in 0..PARTITIONS {
                    tpl.add_partition_offset(t, p, Offset::Beginning)
                        .expect("a partition");
                    ends.insert((t.clone(), p), 0);
                }
            }
            c.assign(&tpl).expect("assign");
            // Two seconds for the first message, one after the last.
            let (mut last, mut quiet) = (Instant::now(), Duration::from_secs(2));
            while last.elapsed() < quiet {
                match c.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let end = ends
                            .entry((m.topic().to_owned(), m.partition()))
                            .or_default();
                        *end = (*end).max(m.offset() + 1);
                        if let Some(Ok(msg)) = m.payload().map(serde_json::from_slice::<Applied>) {
                            copies.entry(msg.message_id).or_default().push(format!(
                                "{}/{}@{}",
                                m.topic(),
                                m.partition(),
                                m.offset()
                            ));
                        }
                        (last, quiet) = (Instant::now(), Duration::from_secs(1));
                    }
                    Some(Err(e)) => panic!("reading {topics:?}: {e}"),
                    None => {}
                }
            }
            Ends { ends, copies }
        })
        .await
        .expect("a scan")
    }

    fn of(&self, topic: &str, partition: i32) -> i64 {
        self.ends
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    /// Messages in `topics`.
    fn count(&self, topics: &[String]) -> i64 {
        self.ends
            .iter()
            .filter(|((t, _), _)| topics.contains(t))
            .map(|(_, e)| e)
            .sum()
    }
}

/// What the members' calls came to, from the counts table (a floor: a call
/// whose process died before it was counted is not).
#[derive(Debug, Default)]
struct Seen {
    calls: i64,
    duplicates: i64,
    /// Answered with a retry: a store error or a claim in progress.
    retried: i64,
}

impl Seen {
    async fn read(admin: &sqlx::PgPool, table: &str) -> Seen {
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT kind, COUNT(*) FROM {table}_seen GROUP BY kind"
        )))
        .fetch_all(admin)
        .await
        .expect("read the counts");
        let mut seen = Seen::default();
        for (kind, n) in rows {
            seen.calls += n;
            match kind.as_str() {
                "executed" => {}
                "duplicate" => seen.duplicates += n,
                _ => seen.retried += n,
            }
        }
        seen
    }
}

/// Stops `members` at once and waits for their reports.
async fn stop_all(members: Vec<Member>) -> Vec<MemberReport> {
    let stops: Vec<_> = members
        .into_iter()
        .map(|m| tokio::task::spawn_blocking(move || m.stop()))
        .collect();
    let mut reports = Vec::new();
    for s in stops {
        reports.push(s.await.expect("stop"));
    }
    reports
}
