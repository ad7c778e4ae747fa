//! The consumer's token fired while bodies run, on every store and in both
//! modes: a body that took its effect and then waits for its provider is
//! let run to its recorded outcome before the consumer returns, and a
//! redelivery of its message gets that outcome without running it again.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::consume::Policy;
use idem_runtime::{ClaimOrder, PgTx, RoundTrips, SqliteTx, idempotent};

use super::{Broker, Effects, Points, settles_to};
use crate::common::lease::{LeaseFixture, Time};
use crate::common::tx::{Open, StoreKind, TxFixture};
use crate::common::{AppError, Db, PgDb, RedisFx, eventually};

/// How long a body waits after its effect: the token fires meanwhile.
const PROVIDER: Duration = Duration::from_millis(600);

/// Lease mode on whatever lease store it is given: the effect is the
/// consumer's own count, as an SMS sent.
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
