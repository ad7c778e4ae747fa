//! The transaction-mode behaviour suite, written once and run on every SQL
//! store (and, on PostgreSQL, each claim order). The claim, the body's
//! writes (an `inventory` update and a `ledger` insert through the
//! handler's transaction) and the recorded outcome commit together or not at
//! all; every effect is read back from the business tables.
//!
//! * The scenarios are generic functions over a [`TxHandlers`] fixture; each
//!   opens the fixture it needs ([`Open`]) as the [`StoreKind`] it is given.
//! * The handlers take the transaction of one store type, so each SQL
//!   fixture defines its own with [`handlers!`] (three thin wrappers around
//!   the bodies here), which also implements [`TxHandlers`].
//! * [`suite!`] stamps out one `#[tokio::test]` per scenario:
//!   `tx::suite!(Db, StoreKind::Sqlite);`.
//!
//! Where the stores' documented behaviour differs, the tests assert each
//! store's own: under `ClaimOrder::Last` (PostgreSQL, MySQL) a duplicate's
//! body runs and is rolled back ([`StoreKind::body_runs`]), a delivery
//! waiting on an open first delivery ends differently per store
//! ([`Waited`]), and MySQL counts its lock wait in whole seconds
//! ([`StoreKind::lock_timeout`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::clock::TimeShift;
use idem_runtime::store::TxStore;
use idem_runtime::{
    ClaimOrder, Contention, Error, Key, Outcome, Record, RoundTrips, Status, StoreError,
};
use idem_tests::or_skip;

use super::ops::{OpsError, Reserve, Settled};
use super::{AppError, Probe, Tally, together};

// The scenarios about batch handlers.
#[allow(unused_imports)]
pub(crate) use super::tx_batch::{
    a_batch_body_answering_too_few_values_rolls_back,
    a_batch_commits_each_fresh_message_with_its_writes_in_input_order,
    a_failing_batch_rolls_back_every_write_and_records_nothing,
    overlapping_batches_from_8_consumers_commit_every_key_once,
};

// The scenarios about failures and payloads.
#[allow(unused_imports)]
pub(crate) use super::tx_ops::{
    a_final_error_rolls_back_and_is_replayed, a_settled_key_runs_no_body_but_claiming_last,
    deliveries_with_another_payload_are_mismatches,
    failures_are_counted_exactly_under_16_concurrent_consumers,
};

// ---------------------------------------------------------------------------
// The stores

/// Which store (and, on PostgreSQL and MySQL, which [`ClaimOrder`]) the
/// suite runs on: where their documented behaviour differs, the scenarios
/// assert each one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    Sqlite,
    /// PostgreSQL, claiming in this order, sending the dedup row so.
    Pg(ClaimOrder, RoundTrips),
    /// MySQL/MariaDB, likewise.
    MySql(ClaimOrder, RoundTrips),
    /// PostgreSQL on a dedup table partitioned by time
    /// (`PgStore::with_partitions`, one partition a minute), claiming in
    /// this order, sending the dedup row so: what the suite asks of it is
    /// what it asks of a plain table.
    PgPartitioned(ClaimOrder, RoundTrips),
}

impl StoreKind {
    /// The kind as the suite's expectations see it: a partitioned
    /// PostgreSQL table answers as a plain one.
    fn claims(self) -> StoreKind {
        match self {
            StoreKind::PgPartitioned(order, trips) => StoreKind::Pg(order, trips),
            kind => kind,
        }
    }

    /// Whether a delivery of a key whose record is settled (an outcome, a
    /// final error, another payload's) runs its body before the store finds
    /// the record. Only `ClaimOrder::Last` does (PostgreSQL, MySQL): the
    /// dedup row is inserted after the body, and the body's writes roll back
    /// when that insert finds the row. SQLite, `ClaimOrder::First` and
    /// `ClaimOrder::Checked` read or claim before the body and turn the
    /// duplicate away.
    pub(crate) fn duplicate_runs_body(self) -> bool {
        matches!(
            self.claims(),
            StoreKind::Pg(ClaimOrder::Last, _) | StoreKind::MySql(ClaimOrder::Last, _)
        )
    }

    /// Whether a delivery that arrives while the first delivery's
    /// transaction is open may run its body: claiming last, with or without
    /// the read before the body, which finds nothing committed yet.
    pub(crate) fn racing_duplicate_may_run_body(self) -> bool {
        matches!(
            self.claims(),
            StoreKind::Pg(ClaimOrder::Last | ClaimOrder::Checked, _)
                | StoreKind::MySql(ClaimOrder::Last | ClaimOrder::Checked, _)
        )
    }

    /// The lock timeout a scenario that wants `wanted` sets on this store:
    /// `wanted` itself, except on MySQL, whose `innodb_lock_wait_timeout` is
    /// a whole number of seconds, at least one: `wanted` rounded up.
    pub(crate) fn lock_timeout(self, wanted: Duration) -> Duration {
        match self {
            StoreKind::MySql(..) => {
                let secs = wanted.as_secs() + u64::from(wanted.subsec_nanos() > 0);
                Duration::from_secs(secs.max(1))
            }
            StoreKind::Sqlite | StoreKind::Pg(..) | StoreKind::PgPartitioned(..) => wanted,
        }
    }

