//! The consumer suite (`common/broker.rs`) on NATS JetStream: each test on a
//! stream and subject of its own (and the dead-letter stream the consumer
//! declares for it), deleted afterwards.

use crate::common;

use std::future::Future;

use async_nats::jetstream::{self, consumer::pull};
use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use idem_runtime::consume::nats::Consumer;
use idem_runtime::consume::{Broker as Kind, Delivery, Policy};
use idem_runtime::{Error, Outcome};
use idem_tests::brokers::{DeleteStreams, nats_url};
use idem_tests::{or_skip, unique_table};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Nats {
    consumer: Consumer,
    stream: String,
    subject: String,
    js: jetstream::Context,
    _cleanup: DeleteStreams,
}

impl broker::Proxied for Nats {
    const PORT: u16 = 4222;
    const KEEPS_ACKS: bool = true;

    fn start_through(&self, port: u16, handler: broker::Boxed) -> Running {
        let (stop, signal) = broker::shutdown();
        let url = nats_url().replace(":4222", &format!(":{port}"));
        // Redelivered 2 s after a lost ack, not the default 30 s.
        let consumer = Consumer::new(url, self.stream.clone(), self.subject.clone())
            .ack_wait(Duration::from_secs(2));
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }
}

impl Broker for Nats {
    const TIERED: bool = false;
    const CUTS_PAST_GRACE: bool = true;

    async fn open(name: &str) -> Option<Self> {
        let js = idem_tests::brokers::jetstream().await?;
        let stream = unique_table(name);
        let subject = format!("idem.test.{stream}");
        let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone());
        let cleanup = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
        // The stream exists before anything is published to it.
        idem_tests::brokers::create_stream(
            &js,
            jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            },
        )
        .await;
        Some(Nats {
            consumer,
            stream,
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

    const KIND: Kind = Kind::Nats;

    fn queue_label(&self) -> String {
        self.consumer.durable_name().to_owned()
    }

    fn source(&self) -> String {
        self.subject.clone()
    }

    fn start_with_delivery<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static,
    {
        let (stop, signal) = broker::shutdown();
        let consumer = self.consumer.clone().policy(policy);
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    type To = idem_runtime::outbox::NatsDestination;

    async fn destination(&self) -> Self::To {
        idem_runtime::outbox::NatsDestination::connect(&nats_url())
            .await
            .expect("connect the destination")
    }

    const DROPS_REPEATED_IDS: bool = true;

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let Ok(mut dead) = self.js.get_stream(self.consumer.dead_letter_stream()).await else {
            return Vec::new();
        };
        let last = dead.info().await.expect("stream info").state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let Ok(m) = dead.get_raw_message(seq).await else {
                continue;
            };
            let header = |name: &str| {
                m.headers
                    .get(name)
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            out.push(DeadLetter {
                payload: m.payload.to_vec(),
                reason: header("Idem-Reason"),
                attempts: header("Idem-Deliveries").parse().unwrap_or(0),
            });
        }
        out
    }

    async fn waiting(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.stream).await.expect("the stream");
        match stream
            .get_consumer::<pull::Config>(self.consumer.durable_name())
            .await
        {
            Ok(mut c) => {
                let info = c.info().await.expect("consumer info");
                info.num_pending + info.num_ack_pending as u64
            }
            Err(_) => stream.info().await.expect("stream info").state.messages,
        }
    }
}

macro_rules! on_nats {
    ($($scenario:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let b = or_skip!(Nats::open(concat!("nats_", stringify!($scenario))).await);
            broker::$scenario(&b).await;
        }
    )*};
}

on_nats!(
    every_message_takes_effect_once,
    staged_messages_arrive_once_under_their_ids,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store,
    a_stopping_consumer_waits_no_longer_than_its_grace,
    a_connection_lost_mid_body_leaves_only_the_ack_to_the_redelivery,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
    a_wait_between_tiers_is_waited_exactly,
    store_faults_back_off_and_are_never_dead_lettered,
);

