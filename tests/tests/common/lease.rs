//! The lease-mode behaviour suite (handlers without a transaction
//! parameter), written once: `suite!` expands to the handlers and the tests
//! for one store. The claim is a lease with a fencing token; the body's
//! effect is a `ledger` row written through the pool, outside any idem
//! transaction, as an external effect would be.

use idem_runtime::Key;

/// A lease-mode message (also the in-memory suite's).
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) value: u32,
    /// The body waits on the probe's gate before its effect.
    pub(crate) park: bool,
    /// The body fails (before its effect).
    pub(crate) fail: bool,
}

impl Job {
    pub(crate) fn new(id: &str, value: u32) -> Self {
        Job {
            id: id.into(),
            value,
            park: false,
            fail: false,
        }
    }

    pub(crate) fn parked(id: &str, value: u32) -> Self {
        Job {
            park: true,
            ..Job::new(id, value)
        }
    }

    /// The key `msg.id` derives.
    pub(crate) fn key(&self) -> Key {
        Key::from_parts(&[&self.id]).unwrap()
    }
}

/// A message whose key part may be missing.
#[derive(Debug)]
pub(crate) struct Notice {
    pub(crate) user: Option<u64>,
}

/// The suite for one store: `db` is the fixture type (`Db`, `PgDb`), `mode`
/// the [`Mode`](super::Mode), `store` what the handlers declare, and `names`
/// the handler names (unique within the test binary).
#[allow(unused_macros)]
macro_rules! suite {
    (
        db: $Db:ident,
        mode: $mode:expr,
        store: $store:tt,
        names: { job: $job:tt, heartbeat: $heartbeat:tt, notice: $notice:tt $(,)? } $(,)?
    ) => {
        use crate::common::lease::{Job, Notice};
        use crate::common::prelude::*;
        use crate::common::assert_extended;

        const MODE: Mode = $mode;
        const JOB: &str = $job;
        const HEARTBEAT: &str = $heartbeat;

        async fn body(msg: &Job, probe: &Probe, db: &$Db) -> Result<u32, AppError> {
            probe.hit();
            if msg.park {
                probe.park().await;
            }
            if msg.fail {
                return Err(AppError::Refused(format!("job {} failed", msg.id)));
            }
            db.add_ledger(&msg.id, i64::from(msg.value)).await?;
            Ok(msg.value)
        }

        /// A lease long enough that the heartbeat never fires during a test.
        #[idempotent(key = "msg.id", ttl = "1h", lease = "1h", store = $store, name = $job)]
        async fn job(msg: &Job, probe: &Probe, db: &$Db) -> Result<u32, AppError> {
            body(msg, probe, db).await
        }

        /// A short lease that only the heartbeat keeps alive.
        #[idempotent(key = "msg.id", ttl = "1h", lease = "400ms", store = $store, name = $heartbeat)]
        async fn short_lease_job(msg: &Job, probe: &Probe, db: &$Db) -> Result<u32, AppError> {
            body(msg, probe, db).await
        }

        type Done = Result<Outcome<u32>, Error<AppError>>;

        /// Starts `n` deliveries of `job` at the same moment, the `i`th with
        /// the message `msg(i)`.
        async fn jobs_together(
            db: &Arc<$Db>,
            probe: &Arc<Probe>,
            n: usize,
            msg: impl Fn(usize) -> Job,
        ) -> Vec<Done> {
            together(n, |i| {
                let (db, probe, msg) = (Arc::clone(db), Arc::clone(probe), msg(i));
                async move { job(&db.store, &msg, &probe, &db).await }
            })
            .await
        }

        /// Delivers `msg` to `job` in a task of its own (to park in the body).
        fn spawn_job(db: &Arc<$Db>, probe: &Arc<Probe>, msg: Job) -> tokio::task::JoinHandle<Done> {
            let (db, probe) = (Arc::clone(db), Arc::clone(probe));
            tokio::spawn(async move { job(&db.store, &msg, &probe, &db).await })
        }

        #[tokio::test]
        async fn first_delivery_executes_and_records_completed() {
            let clock = ManualClock::new(T0);
            let db = or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await);
            let probe = Probe::new();
            let msg = Job::new("j-1", 7);

            let out = job(&db.store, &msg, &probe, &db).await.unwrap();
            assert_eq!(out, Outcome::Executed(7));
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-1").await, 1);

            let rec = db.store.record(JOB, &msg.key()).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.outcome.as_deref(), Some("7"));
            assert_eq!(rec.attempts, 1);
            assert_eq!(rec.created_at_ms, T0);
            assert_eq!(rec.expires_at_ms, T0 + 3_600_000);
            // The fencing token is cleared on completion.
            assert_eq!(db.only_token().await, None);
        }

        #[tokio::test]
        async fn duplicate_returns_recorded_outcome_without_running_the_body() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let probe = Probe::new();
            let msg = Job::new("j-2", 11);
            assert!(job(&db.store, &msg, &probe, &db).await.unwrap().is_executed());

            for _ in 0..5 {
                let again = job(&db.store, &msg, &probe, &db).await.unwrap();
                assert_eq!(again, Outcome::Duplicate(11));
            }
            // Another payload under the same key gets the recorded value.
            let other = Job::new("j-2", 99);
            assert_eq!(
                job(&db.store, &other, &probe, &db).await.unwrap(),
                Outcome::Duplicate(11)
            );
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-2").await, 1);
            assert_eq!(db.records().await, 1);
        }

        #[tokio::test]
        async fn body_error_releases_the_claim_and_the_retry_executes() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let probe = Probe::new();
            let failing = Job {
                fail: true,
                ..Job::new("j-3", 5)
            };

            let err = job(&db.store, &failing, &probe, &db).await.unwrap_err();
            assert_eq!(err.key(), Some(&failing.key()));
            assert!(
                matches!(&err, Error::Handler { handler: JOB, error: AppError::Refused(m), .. } if m == "job j-3 failed"),
                "{err:?}"
            );
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.records().await, 0, "the claim was not released");

            let out = job(&db.store, &Job::new("j-3", 5), &probe, &db).await.unwrap();
            assert_eq!(out, Outcome::Executed(5));
            assert_eq!(probe.runs(), 2);
            assert_eq!(db.ledger_rows("j-3").await, 1);
            let rec = db.store.record(JOB, &failing.key()).await.unwrap().unwrap();
            assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_deliveries_of_one_message_execute_exactly_once() {
            const N: usize = 64;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            let probe = Probe::new();

            let results = jobs_together(&db, &probe, N, |_| Job::new("j-4", 3)).await;

            let tally = Tally::of(results);
            eprintln!("{N} concurrent deliveries of one message ({MODE:?} lease): {tally:?}");
            tally.assert_leased(1, N - 1);
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-4").await, 1);
            assert_eq!(db.records().await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn deliveries_while_the_body_runs_are_in_progress_then_duplicates() {
            const N: usize = 32;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            let probe = Probe::new();
            let first = spawn_job(&db, &probe, Job::parked("j-5", 8));
            probe.wait_parked().await;

            let during = jobs_together(&db, &probe, N, |_| Job::new("j-5", 8)).await;
            for r in &during {
                match r {
                    // A redelivery hint of when the result is likely, not
                    // the hour-long lease that is left.
                    Err(Error::InProgress { retry_after, .. }) => {
                        assert!(*retry_after >= Duration::from_millis(10), "{retry_after:?}");
                        assert!(*retry_after < Duration::from_secs(60), "{retry_after:?}");
                    }
                    other => panic!("expected InProgress while the body runs, got {other:?}"),
                }
            }

            probe.open_gate();
            assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(8));

            let after = jobs_together(&db, &probe, N, |_| Job::new("j-5", 8)).await;
            let tally = Tally::of(after);
            assert_eq!(tally.duplicate, N, "{tally:?}");
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-5").await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_distinct_messages_each_execute_exactly_once() {
            const MESSAGES: usize = 32;
            const COPIES: usize = 2;
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            let probe = Probe::new();

            let results = jobs_together(&db, &probe, MESSAGES * COPIES, |i| {
                Job::new(&format!("m-{}", i % MESSAGES), 1)
            })
            .await;

            let tally = Tally::of(results);
            eprintln!("{MESSAGES} messages x {COPIES} concurrent copies ({MODE:?} lease): {tally:?}");
            tally.assert_leased(MESSAGES, MESSAGES * (COPIES - 1));
            assert_eq!(probe.runs(), MESSAGES);
            for m in 0..MESSAGES {
                assert_eq!(db.ledger_rows(&format!("m-{m}")).await, 1, "message m-{m}");
            }
            assert_eq!(db.records().await, MESSAGES as i64);
        }

        #[tokio::test]
        async fn after_the_ttl_the_key_runs_again() {
            let clock = ManualClock::new(T0);
            let db = or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await);
            let probe = Probe::new();
            let msg = Job::new("j-6", 4);

            assert!(job(&db.store, &msg, &probe, &db).await.unwrap().is_executed());
            clock.advance(Duration::from_millis(3_600_000 - 1));
            assert_eq!(
                job(&db.store, &msg, &probe, &db).await.unwrap(),
                Outcome::Duplicate(4)
            );
            clock.advance(Duration::from_millis(1));
            assert_eq!(
                job(&db.store, &msg, &probe, &db).await.unwrap(),
                Outcome::Executed(4)
            );
            assert_eq!(probe.runs(), 2);
            assert_eq!(db.ledger_rows("j-6").await, 2);
            let rec = db.store.record(JOB, &msg.key()).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.attempts, 1, "a new window starts counting afresh");
            assert_eq!(rec.created_at_ms, T0 + 3_600_000);
            assert_eq!(db.records().await, 1);
        }

        #[tokio::test]
        async fn in_progress_reports_what_is_left_of_the_lease() {
            let clock = ManualClock::new(T0);
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await));
            let probe = Probe::new();
            let first = spawn_job(&db, &probe, Job::parked("j-7", 1));
            probe.wait_parked().await;
            let rec = db
                .store
                .record(JOB, &Job::new("j-7", 1).key())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(rec.status, Status::InProgress);
            assert_eq!(rec.outcome, None);
            assert_eq!(rec.expires_at_ms, T0 + 3_600_000, "lease_until");

            clock.advance(Duration::from_secs(600));
            let err = job(&db.store, &Job::new("j-7", 1), &probe, &db).await.unwrap_err();
            match err {
                Error::InProgress {
                    retry_after,
                    handler,
                    ..
                } => {
                    assert_eq!(handler, JOB);
                    // Held for 600 s of an hour's lease: the hint is at most
                    // as long again (less once bodies of this handler have
                    // finished quickly in this process), never past the 3,000
                    // s left.
                    assert!(retry_after <= Duration::from_secs(600), "{retry_after:?}");
                    assert!(retry_after >= Duration::from_millis(10), "{retry_after:?}");
                }
                other => panic!("expected InProgress, got {other:?}"),
            }
            probe.open_gate();
            assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(1));
            assert_eq!(probe.runs(), 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost() {
            let clock = ManualClock::new(T0);
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await));
            let probe = Probe::new();
            let key = Job::new("j-8", 0).key();

            // Consumer A claims and parks in its body.
            let a = spawn_job(&db, &probe, Job::parked("j-8", 1));
            probe.wait_parked().await;

            // While A's lease holds, B is turned away.
            let b = job(&db.store, &Job::new("j-8", 2), &probe, &db).await;
            assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");

            // A's lease runs out; B takes the key over and completes.
            clock.advance(Duration::from_secs(3_600));
            let b = job(&db.store, &Job::new("j-8", 2), &probe, &db).await;
            assert_eq!(b.unwrap(), Outcome::Executed(2));
            let rec = db.store.record(JOB, &key).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.outcome.as_deref(), Some("2"));
            assert_eq!(rec.attempts, 2, "one claim plus one takeover");

            // A finishes late: its result is not recorded.
            probe.open_gate();
            let a = a.await.unwrap();
            match &a {
                Err(Error::LeaseLost { handler, key: k }) => {
                    assert_eq!(*handler, JOB);
                    assert_eq!(k, &key);
                }
                other => panic!("expected LeaseLost, got {other:?}"),
            }

            // Exactly one completion stands: B's.
            let rec = db.store.record(JOB, &key).await.unwrap().unwrap();
            assert_eq!(rec.outcome.as_deref(), Some("2"));
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(db.records().await, 1);
            assert_eq!(
                job(&db.store, &Job::new("j-8", 3), &probe, &db).await.unwrap(),
                Outcome::Duplicate(2)
            );
            // Both bodies ran (that is what LeaseLost warns about).
            assert_eq!(probe.runs(), 2);
            assert_eq!(db.ledger_rows("j-8").await, 2);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stale_failure_after_a_takeover_does_not_release_the_new_claim() {
            let clock = ManualClock::new(T0);
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await));
            let (probe_a, probe_c) = (Probe::new(), Probe::new());

            // A claims, parks, and will fail.
            let failing = Job {
                fail: true,
                ..Job::parked("j-9", 1)
            };
            let a = spawn_job(&db, &probe_a, failing);
            probe_a.wait_parked().await;
            clock.advance(Duration::from_secs(3_601));

            // C takes the expired lease over and parks, so its claim is in
            // progress when A fails.
            let c = spawn_job(&db, &probe_c, Job::parked("j-9", 3));
            probe_c.wait_parked().await;

            // A's body fails; its release carries A's stale token.
            probe_a.open_gate();
            let a = a.await.unwrap();
            assert!(
                matches!(&a, Err(Error::Handler { .. })),
                "expected A's own Handler error, got {a:?}"
            );
            let rec = db
                .store
                .record(JOB, &Job::new("j-9", 0).key())
                .await
                .unwrap()
                .expect("A's stale release deleted C's claim");
            assert_eq!(rec.status, Status::InProgress);
            assert_eq!(rec.attempts, 2);
            let d = job(&db.store, &Job::new("j-9", 4), &probe_a, &db).await;
            assert!(matches!(d, Err(Error::InProgress { .. })), "{d:?}");

            probe_c.open_gate();
            assert_eq!(c.await.unwrap().unwrap(), Outcome::Executed(3));
            assert_eq!(
                job(&db.store, &Job::new("j-9", 5), &probe_a, &db).await.unwrap(),
                Outcome::Duplicate(3)
            );
            assert_eq!((probe_a.runs(), probe_c.runs()), (1, 1));
            assert_eq!(db.ledger_rows("j-9").await, 1, "only C's effect happened");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn heartbeat_keeps_a_long_body_s_lease_alive() {
            // System clock: the 400 ms lease must be extended in real time.
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Plain).await));
            let probe = Probe::new();
            let a = {
                let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
                tokio::spawn(async move {
                    short_lease_job(&db.store, &Job::parked("j-10", 1), &probe, &db).await
                })
            };
            probe.wait_parked().await;
            let parked_at = Instant::now();
            let key = Job::new("j-10", 0).key();
            let claimed = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();

            // Well past two leases: without the heartbeat the key would be free.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            let b = short_lease_job(&db.store, &Job::new("j-10", 2), &probe, &db).await;
            assert!(
                matches!(b, Err(Error::InProgress { .. })),
                "a second consumer took over a lease the heartbeat should keep: {b:?}"
            );
            let rec = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();
            assert_extended(&rec, &claimed);

            probe.open_gate();
            assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
            assert!(parked_at.elapsed() >= Duration::from_millis(1_000));
            assert_eq!(probe.runs(), 1);
            let rec = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();
            assert_eq!(
                (rec.status, rec.outcome.as_deref()),
                (Status::Completed, Some("1"))
            );
        }

        /// The heartbeat extends the lease from the store's clock: with a
        /// manual clock moved past the lease, the next beat (a third of the
        /// lease later, in real time) renews it, and no other consumer can
        /// take the key over. No real time passes through a lease.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn heartbeat_renews_the_lease_from_the_store_s_clock() {
            let clock = ManualClock::new(T0);
            let db = Arc::new(or_skip!($Db::open(MODE, Open::Clock(clock.clone())).await));
            let probe = Probe::new();
            let key = Job::new("j-12", 0).key();
            let a = {
                let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
                tokio::spawn(async move {
                    short_lease_job(&db.store, &Job::parked("j-12", 1), &probe, &db).await
                })
            };
            probe.wait_parked().await;
            let rec = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();
            assert_eq!((rec.created_at_ms, rec.expires_at_ms), (T0, T0 + 400));

            // The claim's lease is over on the store's clock...
            clock.advance(Duration::from_millis(1_000));
            // ...until the next beat renews it from the clock's new time.
            eventually(Duration::from_secs(2), "a heartbeat at the new time", || async {
                let rec = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();
                rec.updated_at_ms == T0 + 1_000
            })
            .await;
            let rec = db.store.record(HEARTBEAT, &key).await.unwrap().unwrap();
            assert_eq!(rec.expires_at_ms, T0 + 1_400, "{rec:?}");
            match short_lease_job(&db.store, &Job::new("j-12", 2), &probe, &db).await {
                Err(Error::InProgress { retry_after, .. }) => {
                    assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
                }
                other => panic!("a second consumer took over a renewed lease: {other:?}"),
            }
            assert_eq!(
                db.store.record(HEARTBEAT, &key).await.unwrap().unwrap().attempts,
                1,
                "no takeover happened"
            );

            probe.open_gate();
            assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-12").await, 1);
        }

        #[tokio::test]
        async fn stored_outcome_that_no_longer_decodes_is_a_codec_error() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let probe = Probe::new();
            let msg = Job::new("j-11", 6);
            assert!(job(&db.store, &msg, &probe, &db).await.unwrap().is_executed());
            assert_eq!(db.set_outcome(JOB, "\"six\"").await, 1);

            let err = job(&db.store, &msg, &probe, &db).await.unwrap_err();
            assert!(
                matches!(&err, Error::Codec { handler: JOB, key, .. } if *key == msg.key()),
                "{err:?}"
            );
            assert_eq!(probe.runs(), 1);
            assert_eq!(db.ledger_rows("j-11").await, 1);
        }

        #[idempotent(key = "'welcome' + user", ttl = "1h", store = $store, name = $notice)]
        async fn notice(msg: &Notice) -> Result<u64, AppError> {
            Ok(msg.user.unwrap_or_default())
        }

        #[tokio::test]
        async fn none_key_part_is_key_missing() {
            let db = or_skip!($Db::open(MODE, Open::Plain).await);
            let err = notice(&db.store, &Notice { user: None }).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::KeyMissing {
                        handler: $notice,
                        part: "user"
                    }
                ),
                "{err:?}"
            );
            assert_eq!(db.records().await, 0);
            assert_eq!(
                notice(&db.store, &Notice { user: Some(5) }).await.unwrap(),
                Outcome::Executed(5)
            );
        }
    };
}

#[allow(unused_imports)]
pub(crate) use suite;
