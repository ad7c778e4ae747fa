//! The consumer's token fired while bodies run, on every store and in both
//! modes: a body that took its effect and then waits for its provider is
//! let run to its recorded outcome before the consumer returns, and a
//! redelivery of its message gets that outcome without running it again.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::consume::Policy;
use idem_runtime::{ClaimOrder, PgTx, RoundTrips, SqliteTx, idempotent};

use super::{Broker, Effects, Points, Running, settles_to};
use crate::common::lease::{LeaseFixture, Time};
use crate::common::tx::{Open, StoreKind, TxFixture};
use crate::common::{AppError, Db, PgDb, RedisFx, eventually};

/// How long a body waits after its effect: the token fires meanwhile.
const PROVIDER: Duration = Duration::from_millis(600);

/// Lease mode on whatever lease store it is given: the effect is the
/// consumer's own count, as an SMS sent; then it waits for its provider.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    name = "broker_cut_lease"
)]
async fn cut_lease(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    effects.apply(&msg.id);
    tokio::time::sleep(PROVIDER).await;
    Ok(msg.points)
}

/// Transaction mode on PostgreSQL: the effect is a ledger row written in
/// the claim's transaction.
#[idempotent(key = "msg.id", ttl = "1h", store = "postgres", name = "broker_cut_pg")]
async fn cut_tx_pg(tx: &mut PgTx<'_>, msg: &Points, db: &PgDb) -> Result<u32, AppError> {
    db.add_ledger_in(tx, &msg.id, 1).await?;
    tokio::time::sleep(PROVIDER).await;
    Ok(msg.points)
}

/// Transaction mode on SQLite, as on PostgreSQL.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "sqlite",
    name = "broker_cut_sqlite"
)]
async fn cut_tx_sqlite(tx: &mut SqliteTx<'_>, msg: &Points, db: &Db) -> Result<u32, AppError> {
    db.add_ledger_in(tx, &msg.id, 1).await?;
    tokio::time::sleep(PROVIDER).await;
    Ok(msg.points)
}

/// The stores of the scenario, each of the test's own.
struct Stores {
    redis: RedisFx,
    sqlite_lease: Db,
    pg_lease: PgDb,
    sqlite_tx: Db,
    pg_tx: PgDb,
    /// The lease-mode effects, by message id.
    effects: Effects,
}

impl Stores {
    async fn open() -> Option<Stores> {
        Some(Stores {
            redis: RedisFx::open(Time::Real).await?,
            sqlite_lease: <Db as LeaseFixture>::open(Time::Real).await?,
            pg_lease: <PgDb as LeaseFixture>::open(Time::Real).await?,
            sqlite_tx: <Db as TxFixture>::open(StoreKind::Sqlite, Open::Plain).await?,
            pg_tx: <PgDb as TxFixture>::open(
                StoreKind::Pg(ClaimOrder::Last, RoundTrips::Separate),
                Open::Plain,
            )
            .await?,
            effects: Effects::default(),
        })
    }

    /// The message ids, one a store and mode.
    const IDS: [&'static str; 5] = [
        "cut-lease-redis",
        "cut-lease-sqlite",
        "cut-lease-pg",
        "cut-tx-sqlite",
        "cut-tx-pg",
    ];

    /// Runs `msg` through the handler of its store and mode.
    async fn handle(
        &self,
        msg: &Points,
    ) -> Result<idem_runtime::Outcome<u32>, idem_runtime::Error<AppError>> {
        match msg.id.as_str() {
            "cut-lease-redis" => cut_lease(self.redis.store(), msg, &self.effects).await,
            "cut-lease-sqlite" => {
                cut_lease(LeaseFixture::store(&self.sqlite_lease), msg, &self.effects).await
            }
            "cut-lease-pg" => {
                cut_lease(LeaseFixture::store(&self.pg_lease), msg, &self.effects).await
            }
            "cut-tx-sqlite" => {
                cut_tx_sqlite(TxFixture::store(&self.sqlite_tx), msg, &self.sqlite_tx).await
            }
            "cut-tx-pg" => cut_tx_pg(TxFixture::store(&self.pg_tx), msg, &self.pg_tx).await,
            other => panic!("no store for {other}"),
        }
    }

    /// How often `id`'s effect took place.
    async fn effects(&self, id: &str) -> u32 {
        match id {
            "cut-tx-sqlite" => TxFixture::ledger_rows(&self.sqlite_tx, id).await as u32,
            "cut-tx-pg" => TxFixture::ledger_rows(&self.pg_tx, id).await as u32,
            _ => self.effects.of(id),
        }
    }