/// Two subjects of one stream, each with its own consumer: each handler
/// gets its own subject's messages, all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subjects_of_one_stream_get_their_own_consumers() {
    let js = or_skip!(idem_tests::brokers::jetstream().await);
    let stream = unique_table("nats_two_subjects");
    let (a, b) = (
        format!("idem.test.{stream}.a"),
        format!("idem.test.{stream}.b"),
    );
    let (ca, cb) = (
        Consumer::new(nats_url(), stream.clone(), a.clone()),
        Consumer::new(nats_url(), stream.clone(), b.clone()),
    );
    assert_ne!(ca.durable_name(), cb.durable_name());
    let _cleanup = DeleteStreams::new(vec![stream.clone(), ca.dead_letter_stream()]);
    idem_tests::brokers::create_stream(
        &js,
        jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![a.clone(), b.clone()],
            ..Default::default()
        },
    )
    .await;
    for i in 0..5 {
        for subject in [&a, &b] {
            js.publish(
                subject.clone(),
                common::broker::Points::payload(&format!("{subject}-{i}"), 1).into(),
            )
            .await
            .expect("publish")
            .await
            .expect("acknowledged");
        }
    }
    let mut runs = Vec::new();
    let mut all = Vec::new();
    for (consumer, subject) in [(ca, a.clone()), (cb, b.clone())] {
        let effects = std::sync::Arc::new(common::broker::Effects::default());
        let store = idem_runtime::MemoryStore::new();
        let (stop, signal) = broker::shutdown();
        let handler = {
            let effects = std::sync::Arc::clone(&effects);
            move |msg: Points| {
                let (store, effects) = (store.clone(), std::sync::Arc::clone(&effects));
                async move { common::broker::grant(&store, &msg, &effects).await }
            }
        };
        runs.push(Running::new(
            stop,
            tokio::spawn(consumer.run(handler, signal)),
        ));
        all.push((subject, effects));
    }
    for (subject, effects) in &all {
        common::eventually(
            std::time::Duration::from_secs(20),
            "five messages",
            || async { effects.total() == 5 },
        )
        .await;
        for i in 0..5 {
            assert_eq!(effects.of(&format!("{subject}-{i}")), 1, "{subject}");
        }
    }
    for r in runs {
        let report = r.stop().await;
        assert_eq!(report.acked, 5, "{report:?}");
    }
}

/// A durable that exists with other settings is refused at set-up, not used
/// as it is (its ack wait would have the server redeliver running bodies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_with_other_settings_is_refused() {
    let js = or_skip!(idem_tests::brokers::jetstream().await);
    let stream_name = unique_table("nats_refused");
    let subject = format!("idem.test.{stream_name}");
    let consumer = Consumer::new(nats_url(), stream_name.clone(), subject.clone());
    let _cleanup = DeleteStreams::new(vec![stream_name.clone(), consumer.dead_letter_stream()]);
    let stream = idem_tests::brokers::create_stream(
        &js,
        jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        },
    )
    .await;
    stream
        .create_consumer(pull::Config {
            durable_name: Some(consumer.durable_name().to_owned()),
            ack_wait: std::time::Duration::from_secs(5),
            filter_subject: subject,
            ..Default::default()
        })
        .await
        .expect("a durable with a 5 s ack wait");
    let store = idem_runtime::MemoryStore::new();
    let effects = std::sync::Arc::new(common::broker::Effects::default());
    let run = consumer.run(
        move |msg: Points| {
            let (store, effects) = (store.clone(), std::sync::Arc::clone(&effects));
            async move { common::broker::grant(&store, &msg, &effects).await }
        },
        idem_runtime::consume::CancellationToken::new(),
    );
    match tokio::time::timeout(std::time::Duration::from_secs(20), run).await {
        Ok(Err(idem_runtime::consume::ConsumeError::Setup(e))) => {
            assert!(e.to_string().contains("exists with other settings"), "{e}")
        }
        other => panic!("expected a set-up error, got {other:?}"),
    }
}

/// A handler whose store always fails, then comes back: one message,
/// whose retries wait `first_delay` plus for how long the store has been
/// failing: doubling, for one message alone.
fn failing_store(
    faults: usize,
    calls: &Arc<Mutex<Vec<(String, Instant)>>>,
) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static {
    let calls = Arc::clone(calls);
    move |msg: Points| {
        let calls = Arc::clone(&calls);
        Box::pin(async move {
            let n = {
                let mut calls = calls.lock().unwrap();
                calls.push((msg.id.clone(), Instant::now()));
                calls.iter().filter(|(id, _)| *id == msg.id).count()
            };
            if msg.id.starts_with("down") && n <= faults {
                return Err(Error::Store {
                    handler: "nats_store_fault",
                    key: None,
                    source: idem_runtime::StoreError::Backend("connection reset".into()),
                });
            }
            Ok(Outcome::Executed(msg.points))
        })
    }
}

