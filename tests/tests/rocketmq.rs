//! The consumer suite (`common/broker.rs`) on RocketMQ: each test on a
//! topic and a consumer group of its own (and the group's retry and
//! dead-letter topics), on the broker the tests start when none runs.

// The fixture holds rocketmq-client-rust's producer and pull consumer,
// whose types are deep (idem's own consumer hides them behind trait
// objects; a test's fixture need not): the behaviour binary raises its
// recursion limit for them (tests/behaviour.rs).

use crate::common;

use std::future::Future;

use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use idem_runtime::consume::rocketmq::Consumer;
use idem_runtime::consume::{Broker as Kind, Delivery, Policy};
use idem_runtime::{Error, Outcome};
use idem_tests::brokers::{RocketMq, rocketmq, rocketmq_delay_levels};
use idem_tests::{or_skip, unique_table};

struct Rocket {
    mq: RocketMq,
    consumer: Consumer,
    topic: String,
}

impl Rocket {
    fn property(
        msg: &rocketmq_model::common::message::message_ext::MessageExt,
        name: &str,
    ) -> String {
        msg.properties()
            .get(name)
            .map(|v| v.to_string())
            .unwrap_or_default()
    }
}

impl Broker for Rocket {
    // A wait between two delay levels is sent on at the level below what is
    // left; what is left below the shortest level (1 s here) waits in the
    // consumer: the suite's 1.2 s is 1 s at level 1, then 200 ms here.
    const TIERED: bool = false;
    const CUTS_PAST_GRACE: bool = true;

    async fn open(name: &str) -> Option<Self> {
        let mq = rocketmq().await?;
        let topic = unique_table(name);
        mq.create_topic(&topic, 4).await;
        let consumer =
            Consumer::new(mq.name_server(), topic.clone()).delay_levels(rocketmq_delay_levels());
        Some(Rocket {
            mq,
            consumer,
            topic,
        })
    }

    async fn publish(&self, payload: &[u8]) {
        self.mq.publish(&self.topic, payload, None).await;
    }

    const KIND: Kind = Kind::RocketMq;

    fn queue_label(&self) -> String {
        self.consumer.group_name().to_owned()
    }

    fn source(&self) -> String {
        self.topic.clone()
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

    type To = idem_runtime::outbox::RocketMqDestination;

    async fn destination(&self) -> Self::To {
        idem_runtime::outbox::RocketMqDestination::connect(self.mq.name_server())
            .await
            .expect("connect the destination")
    }

    const DROPS_REPEATED_IDS: bool = false;

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.mq
            .read(&self.consumer.dead_letter_topic())
            .await
            .into_iter()
            .map(|m| DeadLetter {
                payload: m.message.body_slice().to_vec(),
                reason: Self::property(&m, "x-idem-reason"),
                attempts: Self::property(&m, "x-idem-failures").parse().unwrap_or(0),
            })
            .collect()
    }

    async fn waiting(&self) -> u64 {
        // The topic, idem's retry topic, and the broker's retry topic, where
        // what the client hands back goes.
        let group = self.consumer.group_name();
        let mut waiting = 0;
        for topic in [
            self.topic.clone(),
            self.consumer.retry_topic(),
            format!("%RETRY%{group}"),
        ] {
            waiting += self.mq.lag(group, &topic).await;
        }
        waiting
    }
}

macro_rules! on_rocketmq {
    ($($scenario:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let b = or_skip!(Rocket::open(concat!("rmq_", stringify!($scenario))).await);
            broker::$scenario(&b).await;
        }
    )*};
}

on_rocketmq!(
    every_message_takes_effect_once,
    staged_messages_arrive_once_under_their_ids,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store,
    a_stopping_consumer_waits_no_longer_than_its_grace,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
    a_wait_between_tiers_is_waited_exactly,
    store_faults_back_off_and_are_never_dead_lettered,
);

