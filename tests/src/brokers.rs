//! The brokers on loopback (RabbitMQ, NATS, Kafka, RocketMQ): where they are, a connection for a test's own
//! publishing and inspecting, and guards that remove a test's queues and
//! streams when it ends.

use std::time::Duration;

use crate::services::unavailable;

mod rocketmq;
pub use rocketmq::{
    ROCKETMQ_DELAY_LEVELS, RocketMq, rocketmq, rocketmq_delay_levels, rocketmq_name_server,
    rocketmq_program,
};

/// The RabbitMQ URL: `AMQP_URL`, or the loopback default.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The NATS URL: `NATS_URL`, or the loopback default.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A channel on the RabbitMQ of [`amqp_url`] (with its connection, which
/// must live as long), or `None` (after [`unavailable`]) when it cannot be
/// reached.
pub async fn amqp_channel() -> Option<(lapin::Connection, lapin::Channel)> {
    let url = amqp_url();
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    let conn = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return unavailable("RabbitMQ", &url, e),
        Err(_) => return unavailable("RabbitMQ", &url, "connect timed out"),
    };
    match conn.create_channel().await {
        Ok(channel) => Some((conn, channel)),
        Err(e) => unavailable("RabbitMQ", &url, e),
    }
}

/// A JetStream context on the NATS of [`nats_url`], or `None` (after
/// [`unavailable`]) when it cannot be reached.
pub async fn jetstream() -> Option<async_nats::jetstream::Context> {
    let url = nats_url();
    match tokio::time::timeout(Duration::from_secs(10), async_nats::connect(&url)).await {
        Ok(Ok(client)) => Some(async_nats::jetstream::new(client)),
        Ok(Err(e)) => unavailable("NATS", &url, e),
        Err(_) => unavailable("NATS", &url, "connect timed out"),
    }
}

/// Creates the stream `config` describes (or finds it), trying again for
/// a few seconds when the server fails to (a JetStream error of 500 and
/// above): nats-server 2.9 removes an account's stream directory when its
/// last stream goes, and a stream created at that moment by a test beside
/// it fails with "error creating store for stream". Panics on any other
/// error.
pub async fn create_stream(
    js: &async_nats::jetstream::Context,
    config: async_nats::jetstream::stream::Config,
) -> async_nats::jetstream::stream::Stream {
    use async_nats::jetstream::context::CreateStreamErrorKind;
    let mut tries = 0;
    loop {
        match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(e) if tries < 30 => match e.kind() {
                CreateStreamErrorKind::JetStream(api) if api.code() >= 500 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => panic!("create the stream {}: {e}", config.name),
            },
            Err(e) => panic!("create the stream {}: {e}", config.name),
        }
    }
}

/// Runs `work` on a fresh thread with a runtime of its own: a guard's
/// clean-up must not depend on the test's runtime, which may be shutting down.
fn on_own_runtime(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(work);
        }
    })
    .join();
}

/// Deletes RabbitMQ queues when dropped.
#[derive(Debug)]
pub struct DeleteQueues(Vec<String>);

impl DeleteQueues {
    /// Deletes `queues` at the end of the scope.
    pub fn new(queues: Vec<String>) -> Self {
        DeleteQueues(queues)
    }
}

impl Drop for DeleteQueues {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut self.0);
        on_own_runtime(async move {
            let Ok(conn) =
                lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
                    .await
            else {
                return;
            };
            if let Ok(channel) = conn.create_channel().await {
                for q in queues {
                    let _ = channel
                        .queue_delete(q.as_str().into(), Default::default())
                        .await;
                }
            }
            let _ = conn.close(200, "done".into()).await;
        });
    }
}

/// Deletes JetStream streams (and so their consumers) when dropped.
#[derive(Debug)]
pub struct DeleteStreams(Vec<String>);

impl DeleteStreams {
    /// Deletes `streams` at the end of the scope.
    pub fn new(streams: Vec<String>) -> Self {
        DeleteStreams(streams)
    }
}

impl Drop for DeleteStreams {
    fn drop(&mut self) {
        let streams = std::mem::take(&mut self.0);
        on_own_runtime(async move {
            let Ok(client) = async_nats::connect(nats_url()).await else {
                return;
            };
            let js = async_nats::jetstream::new(client);
            for s in streams {
                let _ = js.delete_stream(&s).await;
            }
        });
    }
}

/// The Kafka brokers: `KAFKA_BROKERS`, or the loopback default (the
/// Kafka-protocol broker `.ci/run` starts).
pub fn kafka_brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

fn kafka_config(brokers: &str) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c
}