    /// How often bodies run for `executed` deliveries that commit and
    /// `duplicates` deliveries that come once the key is settled.
    pub(crate) fn body_runs(self, executed: usize, duplicates: usize) -> usize {
        if self.duplicate_runs_body() {
            executed + duplicates
        } else {
            executed
        }
    }

    /// How often bodies may run for `executed` deliveries that commit and
    /// `duplicates` that run concurrently with them: exactly
    /// [`body_runs`](Self::body_runs) but for `ClaimOrder::Checked`, whose
    /// duplicates run their body when they read before the first commits,
    /// and not when they read after.
    pub(crate) fn racing_body_runs(
        self,
        executed: usize,
        duplicates: usize,
    ) -> std::ops::RangeInclusive<usize> {
        if self.racing_duplicate_may_run_body() && !self.duplicate_runs_body() {
            executed..=executed + duplicates
        } else {
            let runs = self.body_runs(executed, duplicates);
            runs..=runs
        }
    }

    /// How this store ends a delivery that waits past the lock timeout.
    pub(crate) fn waited(self) -> Waited {
        match self {
            StoreKind::Sqlite => Waited::StoreTimeout,
            StoreKind::Pg(ClaimOrder::First, _)
            | StoreKind::PgPartitioned(ClaimOrder::First, _)
            | StoreKind::MySql(ClaimOrder::First, _) => Waited::InProgress,
            StoreKind::Pg(ClaimOrder::Last | ClaimOrder::Checked, _)
            | StoreKind::PgPartitioned(ClaimOrder::Last | ClaimOrder::Checked, _)
            | StoreKind::MySql(ClaimOrder::Last | ClaimOrder::Checked, _) => {
                Waited::BodyLockTimeout
            }
        }
    }

    /// Whether `text` is this server's error, as sqlx writes it, for a
    /// statement that waited on a row lock past the lock timeout:
    /// PostgreSQL's `lock_not_available` (SQLSTATE 55P03); MySQL's
    /// `ER_LOCK_WAIT_TIMEOUT` (error 1205, whose SQLSTATE, HY000, says
    /// nothing of its own).
    pub(crate) fn is_lock_timeout(self, text: &str) -> bool {
        match self {
            StoreKind::Pg(..) | StoreKind::PgPartitioned(..) => text.contains("lock timeout"),
            StoreKind::MySql(..) => text.contains("1205"),
            StoreKind::Sqlite => false,
        }
    }
}

/// How a delivery ends that waits past the lock timeout on a first delivery
/// whose body holds its transaction open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// SQLite: the claim waits on the database's write lock (held by
    /// whichever transaction), so the store reports `StoreError::Timeout`;
    /// the body does not run.
    StoreTimeout,
    /// PostgreSQL and MySQL, `ClaimOrder::First`: the claim waits on the
    /// key's row in the unique index (MySQL: its `INSERT IGNORE` on the
    /// primary key) and gives up with `Error::InProgress` after the lock
    /// timeout; the body does not run.
    InProgress,
    /// PostgreSQL and MySQL, `ClaimOrder::Last` and `Checked` (whose read
    /// finds nothing committed yet): the body runs first and its
    /// own `UPDATE` waits on the inventory row the first delivery holds, so
    /// the body fails with the server's lock timeout error, which the store
    /// tells as its contention: the call is `Error::Store` with
    /// `StoreError::Contention`; its writes roll back.
    BodyLockTimeout,
}

/// How a fixture's store is built.
#[derive(Debug, Clone)]
pub(crate) enum Open {
    /// On the database's own time.
    Plain,
    /// On the database's time, moved by this shift.
    Shifted(TimeShift),
    /// With this lock (SQLite: busy) timeout instead of the default 5 s
    /// (MySQL: whole seconds, see [`StoreKind::lock_timeout`]).
    LockTimeout(Duration),
    /// From a pool the application made itself (PostgreSQL stores always
    /// are; MySQL's others make their own).
    AppPool,
}