    /// Whether every message took effect (committed or not).
    fn all_started(&self, started: &Effects) -> bool {
        Self::IDS.iter().all(|id| started.of(id) > 0)
    }
}

/// Five messages, one for each store and mode (lease mode on Redis, SQLite
/// and PostgreSQL; transaction mode on SQLite and PostgreSQL). Once every
/// body took its effect and waits 600 ms for its provider, the consumer's
/// token fires: the consumer takes nothing more, lets the five bodies end
/// and acks them. Each effect happened once; the five published again are
/// acked as duplicates, their bodies not run.
pub(crate) async fn the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store<
    B: Broker,
>(
    b: &B,
) {
    let Some(stores) = Stores::open().await else {
        return;
    };
    let stores = Arc::new(stores);
    let started = Arc::new(Effects::default());
    let policy = Policy {
        concurrency: 5,
        ..Policy::default()
    };
    let start = |stores: &Arc<Stores>, started: &Arc<Effects>| {
        let (stores, started) = (Arc::clone(stores), Arc::clone(started));
        b.start(policy.clone(), move |msg: Points| {
            let (stores, started) = (Arc::clone(&stores), Arc::clone(&started));
            async move {
                started.apply(&msg.id);
                stores.handle(&msg).await
            }
        })
    };
    for id in Stores::IDS {
        b.publish(&Points::payload(id, 7)).await;
    }
    let running = start(&stores, &started);
    eventually(Duration::from_secs(30), "every body running", || async {
        stores.all_started(&started)
    })
    .await;
    // Each body has taken its effect (it does so first) or is about to.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = running.stop().await;
    assert_eq!(
        report.acked, 5,
        "the bodies in flight were let end: {report:?}"
    );
    for id in Stores::IDS {
        assert_eq!(stores.effects(id).await, 1, "{id} took effect once");
    }
    settles_to(b, 0).await;

    for id in Stores::IDS {
        b.publish(&Points::payload(id, 7)).await;
    }
    let again = Arc::new(Effects::default());
    let running = start(&stores, &again);
    eventually(Duration::from_secs(30), "every copy handled", || async {
        stores.all_started(&again)
    })
    .await;
    // The copies in flight are let end too.
    let report = running.stop().await;
    assert_eq!(
        report.duplicates, 5,
        "the copies got the recorded outcomes: {report:?}"
    );
    for id in Stores::IDS {
        assert_eq!(stores.effects(id).await, 1, "{id} did not run again");
    }
}

/// A body that takes its effect, then waits 5 s: longer than the grace.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    name = "broker_past_grace"
)]
async fn past_grace(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    past_grace_body(msg, effects).await
}

/// [`past_grace`] under a name of its own, for the brokers that let the
/// body run on ([`Broker::CUTS_PAST_GRACE`] false): their check that no
/// drop is counted must not see the other brokers' drops, counted in the
/// same process.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    name = "broker_runs_past_grace"
)]
async fn runs_past_grace(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    past_grace_body(msg, effects).await
}

async fn past_grace_body(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    effects.apply(&msg.id);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(msg.points)
}

/// A body still running when the stopping consumer's grace (300 ms) runs
/// out: the consumer returns without waiting for the body's 5 s, and the
/// message is left for the next consumer. RabbitMQ's and NATS's consumers
/// drop the body (counted in `idem_bodies_dropped_total`) and hand its
/// message back; Kafka's commits what is settled, so the message's offset
/// stays before it, and lets the body run on.
pub(crate) async fn a_stopping_consumer_waits_no_longer_than_its_grace<B: Broker>(b: &B) {
    use idem_runtime::metric;

    let seen = super::capture();
    let handler = if B::CUTS_PAST_GRACE {
        "broker_past_grace"
    } else {
        "broker_runs_past_grace"
    };
    let dropped = || {
        seen.sum(
            metric::BODIES_DROPPED,
            &[("handler", handler), ("mode", "lease")],
        )
    };
    let before = dropped();
    b.publish(&Points::payload("past-grace-1", 1)).await;
    let (store, effects) = (
        idem_runtime::MemoryStore::new(),
        Arc::new(Effects::default()),
    );
    let policy = Policy {
        grace: Duration::from_millis(300),
        ..Policy::default()
    };
    let running = {
        let effects = Arc::clone(&effects);
        b.start(policy, move |msg: Points| {
            let (store, effects) = (store.clone(), Arc::clone(&effects));
            async move {
                if B::CUTS_PAST_GRACE {
                    past_grace(&store, &msg, &effects).await
                } else {
                    runs_past_grace(&store, &msg, &effects).await
                }
            }
        })
    };
    eventually(Duration::from_secs(20), "the body running", || async {
        effects.of("past-grace-1") == 1
    })
    .await;
    let asked = std::time::Instant::now();
    let report = running.stop().await;
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the consumer returned once the grace ran out, not after the body: {:?}",
        asked.elapsed()
    );
    assert_eq!(report.acked, 0, "{report:?}");
    settles_to(b, 1).await;
    if B::CUTS_PAST_GRACE {
        assert!(dropped() >= before + 1.0, "the dropped body is counted");
    } else {
        // Run on: its effect stays one, and it is no drop.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(effects.of("past-grace-1"), 1);
        assert_eq!(dropped(), before, "the body ran on to its end");
    }
}

