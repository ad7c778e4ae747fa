//! The transaction-mode behaviour suite, written once: `suite!` expands to
//! the handlers and the tests for one store (and, on PostgreSQL, one claim
//! order). The claim, the body's writes (an `inventory` update and a `ledger`
//! insert through the handler's transaction) and the recorded outcome commit
//! together or not at all; every effect is read back from the business
//! tables.
//!
//! Where the stores' documented behaviour differs, the tests assert each
//! store's own: under PostgreSQL's `ClaimOrder::Last` a duplicate's body runs
//! and is rolled back ([`Mode::body_runs`](super::Mode::body_runs)), and a
//! delivery waiting on an open first delivery ends differently per store
//! ([`Waited`]).

use idem_runtime::Key;

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

/// How a delivery ends that waits past the lock timeout on a first delivery
/// whose body holds its transaction open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// SQLite: the claim waits on the database's write lock (held by
    /// whichever transaction), so the store reports `StoreError::Timeout`;
    /// the body does not run.
    StoreTimeout,
    /// PostgreSQL, `ClaimOrder::First`: the claim waits on the key's row in
    /// the unique index and gives up with `Error::InProgress`; the body does
    /// not run.
    InProgress,
    /// PostgreSQL, `ClaimOrder::Last`: the body runs first and its own
    /// `UPDATE` waits on the inventory row the first delivery holds, so the
    /// body fails with the server's `lock_not_available` (55P03) and the call
    /// is `Error::Handler`; its writes roll back.
    BodyLockTimeout,
}

impl super::Mode {
    /// How this store ends a delivery that waits past the lock timeout.
    pub(crate) fn waited(self) -> Waited {
        use idem_runtime::ClaimOrder;
        match self {
            super::Mode::Sqlite => Waited::StoreTimeout,
            super::Mode::Pg(ClaimOrder::First) => Waited::InProgress,
            super::Mode::Pg(ClaimOrder::Last) => Waited::BodyLockTimeout,
        }
    }
}