/// A SQL store of the test's own with the business tables next to its dedup
/// table.
pub(crate) trait TxFixture: Sized + Send + Sync + 'static {
    /// The store the handlers run on.
    type Store: TxStore + Clone + 'static;
    /// The connection under the store's transaction (`&mut **tx`), which
    /// the bodies write through.
    type Conn;

    /// A fixture of its own, built `how`, or `None` when its server is
    /// unreachable (the test skips, or fails under `IDEM_REQUIRE_SERVICES=1`).
    async fn open(kind: StoreKind, how: Open) -> Option<Self>;
    /// What it was opened as.
    fn kind(&self) -> StoreKind;
    /// The store.
    fn store(&self) -> &Self::Store;
    /// The shift of [`Open::Shifted`].
    fn shift(&self) -> Option<&TimeShift>;
    /// The database's clock (unshifted), ms since the epoch.
    async fn db_now_ms(&self) -> i64;
    /// Now on the store's time: the database's clock plus the shift.
    async fn now_ms(&self) -> i64 {
        self.db_now_ms().await + self.shift().map_or(0, TimeShift::millis)
    }
    /// A second consumer: a store with its own pool on the same dedup
    /// table, as another process would have.
    async fn second_consumer(&self) -> Self::Store;
    /// `handler`'s record of `key`, if any.
    async fn record(&self, handler: &str, key: &Key) -> Option<Record>;
    /// How many records the dedup table holds.
    async fn records(&self) -> i64;
    /// Overwrites the recorded outcome of `handler`'s records, as if the
    /// return type had changed since; returns how many changed.
    async fn set_outcome(&self, handler: &str, outcome: &str) -> u64;
    /// Puts `stock` units of `sku` in the inventory.
    async fn stock_up(&self, sku: &str, stock: i64);
    /// The stock of `sku`.
    async fn stock(&self, sku: &str) -> i64;
    /// How many ledger rows the bodies wrote for `order_id`.
    async fn ledger_rows(&self, order_id: &str) -> i64;
    /// How many ledger rows there are in all.
    async fn ledger_len(&self) -> i64;
    /// In a body: takes `qty` of `sku` from the inventory; returns what is
    /// left.
    async fn take_stock(
        &self,
        conn: &mut Self::Conn,
        sku: &str,
        qty: i64,
    ) -> Result<i64, sqlx::Error>;
    /// In a body: writes a ledger row.
    async fn add_ledger_in(
        &self,
        conn: &mut Self::Conn,
        order_id: &str,
        amount: i64,
    ) -> Result<(), sqlx::Error>;
}

/// The suite's handlers on a fixture's transaction type (see [`handlers!`]).
pub(crate) trait TxHandlers: TxFixture {
    /// The registered names of [`deduct`](Self::deduct) and
    /// [`refund`](Self::refund).
    const DEDUCT: &'static str;
    const REFUND: &'static str;

    /// Deducts stock and writes a ledger row through the transaction.
    fn deduct(
        &self,
        store: &Self::Store,
        msg: &OrderPlaced,
        probe: &Probe,
    ) -> impl Future<Output = Delivered<Deducted>> + Send;
    /// Writes a ledger row and returns a value that refuses to serialize.
    fn deduct_unencodable(
        &self,
        msg: &OrderPlaced,
        probe: &Probe,
    ) -> impl Future<Output = Delivered<Unencodable>> + Send;
    /// Writes a ledger row under a key with an optional part.
    fn refund(&self, msg: &Refund, probe: &Probe) -> impl Future<Output = Delivered<()>> + Send;

    /// The registered names of [`reserve`](Self::reserve),
    /// [`flaky`](Self::flaky) and [`unknown_sku`](Self::unknown_sku).
    const RESERVE: &'static str;
    const FLAKY: &'static str;
    const UNKNOWN: &'static str;

    /// Writes a ledger row; fingerprinted by `sku + qty + price + note`.
    fn reserve(
        &self,
        store: &Self::Store,
        msg: &Reserve,
        probe: &Probe,
    ) -> impl Future<Output = Settled<i64>> + Send;
    /// Writes a ledger row and fails with an error that may pass;
    /// `max_attempts = 5`.
    fn flaky(
        &self,
        store: &Self::Store,
        msg: &Reserve,
        probe: &Probe,
    ) -> impl Future<Output = Settled<i64>> + Send;
    /// Writes a ledger row and fails: for good when the SKU is `ghost`.
    fn unknown_sku(
        &self,
        store: &Self::Store,
        msg: &Reserve,
        probe: &Probe,
    ) -> impl Future<Output = Settled<i64>> + Send;

    /// The registered name of [`deduct_batch`](Self::deduct_batch).
    const DEDUCT_BATCH: &'static str;

    /// A batch handler: a ledger row per fresh message through the
    /// transaction (see [`deduct_batch_body`](super::tx_batch::deduct_batch_body)).
    fn deduct_batch(
        &self,
        store: &Self::Store,
        msgs: &[OrderPlaced],
        probe: &Probe,
    ) -> impl Future<Output = Batched<i64>> + Send;
}

/// What a delivery returns.
pub(crate) type Delivered<T> = Result<Outcome<T>, Error<AppError>>;

/// What a batch delivery returns: one answer per message, or the batch's
/// error.
pub(crate) type Batched<T> = Result<Vec<Delivered<T>>, Error<AppError>>;

// ---------------------------------------------------------------------------
// Messages and bodies

/// The message of the suite's main handler.
#[derive(Debug, Clone)]
pub(crate) struct OrderPlaced {
    pub(crate) order_id: String,
    pub(crate) sku: String,
    pub(crate) qty: i64,
    /// The body fails after its writes, to show they roll back.
    pub(crate) fail: bool,
    /// The body parks on the probe's gate after its writes.
    pub(crate) park: bool,
}