type BoxedCall =
    std::pin::Pin<Box<dyn Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send>>;

/// The times of the calls of message `id`.
fn times_of(calls: &Mutex<Vec<(String, Instant)>>, id: &str) -> Vec<Instant> {
    let calls = calls.lock().unwrap();
    calls
        .iter()
        .filter(|(i, _)| i == id)
        .map(|(_, t)| *t)
        .collect()
}

/// The store is down (every call fails in it): the retries wait the first
/// delay plus the outage so far (0.2, 0.4, 0.8, 1.6 s), then the message
/// takes effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_met_with_growing_pauses() {
    let b = or_skip!(Nats::open("nats_store_outage").await);
    const FAULTS: usize = 4;
    let first_delay = Duration::from_millis(200);
    let calls: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let policy = Policy {
        first_delay,
        ..Policy::default()
    };
    let running = b.start(policy, failing_store(FAULTS, &calls));
    b.publish(&Points::payload("down", 3)).await;
    common::eventually(
        Duration::from_secs(30),
        "the call after the faults",
        || async { times_of(&calls, "down").len() > FAULTS },
    )
    .await;
    let report = running.stop().await;
    assert_eq!(
        (report.acked, report.retried),
        (1, FAULTS as u64),
        "{report:?}"
    );
    let times = times_of(&calls, "down");
    for (i, pair) in times.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        // 0.2, 0.4, 0.8, 1.6 s.
        let due = first_delay * (1 << i);
        assert!(
            gap >= due - Duration::from_millis(50) && gap < due * 2 + Duration::from_millis(500),
            "retry {} came {gap:?} after the call before it, not about {due:?}",
            i + 1
        );
    }
    assert_eq!(b.waiting().await, 0);
}

