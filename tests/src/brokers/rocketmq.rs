//! RocketMQ for the tests: a name server and a broker on loopback (started
//! here when nothing answers and the rocketmq-rust binaries are installed;
//! they then outlive the test, like the other services), a producer for a
//! test's own publishing, and a reader of a topic or a group's lag.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
// The classic pull consumer reads a queue from the offsets it is given,
// which is what reading a whole topic, or a group's committed offsets, is;
// the lite pull consumer that replaces it follows a group.
#[allow(deprecated)]
use rocketmq_client_rust::DefaultMQPullConsumer;
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig, DefaultMQProducer};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

use crate::services::unavailable;

/// The name server: `ROCKETMQ_NAMESRV`, or the loopback default.
pub fn rocketmq_name_server() -> String {
    std::env::var("ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".to_owned())
}

/// The `messageDelayLevel` of the broker the tests start: whole seconds
/// (the broker's unit), short, so retries come back within a test.
pub const ROCKETMQ_DELAY_LEVELS: &str = "1s 2s 3s 5s 10s 30s 1m 2m";

/// [`ROCKETMQ_DELAY_LEVELS`] as the consumer's `delay_levels` take them.
pub fn rocketmq_delay_levels() -> Vec<Duration> {
    ROCKETMQ_DELAY_LEVELS
        .split(' ')
        .map(|l| {
            let (n, unit) = l.split_at(l.len() - 1);
            let n: u64 = n.parse().expect("a delay level");
            Duration::from_secs(if unit == "m" { n * 60 } else { n })
        })
        .collect()
}

/// A rocketmq-rust binary (`rocketmq-namesrv-rust`, `rocketmq-broker-rust`):
/// in cargo's bin, where `cargo install` puts it, or on `PATH`.
pub fn rocketmq_program(name: &str) -> PathBuf {
    let cargo_bin = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cargo")))
        .map(|home| home.join("bin").join(name));
    match cargo_bin {
        Ok(p) if p.exists() => p,
        _ => PathBuf::from(name),
    }
}

/// The RocketMQ of [`rocketmq_name_server`], for a test's own topics.
#[derive(Clone)]
pub struct RocketMq {
    name_server: String,
    producer: DefaultMQProducer,
    /// The reader of topics, made at the first read; never shut down by
    /// itself (rocketmq-client-rust takes 15 to 20 s to shut a pull
    /// consumer down), it goes with the runtime.
    #[allow(deprecated)]
    reader: Arc<tokio::sync::OnceCell<DefaultMQPullConsumer>>,
    /// The admin client that reads a group's offsets, made at the first use.
    admin: Arc<tokio::sync::OnceCell<rocketmq_client_rust::DefaultMQAdminExt>>,
    runtime: Arc<ClientRuntime>,
    _owner: Arc<RuntimeOwner>,
}