impl OrderPlaced {
    pub(crate) fn new(order_id: &str, sku: &str, qty: i64) -> Self {
        OrderPlaced {
            order_id: order_id.into(),
            sku: sku.into(),
            qty,
            fail: false,
            park: false,
        }
    }

    /// The key `msg.order_id + msg.sku` derives.
    pub(crate) fn key(&self) -> Key {
        Key::from_parts(&[&self.order_id, &self.sku]).unwrap()
    }
}

/// The main handler's result, recorded as JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Deducted {
    pub(crate) order_id: String,
    pub(crate) stock_left: i64,
}

/// A value that refuses to serialize.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("cannot encode this outcome"))
    }
}

/// A message with an optional key part.
#[derive(Debug)]
pub(crate) struct Refund {
    pub(crate) order_id: String,
    pub(crate) coupon: Option<String>,
}

/// The body of `deduct`: takes the stock and writes a ledger row through
/// the transaction, then parks or fails if the message says so.
pub(crate) async fn deduct_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &OrderPlaced,
    probe: &Probe,
    db: &F,
) -> Result<Deducted, AppError> {
    probe.hit();
    let stock_left = db.take_stock(conn, &msg.sku, msg.qty).await?;
    db.add_ledger_in(conn, &msg.order_id, msg.qty).await?;
    if msg.park {
        probe.park().await;
    }
    if msg.fail {
        return Err(AppError::Refused(format!("order {} refused", msg.order_id)));
    }
    Ok(Deducted {
        order_id: msg.order_id.clone(),
        stock_left,
    })
}

/// The body of `deduct_unencodable`.
pub(crate) async fn unencodable_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &OrderPlaced,
    probe: &Probe,
    db: &F,
) -> Result<Unencodable, AppError> {
    probe.hit();
    db.add_ledger_in(conn, &msg.order_id, msg.qty).await?;
    Ok(Unencodable)
}

/// The body of `refund`.
pub(crate) async fn refund_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &Refund,
    probe: &Probe,
    db: &F,
) -> Result<(), AppError> {
    probe.hit();
    db.add_ledger_in(conn, &msg.order_id, -1).await?;
    Ok(())
}

/// The body of `reserve`: a ledger row, then a pause so that concurrent
/// deliveries overlap.
pub(crate) async fn reserve_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &Reserve,
    probe: &Probe,
    db: &F,
) -> Result<i64, OpsError> {
    probe.hit();
    db.add_ledger_in(conn, &msg.order_id, msg.qty).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(msg.qty)
}

/// The body of `flaky`: a ledger row, then an error that may pass.
pub(crate) async fn flaky_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &Reserve,
    probe: &Probe,
    db: &F,
) -> Result<i64, OpsError> {
    let run = probe.hit();
    db.add_ledger_in(conn, &msg.order_id, 1).await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    Err(OpsError::Unavailable(format!(
        "run {run} for {}",
        msg.order_id
    )))
}

/// The body of `unknown_sku`: a ledger row, then a final error for the
/// SKU `ghost` and one that may pass for any other.
pub(crate) async fn unknown_sku_body<F: TxFixture>(
    conn: &mut F::Conn,
    msg: &Reserve,
    probe: &Probe,
    db: &F,
) -> Result<i64, OpsError> {
    probe.hit();
    db.add_ledger_in(conn, &msg.order_id, 1).await?;
    if msg.sku == "ghost" {
        Err(OpsError::UnknownSku(msg.sku.clone()))
    } else {
        Err(OpsError::Unavailable("try later".into()))
    }
}