/// The suite for one store: `db` is the fixture type (`Db`, `PgDb`), `mode`
/// the [`Mode`](super::Mode), `store` and `tx` what the handlers declare,
/// and `names` the handler names (unique within the test binary).
#[allow(unused_macros)]
macro_rules! suite {
    (
        db: $Db:ident,
        mode: $mode:expr,
        store: $store:tt,
        tx: $Tx:ident,
        names: { deduct: $deduct:tt, unencodable: $unencodable:tt, refund: $refund:tt $(,)? } $(,)?
    ) => {
        use crate::common::prelude::*;
        use crate::common::tx::{Deducted, OrderPlaced, Refund, Unencodable, Waited};

        const MODE: Mode = $mode;
        const DEDUCT: &str = $deduct;
        type Store = <$Db as Fixture>::Store;
        type Delivered = Result<Outcome<Deducted>, Error<AppError>>;

        /// Writes a ledger row through the handler's transaction.
        async fn ledger_entry(
            tx: &mut $Tx<'_>,
            db: &$Db,
            order_id: &str,
            amount: i64,
        ) -> Result<(), sqlx::Error> {
            let sql = format!("INSERT INTO {} (order_id, amount) VALUES ($1, $2)", db.ledger);
            sqlx::query(AssertSqlSafe(sql))
                .bind(order_id)
                .bind(amount)
                .execute(&mut **tx)
                .await
                .map(drop)
        }

        /// Starts `n` deliveries at the same moment, the `i`th through the
        /// store and with the message `delivery(i)` names.
        async fn deliver_together(
            db: &Arc<$Db>,
            probe: &Arc<Probe>,
            n: usize,
            delivery: impl Fn(usize) -> (Store, OrderPlaced),
        ) -> Vec<Delivered> {
            together(n, |i| {
                let (store, msg) = delivery(i);
                let (db, probe) = (Arc::clone(db), Arc::clone(probe));
                async move { deduct(&store, &msg, &probe, &db).await }
            })
            .await
        }

        /// Deducts stock and writes a ledger row through the transaction.
        #[idempotent(key = "msg.order_id + msg.sku", ttl = "1h", store = $store, name = $deduct)]
        async fn deduct(
            tx: &mut $Tx<'_>,
            msg: &OrderPlaced,
            probe: &Probe,
            db: &$Db,
        ) -> Result<Deducted, AppError> {
            probe.hit();
            let sql = format!(
                "UPDATE {} SET stock = stock - $1 WHERE sku = $2 RETURNING stock",
                db.inventory
            );
            let stock_left: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(msg.qty)
                .bind(&msg.sku)
                .fetch_one(&mut **tx)
                .await?;
            ledger_entry(tx, db, &msg.order_id, msg.qty).await?;
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

        #[tokio::test]
        async fn first_delivery_executes_and_commits_claim_outcome_and_business_writes() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            db.stock_up("apple", 10).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-1", "apple", 3);

            let out = deduct(&db.store, &msg, &probe, &db).await.unwrap();

            let expected = Deducted {
                order_id: "o-1".into(),
                stock_left: 7,
            };
            assert_eq!(out, Outcome::Executed(expected.clone()));
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.stock("apple").await, 7);
            assert_eq!(db.ledger_rows("o-1").await, 1);

            let rec = db
                .store
                .record(DEDUCT, &msg.key())
                .await
                .unwrap()
                .expect("a record after the commit");
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.attempts, 1);
            let stored: Deducted = serde_json::from_str(rec.outcome.as_deref().unwrap()).unwrap();
            assert_eq!(stored, expected);
            assert_eq!(rec.handler, DEDUCT);
            assert_eq!(rec.key, "3:o-1|5:apple");
            assert!(rec.expires_at_ms >= rec.updated_at_ms + 3_600_000);
        }

        #[tokio::test]
        async fn duplicate_returns_recorded_outcome_and_applies_nothing_again() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            db.stock_up("apple", 10).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-2", "apple", 4);
            let first = deduct(&db.store, &msg, &probe, &db).await.unwrap();
            assert!(first.is_executed());

            for _ in 0..5 {
                let again = deduct(&db.store, &msg, &probe, &db).await.unwrap();
                assert_eq!(again, Outcome::Duplicate(first.value().clone()));
            }
            // The redelivery carries another quantity: still the recorded result,
            // and still no second deduction.
            let changed = OrderPlaced::new("o-2", "apple", 9);
            let again = deduct(&db.store, &changed, &probe, &db).await.unwrap();
            assert_eq!(again, Outcome::Duplicate(first.value().clone()));

            // SQLite and claim-first: the body ran once. Claim-last: the six
            // duplicates ran their bodies too, and rolled them back.
            assert_eq!(probe.runs(), MODE.body_runs(1, 6), "{MODE:?}");
            assert_eq!(db.stock("apple").await, 6);
            assert_eq!(db.ledger_rows("o-2").await, 1);
            assert_eq!(db.records().await, 1);
        }

        #[tokio::test]
        async fn body_error_rolls_back_claim_and_business_writes_and_the_retry_executes() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            db.stock_up("pear", 10).await;
            let probe = Probe::new();
            let failing = OrderPlaced {
                fail: true,
                ..OrderPlaced::new("o-3", "pear", 2)
            };

            let err = deduct(&db.store, &failing, &probe, &db).await.unwrap_err();
            assert_eq!(err.handler(), DEDUCT);
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
            assert!(db.store.record(DEDUCT, &failing.key()).await.unwrap().is_none());

            // The redelivery (now succeeding) runs the body again and commits.
            let retry = OrderPlaced::new("o-3", "pear", 2);
            let out = deduct(&db.store, &retry, &probe, &db).await.unwrap();
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
            let rec = db.store.record(DEDUCT, &retry.key()).await.unwrap().unwrap();
            assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_deliveries_of_one_message_execute_exactly_once() {
            const N: usize = 64;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            db.stock_up("plum", 1_000).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-4", "plum", 5);

            let results =
                deliver_together(&db, &probe, N, |_| (db.store.clone(), msg.clone())).await;

            let values: Vec<Deducted> = results
                .iter()
                .filter_map(|r| r.as_ref().ok().map(|o| o.value().clone()))
                .collect();
            let tally = Tally::of(results);
            eprintln!(
                "{MODE:?}: {N} concurrent deliveries of one message: {tally:?}, {} body runs",
                probe.runs()
            );
            assert_eq!(tally.executed, 1, "{tally:?}");
            assert_eq!(tally.duplicate, N - 1, "{tally:?}");
            assert_eq!(tally.total(), N);
            // Every caller got the one recorded result.
            assert_eq!(values.len(), N);
            assert!(values.iter().all(|v| v.stock_left == 995), "{values:?}");
            assert_eq!(probe.runs(), MODE.body_runs(1, N - 1), "{MODE:?}");
            assert_eq!(db.stock("plum").await, 995);
            assert_eq!(db.ledger_rows("o-4").await, 1);
            assert_eq!(db.records().await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_distinct_messages_each_execute_exactly_once() {
            const MESSAGES: usize = 32;
            const COPIES: usize = 2;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            db.stock_up("fig", 10_000).await;
            let probe = Probe::new();

            let results = deliver_together(&db, &probe, MESSAGES * COPIES, |i| {
                let msg = OrderPlaced::new(&format!("m-{}", i % MESSAGES), "fig", 1);
                (db.store.clone(), msg)
            })
            .await;

            let tally = Tally::of(results);
            eprintln!(
                "{MODE:?}: {MESSAGES} messages x {COPIES} concurrent copies: {tally:?}, {} body runs",
                probe.runs()
            );
            assert_eq!(tally.executed, MESSAGES, "{tally:?}");
            assert_eq!(tally.duplicate, MESSAGES * (COPIES - 1), "{tally:?}");
            assert!(tally.other.is_empty(), "{tally:?}");
            assert_eq!(
                probe.runs(),
                MODE.body_runs(MESSAGES, MESSAGES * (COPIES - 1)),
                "{MODE:?}"
            );
            assert_eq!(db.stock("fig").await, 10_000 - MESSAGES as i64);
            assert_eq!(db.ledger_len().await, MESSAGES as i64);
            for m in 0..MESSAGES {
                assert_eq!(db.ledger_rows(&format!("m-{m}")).await, 1, "message m-{m}");
            }
            assert_eq!(db.records().await, MESSAGES as i64);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn two_consumers_on_one_database_execute_a_message_once() {
            const N: usize = 32;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            db.stock_up("lemon", 100).await;
            // A second consumer with its own pool on the same database, as
            // another process would have.
            let other = db.second_consumer().await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-11", "lemon", 7);

            let results = deliver_together(&db, &probe, N, |i| {
                let store = if i % 2 == 0 { &db.store } else { &other };
                (store.clone(), msg.clone())
            })
            .await;

            let tally = Tally::of(results);
            eprintln!("{MODE:?}: {N} deliveries over two consumers: {tally:?}");
            assert_eq!(tally.executed, 1, "{tally:?}");
            assert_eq!(tally.duplicate, N - 1, "{tally:?}");
            assert_eq!(probe.runs(), MODE.body_runs(1, N - 1), "{MODE:?}");
            assert_eq!(db.stock("lemon").await, 93);
            assert_eq!(db.ledger_rows("o-11").await, 1);
        }

        #[tokio::test]
        async fn after_the_ttl_the_key_runs_again() {
            let clock = ManualClock::new(T0);
            let db = or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await);
            db.stock_up("kiwi", 100).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-5", "kiwi", 10);

            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_executed());
            let rec = db.store.record(DEDUCT, &msg.key()).await.unwrap().unwrap();
            assert_eq!(rec.expires_at_ms, T0 + 3_600_000);

            // One millisecond before the ttl: still a duplicate.
            clock.advance(Duration::from_millis(3_600_000 - 1));
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_duplicate());
            assert_eq!(probe.runs(), MODE.body_runs(1, 1));

            // At the ttl the record stops suppressing the key.
            clock.advance(Duration::from_millis(1));
            let out = deduct(&db.store, &msg, &probe, &db).await.unwrap();
            assert_eq!(
                out,
                Outcome::Executed(Deducted {
                    order_id: "o-5".into(),
                    stock_left: 80
                })
            );
            assert_eq!(probe.runs(), MODE.body_runs(2, 1));
            assert_eq!(db.stock("kiwi").await, 80);
            assert_eq!(db.ledger_rows("o-5").await, 2);

            // The new window starts now, with one record and a fresh attempt count.
            let rec = db.store.record(DEDUCT, &msg.key()).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.attempts, 1);
            assert_eq!(rec.created_at_ms, T0 + 3_600_000);
            assert_eq!(rec.expires_at_ms, T0 + 7_200_000);
            assert_eq!(db.records().await, 1);
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_duplicate());
            assert_eq!(probe.runs(), MODE.body_runs(2, 2));
            assert_eq!(db.stock("kiwi").await, 80);
        }

        #[tokio::test]
        async fn stored_outcome_that_no_longer_decodes_is_a_codec_error() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            db.stock_up("lime", 10).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-6", "lime", 1);
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_executed());

            // As if the return type had changed since the record was written.
            let n = db.set_outcome(DEDUCT, r#"{"sku":"lime","left":9}"#).await;
            assert_eq!(n, 1);

            let err = deduct(&db.store, &msg, &probe, &db).await.unwrap_err();
            match &err {
                Error::Codec { handler, key, .. } => {
                    assert_eq!(*handler, DEDUCT);
                    assert_eq!(key, &msg.key());
                }
                other => panic!("expected Error::Codec, got {other:?}"),
            }
            assert!(err.to_string().contains(DEDUCT), "{err}");
            // Claim-last finds the record only after the body; its writes
            // rolled back with the transaction.
            assert_eq!(
                probe.runs(),
                MODE.body_runs(1, 1),
                "{MODE:?}: a codec failure must not run the body (claim-last: must roll it back)"
            );
            assert_eq!(db.stock("lime").await, 9);
            assert_eq!(db.ledger_rows("o-6").await, 1);
        }

        #[idempotent(key = "msg.order_id", ttl = "1h", store = $store, name = $unencodable)]
        async fn deduct_unencodable(
            tx: &mut $Tx<'_>,
            msg: &OrderPlaced,
            probe: &Probe,
            db: &$Db,
        ) -> Result<Unencodable, AppError> {
            probe.hit();
            ledger_entry(tx, db, &msg.order_id, msg.qty).await?;
            Ok(Unencodable)
        }

        #[tokio::test]
        async fn outcome_that_does_not_encode_rolls_back_and_is_unrecordable() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-7", "none", 1);

            for run in 1..=2 {
                let err = deduct_unencodable(&db.store, &msg, &probe, &db)
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::Unrecordable { .. }), "{err:?}");
                // Nothing was committed, so the redelivery runs again.
                assert_eq!(probe.runs(), run);
                assert_eq!(db.ledger_len().await, 0);
                assert_eq!(db.records().await, 0);
            }
        }

        #[idempotent(key = "msg.order_id + msg.coupon", ttl = "1h", store = $store, name = $refund)]
        async fn refund(
            tx: &mut $Tx<'_>,
            msg: &Refund,
            probe: &Probe,
            db: &$Db,
        ) -> Result<(), AppError> {
            probe.hit();
            ledger_entry(tx, db, &msg.order_id, -1).await?;
            Ok(())
        }

        #[tokio::test]
        async fn none_key_part_is_key_missing_and_the_body_does_not_run() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let probe = Probe::new();
            let msg = Refund {
                order_id: "o-8".into(),
                coupon: None,
            };

            let err = refund(&db.store, &msg, &probe, &db).await.unwrap_err();
            match &err {
                Error::KeyMissing { handler, part } => {
                    assert_eq!(*handler, $refund);
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
                refund(&db.store, &msg, &probe, &db).await.unwrap(),
                Outcome::Executed(())
            );
            assert_eq!(
                refund(&db.store, &msg, &probe, &db).await.unwrap(),
                Outcome::Duplicate(())
            );
            assert_eq!(probe.runs(), MODE.body_runs(1, 1));
            assert_eq!(db.ledger_rows("o-8").await, 1);
        }

        #[tokio::test]
        async fn handler_runs_on_a_store_built_from_the_applications_pool() {
            // The application's own pool: business tables and dedup table share it.
            let db = or_skip!($Db::open(MODE, Open::AppPool).await);
            db.stock_up("date", 5).await;
            let probe = Probe::new();
            let msg = OrderPlaced::new("o-9", "date", 2);
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_executed());
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_duplicate());
            let stock = db.stock("date").await;
            assert_eq!((probe.runs(), stock), (MODE.body_runs(1, 1), 3));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn delivery_waiting_on_an_open_first_delivery_gives_up_at_the_lock_timeout() {
            // A 200 ms lock timeout instead of the default 5 s, to keep the test fast.
            let timeout = Duration::from_millis(200);
            let db = Arc::new(or_skip!($Db::open(MODE, Open::LockTimeout(timeout)).await));
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
                    deduct(&db.store, &msg, &probe, &db).await
                })
            };
            probe.wait_parked().await;

            let msg = OrderPlaced::new("o-10", "yuzu", 1);
            let started = std::time::Instant::now();
            let second = deduct(&db.store, &msg, &probe, &db).await;
            eprintln!("{MODE:?}: second delivery while the first holds its transaction: {second:?}");
            assert!(started.elapsed() >= timeout / 2, "it did not wait");
            // Either way the consumer nacks and redelivers; see `Waited`.
            let waiter_runs = match (MODE.waited(), &second) {
                (
                    Waited::StoreTimeout,
                    Err(Error::Store {
                        source: StoreError::Timeout(_),
                        handler: DEDUCT,
                        key: Some(k),
                    }),
                ) => {
                    assert_eq!(k, &msg.key());
                    0
                }
                (
                    Waited::InProgress,
                    Err(Error::InProgress {
                        retry_after,
                        handler: DEDUCT,
                        key: k,
                    }),
                ) => {
                    assert_eq!(k, &msg.key());
                    assert_eq!(*retry_after, timeout);
                    0
                }
                (
                    Waited::BodyLockTimeout,
                    Err(Error::Handler {
                        error: AppError::Sql(sqlx::Error::Database(e)),
                        handler: DEDUCT,
                        key: k,
                    }),
                ) => {
                    assert_eq!(k, &msg.key());
                    assert_eq!(e.code().as_deref(), Some("55P03"), "{e}");
                    1
                }
                (waited, other) => panic!("{MODE:?}: expected {waited:?}, got {other:?}"),
            };
            assert_eq!(probe.runs(), 1 + waiter_runs, "the waiting delivery ran its body");
            // Nothing of the waiting delivery stands.
            assert_eq!(db.records().await, 0);

            probe.open_gate();
            assert!(first.await.unwrap().unwrap().is_executed());
            assert!(deduct(&db.store, &msg, &probe, &db).await.unwrap().is_duplicate());
            assert_eq!(probe.runs(), MODE.body_runs(1, 1) + waiter_runs);
            assert_eq!(db.stock("yuzu").await, 9);
            assert_eq!(db.ledger_rows("o-10").await, 1);
        }
    };
}

#[allow(unused_imports)]
pub(crate) use suite;