/// Runs a blocking librdkafka call off the runtime's workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a blocking task")
}

/// A Kafka admin client, or `None` (after [`unavailable`]) when the brokers
/// cannot be reached. When nothing answers on the loopback default and
/// `tansu` (the Kafka-protocol broker `.ci/run` installs) is installed, it
/// is started, in memory, and outlives the test like the other services.
pub async fn kafka() -> Option<Kafka> {
    let brokers = kafka_brokers();
    let mut reached = reach_kafka(&brokers).await;
    if reached.is_err() && std::env::var("KAFKA_BROKERS").is_err() && start_tansu() {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while reached.is_err() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            reached = reach_kafka(&brokers).await;
        }
    }
    match reached {
        Ok(admin) => Some(Kafka {
            admin: std::sync::Arc::new(admin),
            brokers,
        }),
        Err(e) => unavailable("Kafka", &brokers, e),
    }
}

impl Kafka {
    /// The brokers at `brokers` (a test's own, such as a
    /// [`TansuServer`](crate::TansuServer)), or `None` (after
    /// [`unavailable`]) when they cannot be reached.
    pub async fn at(brokers: &str) -> Option<Kafka> {
        match reach_kafka(brokers).await {
            Ok(admin) => Some(Kafka {
                admin: std::sync::Arc::new(admin),
                brokers: brokers.to_owned(),
            }),
            Err(e) => unavailable("Kafka", brokers, e),
        }
    }

    /// The brokers' addresses.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }
}

type Admin = rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>;

async fn reach_kafka(brokers: &str) -> Result<Admin, rdkafka::error::KafkaError> {
    let brokers = brokers.to_owned();
    blocking(move || {
        let admin: Admin = kafka_config(&brokers)
            .set("socket.connection.setup.timeout.ms", "3000")
            .create()?;
        admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|_| admin)
    })
    .await
}

/// The `tansu` binary: in cargo's bin, where `cargo install` puts it, or
/// on `PATH`.
pub fn tansu_program() -> std::path::PathBuf {
    let cargo_bin = std::env::var("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .map(|home| home.join("bin").join("tansu"));
    match cargo_bin {
        Ok(p) if p.exists() => p,
        _ => std::path::PathBuf::from("tansu"),
    }
}

/// Starts `tansu` on the loopback default, in memory, if it is installed;
/// `false` when it is not.
fn start_tansu() -> bool {
    let program = tansu_program();
    let log = std::env::temp_dir().join("idem-tests-tansu.log");
    let Ok(out) = std::fs::File::create(&log) else {
        return false;
    };
    let Ok(err) = out.try_clone() else {
        return false;
    };
    std::process::Command::new(program)
        .args([
            "broker",
            "--listener-url",
            "tcp://127.0.0.1:9092",
            "--advertised-listener-url",
            "tcp://127.0.0.1:9092",
            "--storage-engine",
            "memory://tansu/",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .is_ok()
}

/// The librdkafka setting that makes a producer send one record per batch.
///
/// tansu 0.6's in-memory storage keeps a partition as whole batches, and
/// two of its answers are then wrong where Kafka's are right: a fetch from
/// an offset inside a batch returns only the batches after it (the rest of
/// that batch is never delivered, so a consumer that resumes there loses
/// it), and a partition's end is reported as the last batch's first offset
/// plus one. With one record per batch every offset starts a batch and both
/// answers are right. The tests' producers, and the consumers' producers of
/// retries and dead letters, use it; a real Kafka needs nothing of the kind.
pub const TANSU_ONE_RECORD_A_BATCH: (&str, &str) = ("batch.num.messages", "1");

/// The librdkafka setting that makes a consumer's fetches wait at most
/// 50 ms for records (librdkafka's default is 500 ms).
///
/// tansu 0.6 answers a fetch once its wait is over even when records came
/// in before (Kafka answers as soon as there are `fetch.min.bytes`), so a
/// record published to a topic the consumer follows reaches it up to the
/// whole wait later: a retry that hops between retry topics would come back
/// hundreds of milliseconds late, on tansu only. The consumers of the tests
/// that time retries use it; a real Kafka needs nothing of the kind.
pub const TANSU_SHORT_FETCH_WAIT: (&str, &str) = ("fetch.wait.max.ms", "50");

/// The brokers of [`kafka_brokers`], for a test's own topics.
#[derive(Clone)]
pub struct Kafka {
    admin: std::sync::Arc<Admin>,
    brokers: String,
}

impl Kafka {
    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
        let done = self
            .admin
            .create_topics([&new], &AdminOptions::new())
            .await
            .expect("create topics");
        for r in done {
            if let Err((name, code)) = r {
                panic!("could not create topic {name}: {code}");
            }
        }
    }

    /// A producer (`acks=all`) of one record per batch: tansu 0.6, in
    /// memory, reports a partition's end wrong when records are batched,
    /// and a fetch from inside a batch skips the rest of it (see
    /// [`TANSU_ONE_RECORD_A_BATCH`]).
    pub fn producer(&self) -> rdkafka::producer::FutureProducer {
        kafka_config(&self.brokers)
            .set("acks", "all")
            .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
            .create()
            .expect("a producer")
    }

    /// Every message of `topic` now, partition by partition, each in
    /// offset order.
    pub async fn read(&self, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
        let (brokers, topic) = (self.brokers.clone(), topic.to_owned());
        blocking(move || read_topic(&brokers, &topic)).await
    }

    /// The partitions of `topic` and their high watermarks.
    pub async fn ends(&self, topic: &str) -> Vec<(i32, i64)> {
        let (brokers, topic) = (self.brokers.clone(), topic.to_owned());
        blocking(move || ends(&brokers, &topic)).await
    }

    /// What `group` committed for each partition of `topic` (`None` where
    /// nothing was).
    pub async fn committed(&self, group: &str, topic: &str) -> Vec<(i32, Option<i64>)> {
        let (brokers, group, topic) = (self.brokers.clone(), group.to_owned(), topic.to_owned());
        blocking(move || committed(&brokers, &group, &topic)).await
    }

    /// Messages of `topics` that `group` has not committed past.
    pub async fn lag(&self, group: &str, topics: &[String]) -> u64 {
        let mut lag = 0;
        for topic in topics {
            let ends = self.ends(topic).await;
            let committed = self.committed(group, topic).await;
            for (p, end) in ends {
                let at = committed
                    .iter()
                    .find(|(cp, _)| *cp == p)
                    .and_then(|(_, o)| *o)
                    .unwrap_or(0);
                lag += u64::try_from(end - at).unwrap_or(0);
            }
        }
        lag
    }
}

fn ends(brokers: &str, topic: &str) -> Vec<(i32, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = kafka_config(brokers).create().expect("a client");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Vec::new();
    };
    t.partitions()
        .iter()
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .expect("watermarks");
            (p.id(), high)
        })
        .collect()
}