/// The suite's handlers on the transaction type `$Tx` of the fixture
/// `$Db`, registered under the names given, and the fixture's
/// [`TxHandlers`].
#[allow(unused_macros)]
macro_rules! handlers {
    (
        $Db:ident, tx: $Tx:ident, store: $store:tt,
        names: {
            deduct: $deduct:tt, unencodable: $unencodable:tt, refund: $refund:tt,
            reserve: $reserve:tt, flaky: $flaky:tt, unknown: $unknown:tt,
            batch: $batch:tt $(,)?
        } $(,)?
    ) => {
        mod tx_handlers {
            use super::$Db;
            use crate::common::ops::{OpsError, Reserve};
            use crate::common::tx::{self, Deducted, OrderPlaced, Refund, Unencodable};
            use crate::common::tx_batch;
            use crate::common::{AppError, Probe};
            use idem_runtime::{$Tx, idempotent};

            #[idempotent(key = "msg.order_id + msg.sku", ttl = "1h", store = $store, name = $deduct)]
            pub(crate) async fn deduct(
                tx: &mut $Tx<'_>,
                msg: &OrderPlaced,
                probe: &Probe,
                db: &$Db,
            ) -> Result<Deducted, AppError> {
                tx::deduct_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(key = "msg.order_id", ttl = "1h", store = $store, name = $unencodable)]
            pub(crate) async fn deduct_unencodable(
                tx: &mut $Tx<'_>,
                msg: &OrderPlaced,
                probe: &Probe,
                db: &$Db,
            ) -> Result<Unencodable, AppError> {
                tx::unencodable_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(key = "msg.order_id + msg.coupon", ttl = "1h", store = $store, name = $refund)]
            pub(crate) async fn refund(
                tx: &mut $Tx<'_>,
                msg: &Refund,
                probe: &Probe,
                db: &$Db,
            ) -> Result<(), AppError> {
                tx::refund_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(
                key = "msg.order_id",
                ttl = "1h",
                store = $store,
                name = $reserve,
                fingerprint = "msg.sku + msg.qty + msg.price + msg.note"
            )]
            pub(crate) async fn reserve(
                tx: &mut $Tx<'_>,
                msg: &Reserve,
                probe: &Probe,
                db: &$Db,
            ) -> Result<i64, OpsError> {
                tx::reserve_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(key = "msg.order_id", ttl = "1h", store = $store, name = $flaky, max_attempts = 5)]
            pub(crate) async fn flaky(
                tx: &mut $Tx<'_>,
                msg: &Reserve,
                probe: &Probe,
                db: &$Db,
            ) -> Result<i64, OpsError> {
                tx::flaky_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(key = "msg.order_id", ttl = "1h", store = $store, name = $unknown)]
            pub(crate) async fn unknown_sku(
                tx: &mut $Tx<'_>,
                msg: &Reserve,
                probe: &Probe,
                db: &$Db,
            ) -> Result<i64, OpsError> {
                tx::unknown_sku_body(&mut **tx, msg, probe, db).await
            }

            #[idempotent(key = "msgs.order_id + msgs.sku", ttl = "1h", store = $store, name = $batch)]
            pub(crate) async fn deduct_batch(
                tx: &mut $Tx<'_>,
                msgs: &[OrderPlaced],
                probe: &Probe,
                db: &$Db,
            ) -> Result<Vec<i64>, AppError> {
                tx_batch::deduct_batch_body(&mut **tx, msgs, probe, db).await
            }
        }

        impl crate::common::tx::TxHandlers for $Db {
            const DEDUCT: &'static str = $deduct;
            const REFUND: &'static str = $refund;

            fn deduct(
                &self,
                store: &Self::Store,
                msg: &crate::common::tx::OrderPlaced,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<
                Output = crate::common::tx::Delivered<crate::common::tx::Deducted>,
            > + Send {
                tx_handlers::deduct(store, msg, probe, self)
            }

            fn deduct_unencodable(
                &self,
                msg: &crate::common::tx::OrderPlaced,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<
                Output = crate::common::tx::Delivered<crate::common::tx::Unencodable>,
            > + Send {
                tx_handlers::deduct_unencodable(&self.store, msg, probe, self)
            }

            fn refund(
                &self,
                msg: &crate::common::tx::Refund,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<Output = crate::common::tx::Delivered<()>> + Send {
                tx_handlers::refund(&self.store, msg, probe, self)
            }

            const RESERVE: &'static str = $reserve;
            const FLAKY: &'static str = $flaky;
            const UNKNOWN: &'static str = $unknown;

            fn reserve(
                &self,
                store: &Self::Store,
                msg: &crate::common::ops::Reserve,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<Output = crate::common::ops::Settled<i64>> + Send {
                tx_handlers::reserve(store, msg, probe, self)
            }

            fn flaky(
                &self,
                store: &Self::Store,
                msg: &crate::common::ops::Reserve,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<Output = crate::common::ops::Settled<i64>> + Send {
                tx_handlers::flaky(store, msg, probe, self)
            }

            fn unknown_sku(
                &self,
                store: &Self::Store,
                msg: &crate::common::ops::Reserve,
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<Output = crate::common::ops::Settled<i64>> + Send {
                tx_handlers::unknown_sku(store, msg, probe, self)
            }

            const DEDUCT_BATCH: &'static str = $batch;

            fn deduct_batch(
                &self,
                store: &Self::Store,
                msgs: &[crate::common::tx::OrderPlaced],
                probe: &crate::common::Probe,
            ) -> impl std::future::Future<Output = crate::common::tx::Batched<i64>> + Send {
                tx_handlers::deduct_batch(store, msgs, probe, self)
            }
        }
    };
}

/// Starts `n` deliveries of `deduct` at the same moment, the `i`th through
/// the store and with the message `delivery(i)` names.
async fn deliver_together<F: TxHandlers>(
    db: &Arc<F>,
    probe: &Arc<Probe>,
    n: usize,
    delivery: impl Fn(usize) -> (F::Store, OrderPlaced),
) -> Vec<Delivered<Deducted>> {
    together(n, |i| {
        let (store, msg) = delivery(i);
        let (db, probe) = (Arc::clone(db), Arc::clone(probe));
        async move { db.deduct(&store, &msg, &probe).await }
    })
    .await
}

// ---------------------------------------------------------------------------
// The scenarios

pub(crate) async fn first_delivery_executes_and_commits_claim_outcome_and_business_writes<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-1", "apple", 3);

    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();

    let expected = Deducted {
        order_id: "o-1".into(),
        stock_left: 7,
    };
    assert_eq!(out, Outcome::Executed(expected.clone()));
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("apple").await, 7);
    assert_eq!(db.ledger_rows("o-1").await, 1);

    let rec = db
        .record(F::DEDUCT, &msg.key())
        .await
        .expect("a record after the commit");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    let stored: Deducted = serde_json::from_str(rec.outcome.as_deref().unwrap()).unwrap();
    assert_eq!(stored, expected);
    assert_eq!(rec.handler, F::DEDUCT);
    assert_eq!(rec.key, "3:o-1|5:apple");
    assert!(rec.expires_at_ms >= rec.updated_at_ms + 3_600_000);
}

pub(crate) async fn duplicate_returns_recorded_outcome_and_applies_nothing_again<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-2", "apple", 4);
    let first = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(first.is_executed());

    for _ in 0..5 {
        let again = db.deduct(db.store(), &msg, &probe).await.unwrap();
        assert_eq!(again, Outcome::Duplicate(first.value().clone()));
    }
    // The redelivery carries another quantity: still the recorded result,
    // and still no second deduction.
    let changed = OrderPlaced::new("o-2", "apple", 9);
    let again = db.deduct(db.store(), &changed, &probe).await.unwrap();
    assert_eq!(again, Outcome::Duplicate(first.value().clone()));

    // SQLite and claim-first: the body ran once. Claim-last: the six
    // duplicates ran their bodies too, and rolled them back.
    assert_eq!(probe.runs(), kind.body_runs(1, 6), "{kind:?}");
    assert_eq!(db.stock("apple").await, 6);
    assert_eq!(db.ledger_rows("o-2").await, 1);
    assert_eq!(db.records().await, 1);
}

pub(crate) async fn body_error_rolls_back_claim_and_business_writes_and_the_retry_executes<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("pear", 10).await;
    let probe = Probe::new();
    let failing = OrderPlaced {
        fail: true,
        ..OrderPlaced::new("o-3", "pear", 2)
    };

    let err = db.deduct(db.store(), &failing, &probe).await.unwrap_err();
    assert_eq!(err.handler(), F::DEDUCT);
    assert_eq!(err.key(), Some(&failing.key()));
    match err {
        Error::Handler {
            error: AppError::Refused(m),
            ..
        } => assert_eq!(m, "order o-3 refused"),
        other => panic!("expected Error::Handler, got {other:?}"),
    }
    assert_eq!(probe.runs(), 1);
    // The body had updated inventory and inserted a ledger row: both gone,
    // and so is the claim.
    assert_eq!(db.stock("pear").await, 10);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);
    assert!(db.record(F::DEDUCT, &failing.key()).await.is_none());

    // The redelivery (now succeeding) runs the body again and commits.
    let retry = OrderPlaced::new("o-3", "pear", 2);
    let out = db.deduct(db.store(), &retry, &probe).await.unwrap();
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-3".into(),
            stock_left: 8
        })
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(db.stock("pear").await, 8);
    assert_eq!(db.ledger_rows("o-3").await, 1);
    let rec = db.record(F::DEDUCT, &retry.key()).await.unwrap();
    assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
}