/// A message that meets store faults while the store serves other messages
/// (a store that fails now and then) is retried after the first delay each
/// time, however many deliveries it has behind it: a backoff doubling with
/// them left messages waiting 30 s and more behind a flapping store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_store_costs_the_first_delay_whatever_the_deliveries() {
    let b = or_skip!(Nats::open("nats_store_flaps").await);
    const FAULTS: usize = 5;
    let first_delay = Duration::from_millis(300);
    let calls: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let policy = Policy {
        first_delay,
        ..Policy::default()
    };
    let running = b.start(policy, failing_store(FAULTS, &calls));
    b.publish(&Points::payload("down-flap", 3)).await;
    // Other messages go through meanwhile, every 50 ms.
    let mut sent = 0;
    while times_of(&calls, "down-flap").len() <= FAULTS {
        assert!(sent < 400, "the faulty message did not get through in 20 s");
        b.publish(&Points::payload(&format!("ok-{sent}"), 1)).await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = running.stop().await;
    assert_eq!(report.retried, FAULTS as u64, "{report:?}");
    let times = times_of(&calls, "down-flap");
    for (i, pair) in times.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        // Doubling with the deliveries, they would be 0.3, 0.6, 1.2, 2.4, 4.8 s.
        assert!(
            gap >= first_delay - Duration::from_millis(50) && gap < Duration::from_millis(1_100),
            "retry {} came {gap:?} after the call before it",
            i + 1
        );
    }
}
/// `declare` makes the streams, with the dead-letter names it was given,
/// and the durable, before any consumer runs: what is published then is
/// kept for the consumer, where a core NATS publish before it is dropped
/// (no stream captures the subject, and the publisher hears nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_makes_the_topology_so_nothing_published_before_a_consumer_is_lost() {
    let js = or_skip!(idem_tests::brokers::jetstream().await);
    let stream = unique_table("nats_declare");
    let subject = format!("idem.test.{stream}");
    let (dead_stream, dead_subject) = (format!("{stream}_PARKED"), format!("idem.parked.{stream}"));
    let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone())
        .dead_letters(dead_stream.clone(), dead_subject.clone());
    let _cleanup = DeleteStreams::new(vec![stream.clone(), dead_stream.clone()]);
    // Before `declare`: a core publish that nothing keeps.
    let client = async_nats::connect(nats_url()).await.expect("a client");
    client
        .publish(subject.clone(), Points::payload("before", 1).into())
        .await
        .expect("publish");
    client.flush().await.expect("flush");

    consumer.declare().await.expect("declared");
    let mut dead = js
        .get_stream(&dead_stream)
        .await
        .expect("the dead-letter stream");
    assert_eq!(
        dead.info().await.expect("info").config.subjects,
        [dead_subject]
    );
    let kept = js.get_stream(&stream).await.expect("the stream");
    kept.get_consumer::<pull::Config>(consumer.durable_name())
        .await
        .expect("the durable");
    assert!(
        js.get_stream(format!("{stream}_DEAD")).await.is_err(),
        "no stream of the default name"
    );
    consumer.declare().await.expect("declared again");

    for i in 0..3 {
        client
            .publish(
                subject.clone(),
                Points::payload(&format!("after-{i}"), 1).into(),
            )
            .await
            .expect("publish");
    }
    client
        .publish(subject.clone(), "not points".into())
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    common::eventually(std::time::Duration::from_secs(10), "four kept", || async {
        messages_in(&js, &stream).await == 4
    })
    .await;

    let store = idem_runtime::MemoryStore::new();
    let effects = std::sync::Arc::new(common::broker::Effects::default());
    let handler = {
        let effects = std::sync::Arc::clone(&effects);
        move |msg: Points| {
            let (store, effects) = (store.clone(), std::sync::Arc::clone(&effects));
            async move { common::broker::grant(&store, &msg, &effects).await }
        }
    };
    let (stop, signal) = broker::shutdown();
    let running = Running::new(stop, tokio::spawn(consumer.run(handler, signal)));
    common::eventually(
        std::time::Duration::from_secs(20),
        "three effects and a dead letter",
        || async { effects.total() == 3 && messages_in(&js, &dead_stream).await == 1 },
    )
    .await;
    let report = running.stop().await;
    assert_eq!((report.acked, report.dead_lettered), (3, 1), "{report:?}");
    assert_eq!(effects.of("before"), 0, "dropped before the stream existed");
    for i in 0..3 {
        assert_eq!(effects.of(&format!("after-{i}")), 1);
    }
}

/// Names JetStream refuses are refused by `declare` and `run` alike,
/// before the server is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_jetstream_refuses_are_refused_before_connecting() {
    // nothing listens there: a refusal that needed the server would fail
    // to connect instead
    let nowhere = "nats://127.0.0.1:1";
    let c = || Consumer::new(nowhere, "ORDERS", "orders.placed");
    for (consumer, says) in [
        (c().dead_letters("ORDERS.DEAD", "idem.dead.orders"), "'.'"),
        (c().dead_letters("ORDERS DEAD", "idem.dead.orders"), "' '"),
        (c().dead_letters("ORDERS_DEAD", "idem.dead.>"), "wildcard"),
        (
            c().dead_letters("ORDERS", "idem.dead.orders"),
            "consumer's stream",
        ),
        (Consumer::new(nowhere, "ORD*ERS", "orders.placed"), "'*'"),
        (c().durable("stock>"), "'>'"),
        (
            Consumer::new(nowhere, "ORDERS", "orders..placed"),
            "empty token",
        ),
    ] {
        match consumer.declare().await {
            Err(idem_runtime::consume::ConsumeError::Setup(e)) => {
                assert!(e.to_string().contains(says), "{says}: {e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let run = consumer.run(
            |_: Points| async { Ok::<_, Error<AppError>>(Outcome::Executed(0u32)) },
            idem_runtime::consume::CancellationToken::new(),
        );
        match tokio::time::timeout(std::time::Duration::from_secs(5), run).await {
            Ok(Err(idem_runtime::consume::ConsumeError::Setup(e))) => {
                assert!(e.to_string().contains(says), "{says}: {e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

/// How many messages `stream` holds now.
async fn messages_in(js: &jetstream::Context, stream: &str) -> u64 {
    let mut s = js.get_stream(stream).await.expect("the stream");
    s.info().await.expect("stream info").state.messages
}