/// A handler, boxed: what [`Proxied::start_through`] runs.
pub(crate) type Boxed = Box<
    dyn Fn(
            Points,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<
                        Output = Result<idem_runtime::Outcome<u32>, idem_runtime::Error<AppError>>,
                    > + Send,
            >,
        > + Send
        + Sync,
>;

/// A broker whose consumer can reach it through a proxy the test cuts
/// (RabbitMQ, NATS: a Kafka broker tells its clients its own address).
pub(crate) trait Proxied: Broker {
    /// The broker's port on loopback.
    const PORT: u16;
    /// Whether the client keeps an ack sent while its connection is down
    /// and sends it once reconnected (NATS's client buffers what it
    /// publishes), rather than losing it (RabbitMQ: unacked messages go
    /// back with the channel).
    const KEEPS_ACKS: bool;
    /// Starts a consumer of the fixture's queue or stream that reaches the
    /// broker at `port` on loopback, around `handler`.
    fn start_through(&self, port: u16, handler: Boxed) -> Running;
}

/// The consumer's connection is cut (through a proxy: a real loss of the
/// socket) while the body waits for its provider, and stays cut until the
/// body is over. The body goes on to its recorded outcome, and only its
/// ack is left: lost with the connection, the broker delivers the message
/// again once the consumer is back, and that delivery is answered the
/// recorded outcome without running the body; or kept by the client and
/// sent once it reconnects. Either way the SMS went once.
pub(crate) async fn a_connection_lost_mid_body_leaves_only_the_ack_to_the_redelivery<B: Proxied>(
    b: &B,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idem_runtime::Outcome;
    use idem_tests::brokers::CutProxy;

    let redis = Arc::new(match RedisFx::open(Time::Real).await {
        Some(redis) => redis,
        None => return,
    });
    let proxy = CutProxy::start(idem_tests::free_port().expect("a free port"), B::PORT).await;
    let sent = Arc::new(Effects::default());
    let (calls, duplicates) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler: Boxed = {
        let (redis, sent, calls, duplicates) = (
            Arc::clone(&redis),
            Arc::clone(&sent),
            Arc::clone(&calls),
            Arc::clone(&duplicates),
        );
        Box::new(move |msg: Points| {
            let (redis, sent, calls, duplicates) = (
                Arc::clone(&redis),
                Arc::clone(&sent),
                Arc::clone(&calls),
                Arc::clone(&duplicates),
            );
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let out = cut_lease(redis.store(), &msg, &sent).await;
                if matches!(out, Ok(Outcome::Duplicate(_))) {
                    duplicates.fetch_add(1, Ordering::SeqCst);
                }
                out
            })
        })
    };
    let running = b.start_through(proxy.port(), handler);
    b.publish(&Points::payload("cut-connection-1", 5)).await;
    eventually(Duration::from_secs(20), "the SMS sent", || async {
        sent.of("cut-connection-1") == 1
    })
    .await;
    proxy.cut();
    // Past the body's end: its ack can only fail.
    tokio::time::sleep(PROVIDER + Duration::from_millis(400)).await;
    proxy.restore();
    if B::KEEPS_ACKS {
        eventually(
            Duration::from_secs(30),
            "the late ack settled it",
            || async { b.waiting().await == 0 },
        )
        .await;
    } else {
        eventually(
            Duration::from_secs(30),
            "the redelivery answered the recorded outcome",
            || async { duplicates.load(Ordering::SeqCst) == 1 },
        )
        .await;
    }
    let report = running.stop().await;
    assert_eq!(sent.of("cut-connection-1"), 1, "the SMS went once");
    let (deliveries, duplicates) = if B::KEEPS_ACKS { (1, 0) } else { (2, 1) };
    assert_eq!(calls.load(Ordering::SeqCst), deliveries, "{report:?}");
    assert_eq!(report.duplicates, duplicates, "{report:?}");
    settles_to(b, 0).await;
}