pub(crate) async fn concurrent_deliveries_of_one_message_execute_exactly_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const N: usize = 64;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("plum", 1_000).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-4", "plum", 5);

    let results = deliver_together(&db, &probe, N, |_| (db.store().clone(), msg.clone())).await;

    let values: Vec<Deducted> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|o| o.value().clone()))
        .collect();
    let tally = Tally::of(results);
    eprintln!(
        "{kind:?}: {N} concurrent deliveries of one message: {tally:?}, {} body runs",
        probe.runs()
    );
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert_eq!(tally.total(), N);
    // Every caller got the one recorded result.
    assert_eq!(values.len(), N);
    assert!(values.iter().all(|v| v.stock_left == 995), "{values:?}");
    assert!(
        kind.racing_body_runs(1, N - 1).contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("plum").await, 995);
    assert_eq!(db.ledger_rows("o-4").await, 1);
    assert_eq!(db.records().await, 1);
}

pub(crate) async fn concurrent_distinct_messages_each_execute_exactly_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("fig", 10_000).await;
    let probe = Probe::new();

    let results = deliver_together(&db, &probe, MESSAGES * COPIES, |i| {
        let msg = OrderPlaced::new(&format!("m-{}", i % MESSAGES), "fig", 1);
        (db.store().clone(), msg)
    })
    .await;

    let tally = Tally::of(results);
    eprintln!(
        "{kind:?}: {MESSAGES} messages x {COPIES} concurrent copies: {tally:?}, {} body runs",
        probe.runs()
    );
    assert_eq!(tally.executed, MESSAGES, "{tally:?}");
    assert_eq!(tally.duplicate, MESSAGES * (COPIES - 1), "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    assert!(
        kind.racing_body_runs(MESSAGES, MESSAGES * (COPIES - 1))
            .contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("fig").await, 10_000 - MESSAGES as i64);
    assert_eq!(db.ledger_len().await, MESSAGES as i64);
    for m in 0..MESSAGES {
        assert_eq!(db.ledger_rows(&format!("m-{m}")).await, 1, "message m-{m}");
    }
    assert_eq!(db.records().await, MESSAGES as i64);
}