fn committed(brokers: &str, group: &str, topic: &str) -> Vec<(i32, Option<i64>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = kafka_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a client");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (p, _) in ends(brokers, topic) {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => (e.partition(), Some(o)),
            _ => (e.partition(), None),
        })
        .collect()
}

fn read_topic(brokers: &str, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let mut out = Vec::new();
    for (p, end) in ends(brokers, topic) {
        if end == 0 {
            continue;
        }
        let c: BaseConsumer = kafka_config(brokers)
            .set(
                "group.id",
                format!("idem-read-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            .create()
            .expect("a client");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .expect("a partition");
        c.assign(&tpl).expect("assign");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let last = m.offset() + 1 >= end;
                    out.push(m.detach());
                    if last {
                        break;
                    }
                }
                Some(Err(e)) => panic!("reading {topic}/{p}: {e}"),
                None => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "reading {topic}/{p} took over 20 s"
            );
        }
    }
    out
}

/// Deletes Kafka topics when dropped.
pub struct DeleteTopics(Vec<String>);

impl DeleteTopics {
    /// Deletes `topics` at the end of the scope.
    pub fn new(topics: Vec<String>) -> Self {
        DeleteTopics(topics)
    }
}

impl Drop for DeleteTopics {
    fn drop(&mut self) {
        let topics = std::mem::take(&mut self.0);
        on_own_runtime(async move {
            use rdkafka::admin::{AdminClient, AdminOptions};
            use rdkafka::client::DefaultClientContext;
            let Ok(admin) =
                kafka_config(&kafka_brokers()).create::<AdminClient<DefaultClientContext>>()
            else {
                return;
            };
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
        });
    }
}

/// A TCP proxy on a free loopback port to a port of the test's, which the
/// test can cut: every connection through it is dropped and new ones are
/// closed at once, until it is restored. A broker advertising the proxy's
/// port is reached only through it, so a cut is a real network outage.
pub struct CutProxy {
    port: u16,
    open: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy on `port` (free, reserved by the caller) to `target`.
    pub async fn start(port: u16, target: u16) -> CutProxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the proxy's port");
        let (open, watch) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !*watch.borrow() {
                    continue; // dropped: closed at once
                }
                let mut cut = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        CutProxy { port, open, task }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
