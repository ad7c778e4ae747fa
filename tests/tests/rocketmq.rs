//! The consumer suite (`common/broker.rs`) on RocketMQ: each test on a
//! topic and a consumer group of its own (and the group's retry and
//! dead-letter topics), on the broker the tests start when none runs.

// The fixture holds rocketmq-client-rust's producer and pull consumer,
// whose types are deep (idem's own consumer hides them behind trait
// objects; a test's fixture need not).
#![recursion_limit = "256"]

mod common;

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