pub(crate) async fn two_consumers_on_one_database_execute_a_message_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const N: usize = 32;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("lemon", 100).await;
    // A second consumer with its own pool on the same database, as another
    // process would have.
    let other = db.second_consumer().await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-11", "lemon", 7);

    let results = deliver_together(&db, &probe, N, |i| {
        let store = if i % 2 == 0 { db.store() } else { &other };
        (store.clone(), msg.clone())
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{kind:?}: {N} deliveries over two consumers: {tally:?}");
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert!(
        kind.racing_body_runs(1, N - 1).contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("lemon").await, 93);
    assert_eq!(db.ledger_rows("o-11").await, 1);
}

pub(crate) async fn after_the_ttl_the_key_runs_again<F: TxHandlers>(kind: StoreKind) {
    let db = or_skip!(F::open(kind, Open::Shifted(TimeShift::new())).await);
    let shift = db.shift().expect("opened on a shift").clone();
    db.stock_up("kiwi", 100).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-5", "kiwi", 10);

    let before = db.now_ms().await;
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    let after = db.now_ms().await;
    assert!(out.is_executed());
    let rec = db.record(F::DEDUCT, &msg.key()).await.unwrap();
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 3_600_000);

    // The database's time runs on between the statements: the moments are
    // placed a margin from the ttl's end, not to the millisecond.
    let margin = Duration::from_secs(2);
    // Just before the ttl: still a duplicate.
    let left = u64::try_from(rec.expires_at_ms - db.now_ms().await).unwrap();
    shift.advance(Duration::from_millis(left) - margin);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(1, 1));

    // Past the ttl the record stops suppressing the key.
    shift.advance(margin);
    let before = db.now_ms().await;
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    let after = db.now_ms().await;
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-5".into(),
            stock_left: 80
        })
    );
    assert_eq!(probe.runs(), kind.body_runs(2, 1));
    assert_eq!(db.stock("kiwi").await, 80);
    assert_eq!(db.ledger_rows("o-5").await, 2);

    // The new window starts now, with one record and a fresh attempt count.
    let rec = db.record(F::DEDUCT, &msg.key()).await.unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 3_600_000);
    assert_eq!(db.records().await, 1);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(2, 2));
    assert_eq!(db.stock("kiwi").await, 80);
}

pub(crate) async fn stored_outcome_that_no_longer_decodes_is_a_codec_error<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("lime", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-6", "lime", 1);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_executed());

    // As if the return type had changed since the record was written.
    let n = db
        .set_outcome(F::DEDUCT, r#"{"sku":"lime","left":9}"#)
        .await;
    assert_eq!(n, 1);

    let err = db.deduct(db.store(), &msg, &probe).await.unwrap_err();
    match &err {
        Error::Codec { handler, key, .. } => {
            assert_eq!(*handler, F::DEDUCT);
            assert_eq!(key, &msg.key());
        }
        other => panic!("expected Error::Codec, got {other:?}"),
    }
    assert!(err.to_string().contains(F::DEDUCT), "{err}");
    // Claim-last finds the record only after the body; its writes rolled
    // back with the transaction.
    assert_eq!(
        probe.runs(),
        kind.body_runs(1, 1),
        "{kind:?}: a codec failure must not run the body (claim-last: must roll it back)"
    );
    assert_eq!(db.stock("lime").await, 9);
    assert_eq!(db.ledger_rows("o-6").await, 1);
}

pub(crate) async fn outcome_that_does_not_encode_rolls_back_and_is_unrecordable<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-7", "none", 1);

    for run in 1..=2 {
        let err = db.deduct_unencodable(&msg, &probe).await.unwrap_err();
        assert!(matches!(err, Error::Unrecordable { .. }), "{err:?}");
        // Nothing was committed, so the redelivery runs again.
        assert_eq!(probe.runs(), run);
        assert_eq!(db.ledger_len().await, 0);
        assert_eq!(db.records().await, 0);
    }
}

