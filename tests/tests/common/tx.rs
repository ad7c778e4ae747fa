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

// The core scenarios, one file a subject.
mod claims;
mod outcomes;

#[allow(unused_imports)]
pub(crate) use claims::{
    body_error_rolls_back_claim_and_business_writes_and_the_retry_executes,
    concurrent_deliveries_of_one_message_execute_exactly_once,
    concurrent_distinct_messages_each_execute_exactly_once,
    delivery_waiting_on_an_open_first_delivery_gives_up_at_the_lock_timeout,
    duplicate_returns_recorded_outcome_and_applies_nothing_again,
    first_delivery_executes_and_commits_claim_outcome_and_business_writes,
    two_consumers_on_one_database_execute_a_message_once,
};
#[allow(unused_imports)]
pub(crate) use outcomes::{
    after_the_ttl_the_key_runs_again, handler_runs_on_a_store_built_from_the_applications_pool,
    none_key_part_is_key_missing_and_the_body_does_not_run,
    outcome_that_does_not_encode_rolls_back_and_is_unrecordable,
    stored_outcome_that_no_longer_decodes_is_a_codec_error,
};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::clock::TimeShift;
use idem_runtime::store::TxStore;
use idem_runtime::{ClaimOrder, Error, Key, Outcome, Record, RoundTrips};

use super::ops::{OpsError, Reserve, Settled};
use super::{AppError, Probe, together};

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
