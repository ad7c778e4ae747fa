//! `consume::dead` on the real brokers: dead letters made by a real consumer
//! run (a body that fails with a final error, a payload that does not
//! decode) are listed with their reasons (a listing takes nothing away and
//! reorders nothing), shown, replayed one by id (and handled by a consumer
//! once the handler is fixed and its record forgotten, with a fresh set of
//! attempts and `x-idem-replays` on the copy), replayed by a filter (and
//! dead-lettered again, its replay counted), and purged. Written once over
//! a [`Fixture`] and run on RabbitMQ, NATS JetStream and Kafka, each test on
//! queues, streams or topics of its own, deleted afterwards.

use crate::common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::broker::{Points, Running, shutdown};
use common::eventually;
use idem_runtime::consume::dead::{DeadLetter, DeadLetterError, Purged, Replayed, Selection};
use idem_runtime::consume::{Delivery, Policy};
use idem_runtime::store::Inspect as _;
use idem_runtime::{Error, FinalError, Key, MemoryStore, Outcome, idempotent};
use idem_tests::brokers::{
    DeleteQueues, DeleteStreams, DeleteTopics, TANSU_ONE_RECORD_A_BATCH, amqp_channel, amqp_url,
    kafka, kafka_brokers, nats_url,
};
use idem_tests::{or_skip, unique_table};

/// The handler's error: an order for a SKU the warehouse does not know,
/// which no redelivery can cure.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum StockError {
    #[error("unknown SKU in order {0}")]
    UnknownSku(String),
}

impl FinalError for StockError {
    fn is_final(&self) -> bool {
        true
    }
}

/// Fails for good until `fixed`; then takes effect (noted in `done`).
#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "dead_reserve")]
async fn reserve(
    msg: &Points,
    fixed: &AtomicBool,
    done: &Mutex<Vec<String>>,
) -> Result<u32, StockError> {
    if !fixed.load(Ordering::SeqCst) {
        return Err(StockError::UnknownSku(msg.id.clone()));
    }
    done.lock().unwrap().push(msg.id.clone());
    Ok(msg.points)
}

type Call = std::pin::Pin<Box<dyn Future<Output = Result<Outcome<u32>, Error<StockError>>> + Send>>;

/// What the handler was handed: the message's id and its delivery.
type Seen = Arc<Mutex<Vec<(String, Delivery)>>>;

/// The consumer's handler: `reserve` on `store`, noting every delivery.
fn handler(
    store: &MemoryStore,
    fixed: &Arc<AtomicBool>,
    done: &Arc<Mutex<Vec<String>>>,
    seen: &Seen,
) -> impl Fn(Points, Delivery) -> Call + Send + Sync + 'static {
    let (store, fixed, done, seen) = (
        store.clone(),
        Arc::clone(fixed),
        Arc::clone(done),
        Arc::clone(seen),
    );
    move |msg: Points, delivery: Delivery| {
        seen.lock().unwrap().push((msg.id.clone(), delivery));
        let (store, fixed, done) = (store.clone(), Arc::clone(&fixed), Arc::clone(&done));
        Box::pin(async move { reserve(&store, &msg, &fixed, &done).await })
    }
}

/// One broker's dead letters, as the test uses them.
trait Dead {
    async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError>;
    async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError>;
    async fn replay(&self, filter: &Selection) -> Result<Replayed, DeadLetterError>;
    async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError>;
    async fn count(&self) -> Result<u64, DeadLetterError>;
}

macro_rules! dead_api {
    ($t:ty) => {
        impl Dead for $t {
            async fn list(&self, filter: &Selection) -> Result<Vec<DeadLetter>, DeadLetterError> {
                <$t>::list(self, filter).await
            }
            async fn show(&self, id: &str) -> Result<DeadLetter, DeadLetterError> {
                <$t>::show(self, id).await
            }
            async fn replay(&self, filter: &Selection) -> Result<Replayed, DeadLetterError> {
                <$t>::replay(self, filter).await
            }
            async fn purge(&self, filter: &Selection) -> Result<Purged, DeadLetterError> {
                <$t>::purge(self, filter).await
            }
            async fn count(&self) -> Result<u64, DeadLetterError> {
                <$t>::count(self).await
            }
        }
    };
}