pub(crate) async fn none_key_part_is_key_missing_and_the_body_does_not_run<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let msg = Refund {
        order_id: "o-8".into(),
        coupon: None,
    };

    let err = db.refund(&msg, &probe).await.unwrap_err();
    match &err {
        Error::KeyMissing { handler, part } => {
            assert_eq!(*handler, F::REFUND);
            assert_eq!(*part, "msg.coupon");
        }
        other => panic!("expected Error::KeyMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("msg.coupon"), "{err}");
    assert_eq!(probe.runs(), 0);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);

    let msg = Refund {
        coupon: Some("C-1".into()),
        ..msg
    };
    assert_eq!(
        db.refund(&msg, &probe).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(
        db.refund(&msg, &probe).await.unwrap(),
        Outcome::Duplicate(())
    );
    assert_eq!(probe.runs(), kind.body_runs(1, 1));
    assert_eq!(db.ledger_rows("o-8").await, 1);
}

pub(crate) async fn handler_runs_on_a_store_built_from_the_applications_pool<F: TxHandlers>(
    kind: StoreKind,
) {
    // The application's own pool: business tables and dedup table share it.
    let db = or_skip!(F::open(kind, Open::AppPool).await);
    db.stock_up("date", 5).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-9", "date", 2);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_executed());
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    let stock = db.stock("date").await;
    assert_eq!((probe.runs(), stock), (kind.body_runs(1, 1), 3));
}

pub(crate) async fn delivery_waiting_on_an_open_first_delivery_gives_up_at_the_lock_timeout<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    // A 200 ms lock timeout instead of the default 5 s, to keep the test
    // fast (MySQL: 1 s, its shortest).
    let timeout = kind.lock_timeout(Duration::from_millis(200));
    let db = Arc::new(or_skip!(F::open(kind, Open::LockTimeout(timeout)).await));
    db.stock_up("yuzu", 10).await;
    let probe = Probe::new();

    // The first delivery holds its transaction open in the body.
    let first = {
        let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
        tokio::spawn(async move {
            let msg = OrderPlaced {
                park: true,
                ..OrderPlaced::new("o-10", "yuzu", 1)
            };
            db.deduct(db.store(), &msg, &probe).await
        })
    };
    probe.wait_parked().await;

    let msg = OrderPlaced::new("o-10", "yuzu", 1);
    let started = std::time::Instant::now();
    let second = db.deduct(db.store(), &msg, &probe).await;
    eprintln!("{kind:?}: second delivery while the first holds its transaction: {second:?}");
    assert!(started.elapsed() >= timeout / 2, "it did not wait");
    // Either way the consumer nacks and redelivers; see `Waited`.
    let waiter_runs = match (kind.waited(), &second) {
        (
            Waited::StoreTimeout,
            Err(Error::Store {
                source: StoreError::Timeout(_),
                handler,
                key: Some(k),
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            0
        }
        (
            Waited::InProgress,
            Err(Error::InProgress {
                retry_after,
                handler,
                key: k,
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            assert_eq!(*retry_after, timeout);
            0
        }
        (
            Waited::BodyLockTimeout,
            Err(Error::Store {
                source:
                    StoreError::Contention {
                        kind: Contention::LockTimeout,
                        error,
                    },
                handler,
                key: Some(k),
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            assert!(kind.is_lock_timeout(error), "{kind:?}: {error}");
            1
        }
        (waited, other) => panic!("{kind:?}: expected {waited:?}, got {other:?}"),
    };
    assert_eq!(
        probe.runs(),
        1 + waiter_runs,
        "the waiting delivery ran its body"
    );
    // Nothing of the waiting delivery stands.
    assert_eq!(db.records().await, 0);

    probe.open_gate();
    assert!(first.await.unwrap().unwrap().is_executed());
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(1, 1) + waiter_runs);
    assert_eq!(db.stock("yuzu").await, 9);
    assert_eq!(db.ledger_rows("o-10").await, 1);
}

// ---------------------------------------------------------------------------
// Instantiation

/// One `#[tokio::test]` per scenario on the fixture `$Db` opened as `$kind`.
#[allow(unused_macros)]
macro_rules! tests {
    ($Db:ty, $kind:expr; $($scenario:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                crate::common::tx::$scenario::<$Db>($kind).await;
            }
        )*
    };
}

/// The transaction suite on the fixture type `$Db` as the store kind
/// `$kind`: `tx::suite!(Db, StoreKind::Sqlite);`.
#[allow(unused_macros)]
macro_rules! suite {
    ($Db:ty, $kind:expr) => {
        crate::common::tx::tests! { $Db, $kind;
            first_delivery_executes_and_commits_claim_outcome_and_business_writes,
            duplicate_returns_recorded_outcome_and_applies_nothing_again,
            body_error_rolls_back_claim_and_business_writes_and_the_retry_executes,
            concurrent_deliveries_of_one_message_execute_exactly_once,
            concurrent_distinct_messages_each_execute_exactly_once,
            two_consumers_on_one_database_execute_a_message_once,
            after_the_ttl_the_key_runs_again,
            stored_outcome_that_no_longer_decodes_is_a_codec_error,
            outcome_that_does_not_encode_rolls_back_and_is_unrecordable,
            none_key_part_is_key_missing_and_the_body_does_not_run,
            handler_runs_on_a_store_built_from_the_applications_pool,
            delivery_waiting_on_an_open_first_delivery_gives_up_at_the_lock_timeout,
            deliveries_with_another_payload_are_mismatches,
            failures_are_counted_exactly_under_16_concurrent_consumers,
            a_final_error_rolls_back_and_is_replayed,
            a_settled_key_runs_no_body_but_claiming_last,
            a_batch_commits_each_fresh_message_with_its_writes_in_input_order,
            a_failing_batch_rolls_back_every_write_and_records_nothing,
            a_batch_body_answering_too_few_values_rolls_back,
            overlapping_batches_from_8_consumers_commit_every_key_once,
        }
    };
}

#[allow(unused_imports)]
pub(crate) use {handlers, suite, tests};