/// Calls of a handler by message id, and how many ran at once.
#[derive(Default)]
struct Seen {
    calls: std::sync::Mutex<std::collections::HashMap<String, Vec<u32>>>,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Seen {
    /// Notes a call of `id` with its delivery count; returns a guard that
    /// counts it running until dropped.
    fn call(self: &std::sync::Arc<Self>, id: &str, deliveries: u32) -> Running_ {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default()
            .push(deliveries);
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        Running_(std::sync::Arc::clone(self))
    }

    fn calls(&self) -> std::collections::HashMap<String, Vec<u32>> {
        self.calls.lock().unwrap().clone()
    }
}

struct Running_(std::sync::Arc<Seen>);

impl Drop for Running_ {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The client calls its listener on a blocking lane of its runtime, by
/// default twice the cores with 16 more queued, with 20 consumer threads:
/// on a small machine calls beyond the lane waited, or failed before the
/// listener ran and came back through the broker's retry topic. idem sizes
/// the lane to the policy: 16 bodies run at once, each message is called
/// once, on its first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policys_concurrency_runs_whatever_the_cores() {
    use std::sync::Arc;
    use std::time::Duration;
    let b = or_skip!(Rocket::open("rmq_concurrency").await);
    let n = 48;
    for i in 0..n {
        b.publish(&Points::payload(&format!("c-{i}"), 1)).await;
    }
    let seen = Arc::new(Seen::default());
    let store = idem_runtime::MemoryStore::new();
    let effects = Arc::new(common::broker::Effects::default());
    let running = {
        let (seen, effects) = (Arc::clone(&seen), Arc::clone(&effects));
        let policy = Policy {
            concurrency: 16,
            ..Policy::default()
        };
        b.start_with_delivery(policy, move |msg: Points, d: Delivery| {
            let running = seen.call(&msg.id, d.deliveries);
            let (store, effects) = (store.clone(), Arc::clone(&effects));
            async move {
                let _running = running;
                // a provider that takes its time
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                common::broker::grant(&store, &msg, &effects).await
            }
        })
    };
    common::eventually(
        Duration::from_secs(60),
        "every message's effect",
        || async { effects.total() == n },
    )
    .await;
    let report = running.stop().await;
    let calls = seen.calls();
    println!(
        "at most {} bodies at once; {report:?}",
        seen.most.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_eq!(calls.len(), n as usize);
    for (id, deliveries) in &calls {
        assert_eq!(deliveries, &[1], "{id}: called once, on its first delivery");
    }
    assert_eq!(
        seen.most.load(std::sync::atomic::Ordering::SeqCst),
        16,
        "the policy's concurrency, no more and no less"
    );
    assert_eq!(
        (report.acked, report.retried, report.dead_lettered),
        (n.into(), 0, 0)
    );
}

/// A stop while bodies run: they reach their outcome, and the offsets of
/// what ran are committed before the consumer returns, so a consumer that
/// takes over calls none of them again (the client's own shutdown returns
/// at once and commits nothing of what its listener was still running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_commits_what_ran_so_a_successor_calls_none_of_it_again() {
    use std::sync::Arc;
    use std::time::Duration;
    let b = or_skip!(Rocket::open("rmq_stop_commits").await);
    let n = 24;
    for i in 0..n {
        b.publish(&Points::payload(&format!("s-{i}"), 1)).await;
    }
    let seen = Arc::new(Seen::default());
    let store = idem_runtime::MemoryStore::new();
    let effects = Arc::new(common::broker::Effects::default());
    let start = |b: &Rocket| {
        let (seen, effects, store) = (Arc::clone(&seen), Arc::clone(&effects), store.clone());
        let policy = Policy {
            concurrency: 4,
            ..Policy::default()
        };
        b.start_with_delivery(policy, move |msg: Points, d: Delivery| {
            let running = seen.call(&msg.id, d.deliveries);
            let (store, effects) = (store.clone(), Arc::clone(&effects));
            async move {
                let _running = running;
                tokio::time::sleep(Duration::from_millis(800)).await;
                common::broker::grant(&store, &msg, &effects).await
            }
        })
    };
    let first = start(&b);
    common::eventually(Duration::from_secs(30), "some bodies running", || async {
        seen.calls().len() >= 6
    })
    .await;
    let report = first.stop().await;
    let ran = effects.total();
    assert!(
        ran >= 4 && ran < n,
        "stopped mid-way: {ran} of {n} ({report:?})"
    );
    assert_eq!(u64::from(ran), report.acked, "{report:?}");
    let second = start(&b);
    common::eventually(
        Duration::from_secs(60),
        "every message's effect",
        || async { effects.total() == n },
    )
    .await;
    let report = second.stop().await;
    for (id, deliveries) in seen.calls() {
        assert_eq!(
            deliveries.len(),
            1,
            "{id} was called again: {deliveries:?} ({report:?})"
        );
    }
    for i in 0..n {
        assert_eq!(effects.of(&format!("s-{i}")), 1, "s-{i}");
    }
}