dead_api!(idem_runtime::consume::rabbitmq::dead::DeadLetters);
dead_api!(idem_runtime::consume::nats::dead::DeadLetters);
dead_api!(idem_runtime::consume::kafka::dead::DeadLetters);

/// A broker, a work queue (stream, topic) of the test's own, and its
/// consumer.
trait Fixture: Sized {
    type Dead: Dead;
    /// The header a replayed copy counts its replays in.
    const REPLAYS: &'static str;
    /// The header the consumer counts a message's failures in (NATS: none,
    /// the server counts deliveries).
    const FAILURES: Option<&'static str>;
    /// Whether the broker can delete one dead letter.
    const PURGES_ONE: bool;

    async fn open(name: &str) -> Option<Self>;
    async fn publish(&self, payload: &[u8]);
    /// Starts the consumer around `handler`.
    fn start(&self, handler: impl Fn(Points, Delivery) -> Call + Send + Sync + 'static) -> Running;
    /// The dead letters, by the consumer's default name (once the consumer
    /// has declared them).
    async fn dead(&self) -> Self::Dead;
    /// Where the consumer took the messages from: the dead letters' origin.
    fn origin(&self) -> String;
    /// An id of the broker's form that no dead letter has.
    fn absent_id(&self) -> String;
}

/// A policy that dead-letters quickly.
fn policy() -> Policy {
    Policy {
        max_failures: 2,
        first_delay: Duration::from_millis(100),
        ..Policy::default()
    }
}

fn ids(dead: &[DeadLetter]) -> Vec<String> {
    dead.iter().map(|d| d.id.clone()).collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap())
        .unwrap()
}

const UNDECODABLE: &[u8] = b"{\"id\": 7, \"points\": \"many\"}";