/// A RocketMQ whose broker takes messages, or `None` (after
/// [`unavailable`]) when none answers. When nothing answers on the
/// loopback default and the rocketmq-rust binaries are installed, a name
/// server and a broker are started (on 9876 and 10911, with
/// [`ROCKETMQ_DELAY_LEVELS`], in `$TMPDIR/idem-tests-rocketmq`).
pub async fn rocketmq() -> Option<RocketMq> {
    let name_server = rocketmq_name_server();
    let reached = RocketMq::connect(&name_server).await;
    let reached = match reached {
        Ok(r) => Ok(r),
        Err(_) if std::env::var("ROCKETMQ_NAMESRV").is_err() && started_once() => {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                match RocketMq::connect(&name_server).await {
                    Ok(r) => break Ok(r),
                    Err(e) if std::time::Instant::now() > deadline => break Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        }
        Err(e) => Err(e),
    };
    match reached {
        Ok(r) => Some(r),
        Err(e) => unavailable("RocketMQ", &name_server, e),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the loopback name server and broker once in this process (the
/// tests of a binary run on threads of it, and each may find nothing
/// answering while they start); `true` once they were started here.
fn started_once() -> bool {
    static STARTED: std::sync::Mutex<Option<bool>> = std::sync::Mutex::new(None);
    let mut started = STARTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *started.get_or_insert_with(start_loopback)
}

impl RocketMq {
    /// A producer on `name_server` whose broker stored a message (to the
    /// topic `idem-tests-ping`).
    fn connect(name_server: &str) -> BoxFuture<'static, Result<RocketMq, BoxError>> {
        let name_server = name_server.to_owned();
        Box::pin(async move {
            // A closed port is the quick answer; the client would retry.
            let addr = name_server.split(';').next().unwrap_or_default().to_owned();
            tokio::time::timeout(
                Duration::from_secs(2),
                tokio::net::TcpStream::connect(&addr),
            )
            .await
            .map_err(|_| "the name server did not answer within 2 s")??;
            let owner =
                RuntimeOwner::plan(RuntimeConfig::for_parallelism("idem-tests-rocketmq", 2))?
                    .build()?;
            let runtime = ClientRuntime::try_new(
                owner.root_context().component("tests"),
                ClientRuntimeConfig::default(),
                rocketmq_observability::TelemetryHandle::default(),
            )?;
            let mut producer = DefaultMQProducer::builder(Arc::clone(&runtime))
                .producer_group(format!("idem-tests-{}", uuid::Uuid::new_v4().simple()))
                .name_server_addr(name_server.clone())
                .send_msg_timeout(5_000)
                .build();
            producer.start().await?;
            let r = RocketMq {
                name_server,
                producer,
                reader: Arc::default(),
                admin: Arc::default(),
                runtime,
                _owner: Arc::new(owner),
            };
            r.try_publish("idem-tests-ping", b"ping", None, &[]).await?;
            Ok(r)
        })
    }

    /// The name servers.
    pub fn name_server(&self) -> &str {
        &self.name_server
    }

    /// Makes `topic` with `queues` queues, if it is missing.
    pub async fn create_topic(&self, topic: &str, queues: i32) {
        let mut producer = self.producer.clone();
        let topic = topic.to_owned();
        Box::pin(async move {
            if producer.fetch_publish_message_queues(&topic).await.is_err() {
                producer
                    .create_topic("TBW102", &topic, queues, HashMap::new())
                    .await
                    .unwrap_or_else(|e| panic!("create the topic {topic}: {e}"));
            }
        })
        .await;
    }

    fn try_publish(
        &self,
        topic: &str,
        body: &[u8],
        keys: Option<&str>,
        properties: &[(String, String)],
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        let mut builder = Message::builder().topic(topic.to_owned()).body_slice(body);
        if let Some(keys) = keys {
            builder = builder.key(keys.to_owned());
        }
        let properties = properties.to_vec();
        let producer = self.producer.clone();
        Box::pin(async move {
            for (name, value) in properties {
                builder = builder.raw_property(name, value)?;
            }
            let msg = builder.build()?;
            match producer.send(msg).await? {
                Some(r) if r.send_status == rocketmq_model::result::SendStatus::SendOk => Ok(()),
                other => Err(format!("the broker answered {other:?}").into()),
            }
        })
    }

    /// Publishes `body` to `topic`, with `keys` as its `KEYS`.
    pub async fn publish(&self, topic: &str, body: &[u8], keys: Option<&str>) {
        self.publish_with(topic, body, keys, &[]).await;
    }

    /// Publishes `body` to `topic`, with `keys` as its `KEYS` and user
    /// `properties` (a trace context, say).
    pub async fn publish_with(
        &self,
        topic: &str,
        body: &[u8],
        keys: Option<&str>,
        properties: &[(String, String)],
    ) {
        self.try_publish(topic, body, keys, properties)
            .await
            .unwrap_or_else(|e| panic!("publish to {topic}: {e}"));
    }

    /// A started pull consumer of group `group`.
    #[allow(deprecated)]
    fn puller(&self, group: &str) -> BoxFuture<'static, DefaultMQPullConsumer> {
        let consumer = DefaultMQPullConsumer::builder(Arc::clone(&self.runtime))
            .consumer_group(group.to_owned())
            .name_server_addr(self.name_server.clone())
            .build()
            .expect("a pull consumer");
        Box::pin(async move {
            consumer.start().await.expect("start a pull consumer");
            consumer
        })
    }

    /// Every message `topic` holds (none when it does not exist).
    pub async fn read(&self, topic: &str) -> Vec<MessageExt> {
        let group = format!("idem-tests-read-{}", uuid::Uuid::new_v4().simple());
        let consumer = self.reader.get_or_init(|| self.puller(&group)).await;
        let topic = topic.to_owned();
        Box::pin(async move {
            let mut found = Vec::new();
            let queues = consumer.fetch_subscribe_message_queues(&topic).await;
            let queues = queues.unwrap_or_default();
            for mq in queues {
                let mut offset = consumer.min_offset(&mq).await.unwrap_or(0);
                let end = consumer.max_offset(&mq).await.unwrap_or(0);
                while offset < end {
                    let Ok(pulled) = consumer.pull(&mq, "*", offset, 32).await else {
                        break;
                    };
                    found.extend(pulled.msg_found_list().unwrap_or_default().iter().cloned());
                    let next = i64::try_from(pulled.next_begin_offset()).unwrap_or(end);
                    if next <= offset {
                        break;
                    }
                    offset = next;
                }
            }
            found
        })
        .await
    }

    /// How many messages of `topic` group `group` has not committed, as the
    /// broker says (its consumer offsets, which a consumer commits every
    /// 5 s and when it stops); the whole topic when the group has none.
    pub async fn lag(&self, group: &str, topic: &str) -> u64 {
        use rocketmq_client_rust::MQAdminReadExt as _;
        let admin = self.admin.get_or_init(|| self.admin()).await;
        let (group, named) = (group.to_owned(), topic.to_owned());
        let stats = Box::pin(async move {
            admin
                .examine_consume_stats(group.into(), Some(named.into()), None, None, None)
                .await
        })
        .await;
        match stats {
            Ok(stats) => stats
                .get_offset_table()
                .values()
                .map(|o| {
                    u64::try_from(o.get_broker_offset() - o.get_consumer_offset()).unwrap_or(0)
                })
                .sum(),
            Err(_) => self.read(topic).await.len() as u64,
        }
    }

    /// A started admin client.
    fn admin(&self) -> BoxFuture<'static, rocketmq_client_rust::DefaultMQAdminExt> {
        let mut admin = rocketmq_client_rust::DefaultMQAdminExt::with_admin_ext_group(
            Arc::clone(&self.runtime),
            format!("idem-tests-admin-{}", uuid::Uuid::new_v4().simple()),
        );
        admin.set_namesrv_addr(self.name_server.clone());
        Box::pin(async move {
            admin.start().await.expect("start an admin client");
            admin
        })
    }
}

/// Starts a name server on 9876 and a broker on 10911, on loopback, with
/// [`ROCKETMQ_DELAY_LEVELS`], in a directory of their own under the temp
/// directory (their logs are there); `false` when the binaries are not
/// installed.
fn start_loopback() -> bool {
    let home = std::env::temp_dir().join("idem-tests-rocketmq");
    let _ = std::fs::remove_dir_all(&home);
    if std::fs::create_dir_all(home.join("store")).is_err() {
        return false;
    }
    let config = home.join("broker.toml");
    let written = std::fs::write(
        &config,
        format!(
            r#"[broker]
namesrvAddr = "127.0.0.1:9876"
brokerIp1 = "127.0.0.1"
listenPort = 10911
storePathRootDir = "{store}"
autoCreateTopicEnable = true

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "idem-tests"
brokerClusterName = "IdemTests"
brokerId = 0

[store]
storeType = "LocalFile"
brokerRole = "ASYNC_MASTER"
storePathRootDir = "{store}"
haListenAddress = "127.0.0.1"
haListenPort = 10912
messageDelayLevel = "{levels}"
"#,
            store = home.join("store").display(),
            levels = ROCKETMQ_DELAY_LEVELS,
        ),
    );
    if written.is_err() {
        return false;
    }
    let spawn = |program: &str, args: &[&str], log: &str| -> bool {
        let Ok(out) = std::fs::File::create(home.join(log)) else {
            return false;
        };
        let Ok(err) = out.try_clone() else {
            return false;
        };
        std::process::Command::new(rocketmq_program(program))
            .args(args)
            .env("HOME", &home)
            .env("ROCKETMQ_HOME", &home)
            .env("ROCKETMQ_SECURITY_PROFILE", "development-insecure-loopback")
            .env_remove("NAMESRV_ADDR")
            .current_dir(&home)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .is_ok()
    };
    let home_arg = home.display().to_string();
    spawn(
        "rocketmq-namesrv-rust",
        &[
            "--rocketmqHome",
            &home_arg,
            "--listenPort",
            "9876",
            "--bindAddress",
            "127.0.0.1",
        ],
        "namesrv.log",
    ) && {
        // The broker registers with the name server as it starts.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", 9876)).is_err()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        spawn(
            "rocketmq-broker-rust",
            &["-c", &config.display().to_string(), "-n", "127.0.0.1:9876"],
            "broker.log",
        )
    }
}