async fn scenario<B: Fixture>(b: &B) {
    let began = now_ms();
    for id in ["f-1", "f-2", "f-3"] {
        b.publish(&Points::payload(id, 1)).await;
    }
    b.publish(UNDECODABLE).await;
    let (store, fixed) = (MemoryStore::new(), Arc::new(AtomicBool::new(false)));
    let (done, seen): (Arc<Mutex<Vec<String>>>, Seen) = Default::default();

    // A real run dead-letters all four.
    let running = b.start(handler(&store, &fixed, &done, &seen));
    let dead = b.dead().await;
    eventually(Duration::from_secs(30), "four dead letters", || async {
        dead.count().await.unwrap() == 4
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.dead_lettered, 4, "{report:?}");

    // Listed with their reasons, origin, attempts and times.
    let all = dead.list(&Selection::new()).await.unwrap();
    assert_eq!(all.len(), 4, "{all:#?}");
    let mut unique = ids(&all);
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4, "ids are unique: {all:#?}");
    let finals: Vec<&DeadLetter> = all
        .iter()
        .filter(|d| d.reason.as_deref().unwrap_or("").contains("unknown SKU"))
        .collect();
    assert_eq!(finals.len(), 3, "{all:#?}");
    let undecodable: Vec<&DeadLetter> = all
        .iter()
        .filter(|d| {
            d.reason
                .as_deref()
                .unwrap_or("")
                .contains("does not decode")
        })
        .collect();
    assert_eq!(undecodable.len(), 1, "{all:#?}");
    assert_eq!(undecodable[0].payload, UNDECODABLE);
    for d in &all {
        assert_eq!(d.origin.as_deref(), Some(b.origin().as_str()), "{d:#?}");
        assert_eq!(d.replays, 0, "{d:#?}");
        let at = d.dead_at_ms.expect("a dead-letter time");
        assert!(at >= began - 2_000 && at <= now_ms() + 2_000, "{d:#?}");
        assert!(d.attempts.is_some(), "{d:#?}");
        assert_eq!(d.size(), d.payload.len());
    }
    // A final error is dead-lettered on its first failed run.
    for d in &finals {
        assert_eq!(d.attempts, Some(1), "{d:#?}");
    }
    let f1 = *finals
        .iter()
        .find(|d| d.payload == Points::payload("f-1", 1))
        .expect("f-1 is a dead letter");

    // A listing takes nothing away and reorders nothing.
    let first_two = dead.list(&Selection::new().limit(2)).await.unwrap();
    assert_eq!(ids(&first_two), ids(&all)[..2]);
    let again = dead.list(&Selection::new()).await.unwrap();
    assert_eq!(
        ids(&again),
        ids(&all),
        "the same dead letters, in the same order"
    );
    assert_eq!(dead.count().await.unwrap(), 4);
    // Filters.
    let by_reason = dead
        .list(&Selection::new().reason("DOES NOT DECODE"))
        .await
        .unwrap();
    assert_eq!(ids(&by_reason), [undecodable[0].id.as_str()]);
    let old = dead
        .list(&Selection::new().older_than(Duration::from_secs(3_600)))
        .await
        .unwrap();
    assert!(old.is_empty(), "{old:#?}");
    let by_ids = dead
        .list(&Selection::new().id(&f1.id).id(b.absent_id()))
        .await
        .unwrap();
    assert_eq!(ids(&by_ids), [f1.id.as_str()]);

    // Shown: its headers and payload.
    let shown = dead.show(&f1.id).await.unwrap();
    assert_eq!(shown.payload, Points::payload("f-1", 1));
    assert_eq!(shown.reason, f1.reason);
    assert!(!shown.headers.is_empty());
    assert!(
        matches!(
            dead.show(&b.absent_id()).await,
            Err(DeadLetterError::NotFound { .. })
        ),
        "an id no dead letter has"
    );

    // A replay or purge that names nothing is refused, and does nothing.
    assert!(matches!(
        dead.replay(&Selection::new()).await,
        Err(DeadLetterError::Unfiltered { .. })
    ));
    assert!(matches!(
        dead.purge(&Selection::new().limit(3)).await,
        Err(DeadLetterError::Unfiltered { .. })
    ));
    // One that matches nothing replays nothing.
    let none = dead
        .replay(&Selection::new().older_than(Duration::from_secs(3_600)))
        .await
        .unwrap();
    assert_eq!((none.count(), none.skipped.len()), (0, 0));
    assert_eq!(dead.count().await.unwrap(), 4);

    // The fix is deployed and f-1's recorded error forgotten: its replay is
    // handled, as a new message.
    fixed.store(true, Ordering::SeqCst);
    let key = Key::from_parts(&[&"f-1"]).unwrap();
    store
        .forget("dead_reserve", key.as_str(), false)
        .await
        .unwrap();
    let replayed = dead.replay(&Selection::new().id(&f1.id)).await.unwrap();
    assert_eq!(replayed.count(), 1, "{replayed:?}");
    assert_eq!(replayed.replayed[0].id, f1.id);
    assert_eq!(replayed.replayed[0].to, b.origin());
    assert_eq!(replayed.replayed[0].replays, 1);
    assert!(replayed.skipped.is_empty(), "{replayed:?}");
    let left = dead.list(&Selection::new()).await.unwrap();
    assert_eq!(left.len(), 3, "{left:#?}");
    assert!(!ids(&left).contains(&f1.id));
    seen.lock().unwrap().clear();
    let running = b.start(handler(&store, &fixed, &done, &seen));
    eventually(Duration::from_secs(30), "f-1 handled", || async {
        done.lock().unwrap().contains(&"f-1".to_owned())
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.acked, 1, "{report:?}");
    assert_eq!(*done.lock().unwrap(), ["f-1"]);
    {
        let seen = seen.lock().unwrap();
        let (id, delivery) = seen.first().expect("the copy was delivered");
        assert_eq!(id, "f-1");
        assert_eq!(delivery.header(B::REPLAYS), Some("1"), "{delivery:#?}");
        assert_eq!(
            delivery.retries, 0,
            "a fresh set of attempts: {delivery:#?}"
        );
        if let Some(failures) = B::FAILURES {
            assert_eq!(delivery.header(failures), None, "{delivery:#?}");
        }
        assert_eq!(delivery.header("x-idem-reason"), None, "{delivery:#?}");
        assert_eq!(delivery.header("Idem-Reason"), None, "{delivery:#?}");
    }

    // A replay by a filter: the undecodable one goes back, is dead-lettered
    // again, and says it was replayed once.
    let replayed = dead
        .replay(&Selection::new().reason("does not decode"))
        .await
        .unwrap();
    assert_eq!(replayed.count(), 1, "{replayed:?}");
    assert_eq!(replayed.replayed[0].id, undecodable[0].id);
    let running = b.start(handler(&store, &fixed, &done, &seen));
    eventually(
        Duration::from_secs(30),
        "the undecodable one dead-lettered again",
        || async {
            !dead
                .list(&Selection::new().reason("does not decode"))
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    let report = running.stop().await;
    let again = dead
        .list(&Selection::new().reason("does not decode"))
        .await
        .unwrap();
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0].replays, 1, "{:#?}", again[0]);
    assert_eq!(again[0].payload, UNDECODABLE);
    assert_ne!(again[0].id, undecodable[0].id, "a new dead letter");
    assert_eq!(dead.count().await.unwrap(), 3);

    // Purges.
    let f2 = left
        .iter()
        .find(|d| d.payload == Points::payload("f-2", 1))
        .expect("f-2 is a dead letter");
    let left_now = dead.list(&Selection::new()).await.unwrap();
    if B::PURGES_ONE {
        let one = dead.purge(&Selection::new().id(&f2.id)).await.unwrap();
        assert_eq!((one.purged, one.ids.clone()), (1, vec![f2.id.clone()]));
        let rest = dead.list(&Selection::new()).await.unwrap();
        assert_eq!(rest.len(), 2, "{rest:#?}");
        assert!(!ids(&rest).contains(&f2.id));
        let all = dead.purge(&Selection::all()).await.unwrap();
        assert_eq!(all.purged, 2, "{all:?}");
    } else {
        match dead.purge(&Selection::new().id(&f2.id)).await {
            Err(DeadLetterError::Unsupported { why, .. }) => {
                assert!(why.contains("cannot delete one record"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Everything at once where the broker deletes records
        // (DeleteRecords); where it does not (tansu 0.6), a typed refusal
        // that leaves every dead letter in place.
        match dead.purge(&Selection::all()).await {
            Ok(all) => assert_eq!(all.purged, 3, "{all:?}"),
            Err(DeadLetterError::Unsupported { why, .. }) => {
                assert!(why.contains("delete records"), "{why}");
                assert_eq!(
                    ids(&dead.list(&Selection::new()).await.unwrap()),
                    ids(&left_now)
                );
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(dead.count().await.unwrap(), 0);
    assert!(dead.list(&Selection::new()).await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// RabbitMQ

struct Rabbit {
    consumer: idem_runtime::consume::rabbitmq::Consumer,
    queue: String,
    channel: lapin::Channel,
    _conn: lapin::Connection,
    _cleanup: DeleteQueues,
}

impl Fixture for Rabbit {
    type Dead = idem_runtime::consume::rabbitmq::dead::DeadLetters;
    const REPLAYS: &'static str = "x-idem-replays";
    const FAILURES: Option<&'static str> = Some("x-idem-failures");
    const PURGES_ONE: bool = true;

    async fn open(name: &str) -> Option<Self> {
        use idem_runtime::consume::rabbitmq::{Consumer, RETRY_DELAYS};
        use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
        let (conn, channel) = amqp_channel().await?;
        let queue = unique_table(name);
        let consumer = Consumer::new(amqp_url(), queue.clone()).policy(policy());
        let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
        queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
        let cleanup = DeleteQueues::new(queues);
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, Default::default())
            .await
            .expect("declare the work queue");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        Some(Rabbit {
            consumer,
            queue,
            channel,
            _conn: conn,
            _cleanup: cleanup,
        })
    }

    async fn publish(&self, payload: &[u8]) {
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                Default::default(),
                payload,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirmed");
        assert!(confirm.is_ack());
    }

    fn start(&self, handler: impl Fn(Points, Delivery) -> Call + Send + Sync + 'static) -> Running {
        let (stop, signal) = shutdown();
        let consumer = self.consumer.clone();
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    async fn dead(&self) -> Self::Dead {
        use idem_runtime::consume::rabbitmq::dead::DeadLetters;
        let name = DeadLetters::default_name(&self.queue);
        assert_eq!(name, self.consumer.dead_letter_queue());
        let at = amqp_url();
        connected(|| DeadLetters::connect(&at, &name)).await
    }

    fn origin(&self) -> String {
        self.queue.clone()
    }

    fn absent_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }
}

/// Connects once the consumer has declared the dead letters.
async fn connected<D, F, Fut>(connect: F) -> D
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<D, DeadLetterError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match connect().await {
            Ok(d) => return d,
            Err(DeadLetterError::Missing { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the dead letters: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_dead_letters_are_listed_shown_replayed_and_purged() {
    let b = or_skip!(Rabbit::open("dead_rmq").await);
    scenario(&b).await;
}

/// A dead letter whose queue is gone is left where it is: the broker
/// returns the copy, and the dead letter is not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_replay_the_broker_cannot_route_leaves_the_dead_letter() {
    use idem_runtime::consume::rabbitmq::dead::DeadLetters;
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable};
    let b = or_skip!(Rabbit::open("dead_rmq_unroutable").await);
    let dead_queue = b.consumer.dead_letter_queue();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    b.channel
        .queue_declare(dead_queue.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    let gone = unique_table("dead_rmq_gone");
    headers.insert(
        "x-idem-queue".into(),
        AMQPValue::LongString(gone.as_str().into()),
    );
    headers.insert(
        "x-idem-reason".into(),
        AMQPValue::LongString("the payload does not decode".into()),
    );
    headers.insert(
        "x-idem-dead-id".into(),
        AMQPValue::LongString("a-dead-letter".into()),
    );
    b.channel
        .basic_publish(
            "".into(),
            dead_queue.as_str().into(),
            Default::default(),
            b"{}",
            lapin::BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let dead = DeadLetters::connect(&amqp_url(), &dead_queue)
        .await
        .unwrap();
    let done = dead.replay(&Selection::all()).await.unwrap();
    assert_eq!(done.count(), 0, "{done:?}");
    assert_eq!(done.skipped.len(), 1, "{done:?}");
    assert!(done.skipped[0].why.contains(&gone), "{done:?}");
    let still = dead.list(&Selection::new()).await.unwrap();
    assert_eq!(ids(&still), ["a-dead-letter"]);
    assert_eq!(still[0].replays, 0);
    dead.close().await;
}

/// A dead letter written before `x-idem-dead-id` was has a digest as its
/// id, the same on every read, and it can be shown and purged by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_dead_letter_without_an_id_is_named_by_its_digest() {
    use idem_runtime::consume::rabbitmq::dead::DeadLetters;
    use lapin::options::QueueDeclareOptions;
    let b = or_skip!(Rabbit::open("dead_rmq_digest").await);
    let dead_queue = b.consumer.dead_letter_queue();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    b.channel
        .queue_declare(dead_queue.as_str().into(), durable, Default::default())
        .await
        .unwrap();
    for payload in [&b"{\"a\":1}"[..], b"{\"a\":2}"] {
        b.channel
            .basic_publish(
                "".into(),
                dead_queue.as_str().into(),
                Default::default(),
                payload,
                lapin::BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let dead = DeadLetters::connect(&amqp_url(), &dead_queue)
        .await
        .unwrap();
    let first = dead.list(&Selection::new()).await.unwrap();
    let second = dead.list(&Selection::new()).await.unwrap();
    assert_eq!(ids(&first), ids(&second));
    assert_eq!(first.len(), 2);
    assert!(
        first.iter().all(|d| d.id.starts_with("sha256:")),
        "{first:#?}"
    );
    assert_ne!(first[0].id, first[1].id);
    assert_eq!(first[0].dead_at_ms, None);
    assert_eq!(dead.show(&first[1].id).await.unwrap().payload, b"{\"a\":2}");
    let gone = dead
        .purge(&Selection::new().id(&first[0].id))
        .await
        .unwrap();
    assert_eq!(gone.purged, 1);
    assert_eq!(
        ids(&dead.list(&Selection::new()).await.unwrap()),
        [first[1].id.as_str()]
    );
    dead.close().await;
}

// ---------------------------------------------------------------------------
// NATS JetStream

struct Nats {
    consumer: idem_runtime::consume::nats::Consumer,
    subject: String,
    js: async_nats::jetstream::Context,
    _cleanup: DeleteStreams,
}

impl Fixture for Nats {
    type Dead = idem_runtime::consume::nats::dead::DeadLetters;
    const REPLAYS: &'static str = "Idem-Replays";
    const FAILURES: Option<&'static str> = None;
    const PURGES_ONE: bool = true;

    async fn open(name: &str) -> Option<Self> {
        use idem_runtime::consume::nats::Consumer;
        let js = idem_tests::brokers::jetstream().await?;
        let stream = unique_table(name);
        let subject = format!("idem.test.{stream}");
        let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone()).policy(policy());
        let cleanup = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
        idem_tests::brokers::create_stream(
            &js,
            async_nats::jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            },
        )
        .await;
        Some(Nats {
            consumer,
            subject,
            js,
            _cleanup: cleanup,
        })
    }

    async fn publish(&self, payload: &[u8]) {
        self.js
            .publish(self.subject.clone(), payload.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }

    fn start(&self, handler: impl Fn(Points, Delivery) -> Call + Send + Sync + 'static) -> Running {
        let (stop, signal) = shutdown();
        let consumer = self.consumer.clone();
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    async fn dead(&self) -> Self::Dead {
        use idem_runtime::consume::nats::dead::DeadLetters;
        let name = DeadLetters::default_name(
            self.consumer
                .dead_letter_stream()
                .strip_suffix("_DEAD")
                .unwrap(),
        );
        assert_eq!(name, self.consumer.dead_letter_stream());
        let at = nats_url();
        connected(|| DeadLetters::connect(&at, &name)).await
    }

    fn origin(&self) -> String {
        self.subject.clone()
    }

    fn absent_id(&self) -> String {
        "999999".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_are_listed_shown_replayed_and_purged() {
    let b = or_skip!(Nats::open("dead_nats").await);
    scenario(&b).await;
}

/// A dead letter whose subject no stream captures any more stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_replay_no_stream_takes_leaves_the_dead_letter() {
    use idem_runtime::consume::nats::dead::DeadLetters;
    let b = or_skip!(Nats::open("dead_nats_unroutable").await);
    let dead_stream = b.consumer.dead_letter_stream();
    let dead_subject = b.consumer.dead_letter_subject();
    idem_tests::brokers::create_stream(
        &b.js,
        async_nats::jetstream::stream::Config {
            name: dead_stream.clone(),
            subjects: vec![dead_subject.clone()],
            ..Default::default()
        },
    )
    .await;
    let mut headers = async_nats::HeaderMap::new();
    let gone = format!("idem.nowhere.{}", unique_table("gone"));
    headers.insert("Idem-Subject", gone.as_str());
    headers.insert("Idem-Reason", "the payload does not decode");
    b.js.publish_with_headers(dead_subject, headers, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dead = DeadLetters::connect(&nats_url(), &dead_stream)
        .await
        .unwrap();
    let done = dead.replay(&Selection::all()).await.unwrap();
    assert_eq!(done.count(), 0, "{done:?}");
    assert_eq!(done.skipped.len(), 1, "{done:?}");
    assert!(done.skipped[0].why.contains(&gone), "{done:?}");
    assert_eq!(dead.list(&Selection::new()).await.unwrap().len(), 1);
    assert!(matches!(
        dead.show("0:3").await,
        Err(DeadLetterError::BadId { .. })
    ));
}

// ---------------------------------------------------------------------------
// Kafka

struct Kafka {
    consumer: idem_runtime::consume::kafka::Consumer,
    topic: String,
    producer: rdkafka::producer::FutureProducer,
    _cleanup: DeleteTopics,
}

impl Fixture for Kafka {
    type Dead = idem_runtime::consume::kafka::dead::DeadLetters;
    const REPLAYS: &'static str = "x-idem-replays";
    const FAILURES: Option<&'static str> = Some("x-idem-failures");
    const PURGES_ONE: bool = false;

    async fn open(name: &str) -> Option<Self> {
        use idem_runtime::consume::kafka::Consumer;
        use idem_runtime::consume::kafka::dead::DeadLetters;
        let kafka = kafka().await?;
        let topic = unique_table(name);
        let consumer = Consumer::new(kafka_brokers(), format!("{topic}-group"), topic.clone())
            .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
            .policy(policy());
        let mut topics = vec![
            topic.clone(),
            consumer.dead_letter_topic(),
            DeadLetters::ledger_name(&consumer.dead_letter_topic()),
        ];
        topics.extend(consumer.retry_topics());
        let cleanup = DeleteTopics::new(topics);
        kafka.create_topic(&topic, 2).await;
        let producer = kafka.producer();
        Some(Kafka {
            consumer,
            topic,
            producer,
            _cleanup: cleanup,
        })
    }

    async fn publish(&self, payload: &[u8]) {
        // One partition, so that the order of the dead letters is the
        // order of publishing.
        self.producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(&self.topic)
                    .partition(0)
                    .payload(payload),
                Duration::from_secs(10),
            )
            .await
            .expect("publish");
    }

    fn start(&self, handler: impl Fn(Points, Delivery) -> Call + Send + Sync + 'static) -> Running {
        let (stop, signal) = shutdown();
        let consumer = self.consumer.clone();
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    async fn dead(&self) -> Self::Dead {
        use idem_runtime::consume::kafka::dead::DeadLetters;
        let name = DeadLetters::default_name(&self.topic);
        assert_eq!(name, self.consumer.dead_letter_topic());
        let at = kafka_brokers();
        connected(|| DeadLetters::connect(&at, &name)).await
    }

    fn origin(&self) -> String {
        self.topic.clone()
    }

    fn absent_id(&self) -> String {
        "0:999999".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_are_listed_shown_replayed_and_purged() {
    let b = or_skip!(Kafka::open("dead_kafka").await);
    scenario(&b).await;
}

/// A replayed Kafka dead letter stays in its topic but leaves the listing:
/// it is shown with where its copy went, and not replayed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_replayed_dead_letter_is_not_replayed_twice() {
    let b = or_skip!(Kafka::open("dead_kafka_twice").await);
    b.publish(UNDECODABLE).await;
    let (store, fixed) = (MemoryStore::new(), Arc::new(AtomicBool::new(false)));
    let (done, seen): (Arc<Mutex<Vec<String>>>, Seen) = Default::default();
    let running = b.start(handler(&store, &fixed, &done, &seen));
    let dead = b.dead().await;
    eventually(Duration::from_secs(30), "a dead letter", || async {
        dead.count().await.unwrap() == 1
    })
    .await;
    running.stop().await;
    let id = dead.list(&Selection::new()).await.unwrap()[0].id.clone();
    let first = dead.replay(&Selection::new().id(&id)).await.unwrap();
    assert_eq!(first.count(), 1, "{first:?}");
    let shown = dead.show(&id).await.unwrap();
    let to = shown.replayed_to.expect("where the copy went");
    assert!(to.starts_with(&format!("{}/", b.topic)), "{to}");
    let twice = dead.replay(&Selection::all()).await.unwrap();
    assert_eq!(twice.count(), 0, "{twice:?}");
    assert_eq!(twice.skipped.len(), 1, "{twice:?}");
    assert!(
        twice.skipped[0].why.contains("replayed already"),
        "{twice:?}"
    );
    assert_eq!(dead.count().await.unwrap(), 0);
    assert!(dead.list(&Selection::new()).await.unwrap().is_empty());
    // The copy is in the work topic, with the replay's headers.
    let copies = idem_tests::brokers::kafka()
        .await
        .unwrap()
        .read(&b.topic)
        .await;
    use rdkafka::message::{Headers as _, Message as _};
    let copy = copies
        .iter()
        .find(|m| {
            m.headers()
                .is_some_and(|h| h.iter().any(|h| h.key == "x-idem-replayed-from"))
        })
        .expect("the copy");
    assert_eq!(copy.payload(), Some(UNDECODABLE));
    let header = |name: &str| {
        copy.headers()
            .and_then(|h| h.iter().find(|h| h.key == name))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("x-idem-replays").as_deref(), Some("1"));
    assert_eq!(
        header("x-idem-replayed-from"),
        Some(format!("{}/{id}", b.consumer.dead_letter_topic()))
    );
    assert_eq!(header("x-idem-reason"), None);
    assert_eq!(header("x-idem-failures"), None);
}
