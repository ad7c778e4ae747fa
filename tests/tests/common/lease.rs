//! The lease-mode behaviour suite (handlers without a transaction
//! parameter), written once and run on every lease store.
//!
//! * The scenarios are generic functions over a [`LeaseFixture`]: a store of
//!   the test's own, what a test reads back from it, and how it moves time.
//! * The handlers are defined once, here: a lease-mode handler runs on any
//!   lease store, whatever its attribute names. Their bodies' external effect
//!   goes through the fixture ([`Effects`]), which keeps it next to the
//!   store (a ledger row, a Redis counter, a map in memory).
//! * [`suite!`] stamps out one `#[tokio::test]` per scenario for a fixture
//!   type; [`clock_suite!`] adds the scenarios that need the store's time
//!   moved by the test (a manual clock, or a SQL database's time shift). [`scenarios!`] hands the list to any other runner
//!   (the Redis Cluster test runs them one after the other on its cluster).
//!
//! Where the stores' documented behaviour differs, the scenarios assert each
//! store's own, from the fixture's constants: whether a takeover counts in
//! `attempts`, whether the server deletes an expired record, whether the
//! store shows its fencing tokens, and how exactly time can be placed
//! against its expiry ([`LeaseFixture::slack`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::clock::{Clock, ManualClock, TimeShift};
use idem_runtime::store::{Claim, LeaseStore};
use idem_runtime::store::{Record, Status};
use idem_runtime::{Error, Key, Outcome, idempotent};

use super::lossy::Lossy;
use super::{AppError, Probe, Tally, eventually, together};

// The scenarios about batch handlers, with their handler.
#[allow(unused_imports)]
pub(crate) use super::lease_batch::{
    a_batch_answers_each_message_in_input_order,
    a_batch_body_answering_too_few_values_is_an_outcome_count_error,
    a_batch_completion_whose_reply_was_lost_is_executed_not_lease_lost,
    a_batch_value_that_cannot_be_recorded_settles_its_key_alone,
    a_failing_batch_records_nothing_and_its_redelivery_runs_it,
    overlapping_batches_from_8_consumers_execute_every_key_once,
};

// The scenarios about failures and payloads, with their handlers.
#[allow(unused_imports)]
pub(crate) use super::lease_ops::{
    a_claim_whose_lease_ran_out_counts_as_a_failure, a_final_error_is_recorded_and_replayed,
    a_huge_error_text_is_cut_and_counted, a_settled_record_reads_back_the_same_expiry_each_time,
    a_stalled_last_attempt_that_finishes_is_recorded,
    deliveries_with_another_payload_are_mismatches_and_run_nothing,
    failures_are_counted_exactly_under_16_concurrent_consumers,
};

// ---------------------------------------------------------------------------
// The fixture

/// How a fixture's store tells time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// Time the test moves: a [`ManualClock`] at [`T0`](super::T0) that
    /// only the test moves, where the store computes leases and expiry from
    /// a clock of its own (memory), so that expiry can be placed to the
    /// millisecond; or a [`TimeShift`] of the database's clock, where the
    /// database computes them (SQL), which moves at once when the test
    /// says and in real time otherwise. A store whose server expires records
    /// by itself (Redis) has real time only and opens on it.
    Manual,
    /// The system clock: leases run out in real time, which is what the
    /// heartbeat is for.
    Real,
}

/// What moves a fixture's time ([`LeaseFixture::time`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Moves<'a> {
    /// The store's own manual clock: nothing else moves it.
    Clock(&'a ManualClock),
    /// The shift of the database's clock: it runs in real time, and jumps
    /// when the test advances the shift.
    Shift(&'a TimeShift),
    /// Nothing but real time.
    Real,
}

/// A boxed, sendable future, for the object-safe [`Effects`].
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a body's external effect lands: a count per message id. Handlers
/// take it as `&dyn Effects`, so one handler serves every fixture.
pub(crate) trait Effects: Send + Sync {
    /// Applies the effect of message `id` once.
    fn apply<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AppError>>;
}

/// The fencing token of a record, as far as a store lets a test see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// The store keeps its tokens to itself (the memory store).
    Hidden,
    /// The token the record holds (`None`: none, as after a failure).
    Shown(Option<String>),
}

/// A lease store of the test's own, with what a scenario reads back from it.
pub(crate) trait LeaseFixture: Effects + Sized + 'static {
    /// The store the handlers run on.
    type Store: LeaseStore;
    /// A takeover counts in [`Record::attempts`] (SQL, memory); on Redis
    /// `attempts` is always 1.
    const COUNTS_TAKEOVERS: bool;
    /// The server deletes a record when it expires (Redis); the SQL and
    /// memory stores keep it, expired, until a sweep.
    const DELETES_EXPIRED: bool;

    /// A fixture of its own on `time`, or `None` when its server is
    /// unreachable (the test skips, or fails under `IDEM_REQUIRE_SERVICES=1`).
    async fn open(time: Time) -> Option<Self>;
    /// The store.
    fn store(&self) -> &Self::Store;
    /// What moves the store's time (see [`Time`]).
    fn time(&self) -> Moves<'_>;
    /// The server's own clock, unshifted, in ms since the epoch: the
    /// database's for a SQL store (read from it), the system's otherwise.
    async fn server_now_ms(&self) -> i64 {
        system_now_ms()
    }
    /// `handler`'s record of `key`, if the store holds one.
    async fn record(&self, handler: &str, key: &Key) -> Option<Record>;
    /// How many records the store holds (expired ones included, where they
    /// stay).
    async fn records(&self) -> usize;
    /// The fencing token of `handler`'s record of `key`.
    async fn token(&self, handler: &str, key: &Key) -> Token;
    /// How often bodies applied their effect for message `id`.
    async fn effects(&self, id: &str) -> usize;

    /// The store again, on a link of its own whose next completion loses
    /// its reply once armed ([`Lossy`]): where the store has a server, its
    /// connection drops after the server wrote; otherwise (this default)
    /// the completion runs and then answers an error.
    async fn lossy(&self) -> Lossy<Self::Store> {
        Lossy::simulated(self.store().clone())
    }

    /// Lets the lease of `handler`'s claim of `key` run out now, as for a
    /// consumer stalled past its lease: the store's time moves to the
    /// lease's end. Stores whose server expires records override this.
    async fn run_out_lease(&self, handler: &str, key: &Key) {
        assert!(
            !matches!(self.time(), Moves::Real),
            "a store on real time runs leases out its way"
        );
        let rec = self.record(handler, key).await.expect("a claim to run out");
        let left = rec.expires_at_ms - self.now_ms().await;
        self.advance(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
            .await;
    }

    /// Now, on the store's time: the manual clock, or the server's clock
    /// plus the shift.
    async fn now_ms(&self) -> i64 {
        match self.time() {
            Moves::Clock(clock) => clock.now_millis(),
            Moves::Shift(shift) => self.server_now_ms().await + shift.millis(),
            Moves::Real => self.server_now_ms().await,
        }
    }

    /// Lets `by` pass on the store's time: the clock or the shift moves, or
    /// the test waits.
    async fn advance(&self, by: Duration) {
        match self.time() {
            Moves::Clock(clock) => clock.advance(by),
            Moves::Shift(shift) => shift.advance(by),
            Moves::Real => tokio::time::sleep(by).await,
        }
    }

    /// How far from a store's expiry a test must place a moment to be sure
    /// on which side it falls: nothing on a manual clock; a margin where
    /// real time runs (calls take time, and Redis expires by its own clock).
    fn slack(&self) -> Duration {
        match self.time() {
            Moves::Clock(_) => Duration::ZERO,
            Moves::Shift(_) | Moves::Real => Duration::from_millis(500),
        }
    }
}

pub(crate) fn system_now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("ms fit in i64")
}

/// `rec` expires `within` from now on the store's time: exactly on a manual
/// clock, up to the fixture's slack sooner in real time.
async fn assert_expires_in<F: LeaseFixture>(fx: &F, rec: &Record, within: Duration) {
    let left = rec.expires_at_ms - fx.now_ms().await;
    let (most, least) = (ms(within), ms(within) - ms(fx.slack()));
    assert!(
        (least..=most).contains(&left),
        "{left} ms left, expected {least}..={most}: {rec:?}"
    );
}

/// The heartbeat kept `claimed`'s lease alive: `rec`, read later, is still
/// in progress under the first claim (no takeover), with a later update and
/// an expiry past the first lease (400 ms).
fn assert_extended(rec: &Record, claimed: &Record) {
    assert_eq!(rec.status, Status::InProgress, "{rec:?}");
    assert_eq!(rec.attempts, 1, "no takeover happened: {rec:?}");
    assert!(
        rec.expires_at_ms > claimed.created_at_ms + 400,
        "the lease was never extended: {rec:?}"
    );
    assert!(rec.updated_at_ms > claimed.updated_at_ms, "{rec:?}");
}

/// Opens a fixture on `time` and runs `scenario` on it; skips when the
/// fixture's server is unreachable.
pub(crate) async fn run<F, Fut>(time: Time, scenario: impl FnOnce(Arc<F>) -> Fut)
where
    F: LeaseFixture,
    Fut: Future<Output = ()>,
{
    let Some(fx) = F::open(time).await else {
        return;
    };
    scenario(Arc::new(fx)).await;
}

// ---------------------------------------------------------------------------
// Messages and handlers

/// A lease-mode message.
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

async fn body(msg: &Job, probe: &Probe, effects: &dyn Effects) -> Result<u32, AppError> {
    probe.hit();
    if msg.park {
        probe.park().await;
    }
    if msg.fail {
        return Err(AppError::Refused(format!("job {} failed", msg.id)));
    }
    effects.apply(&msg.id).await?;
    Ok(msg.value)
}

// The handlers declare the memory store; every lease store runs them.

pub(crate) const JOB: &str = "lease_job";
pub(crate) const HINT: &str = "lease_hint";
pub(crate) const SHORT_TTL: &str = "lease_short_ttl";
pub(crate) const SHORT_LEASE: &str = "lease_short_lease";
pub(crate) const SMS: &str = "lease_sms";
pub(crate) const POINTS: &str = "lease_points";
pub(crate) const LOPSIDED: &str = "lease_lopsided";
pub(crate) const RATIO: &str = "lease_ratio";

/// A lease long enough that the heartbeat never fires during a test.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_job"
)]
pub(crate) async fn job(msg: &Job, probe: &Probe, effects: &dyn Effects) -> Result<u32, AppError> {
    body(msg, probe, effects).await
}

/// As [`job`], for the one scenario about the redelivery hint: no other
/// body of this handler finishes first, so the hint is what was held.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_hint"
)]
pub(crate) async fn hint_job(
    msg: &Job,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<u32, AppError> {
    body(msg, probe, effects).await
}

/// A completed record suppresses duplicates for one second only.
#[idempotent(
    key = "msg.id",
    ttl = "1s",
    lease = "1h",
    store = "memory",
    name = "lease_short_ttl"
)]
pub(crate) async fn short_ttl_job(
    msg: &Job,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<u32, AppError> {
    body(msg, probe, effects).await
}

/// A 400 ms lease that only the heartbeat (every 133 ms) keeps alive.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "400ms",
    store = "memory",
    name = "lease_short_lease"
)]
pub(crate) async fn short_lease_job(
    msg: &Job,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<u32, AppError> {
    body(msg, probe, effects).await
}

/// A message whose key part may be missing.
#[derive(Debug)]
pub(crate) struct Sms {
    pub(crate) phone: Option<String>,
    pub(crate) template: &'static str,
}

/// Reads its own key, as a body passing it on to an SMS gateway would. The
/// key has a literal part and two fields.
#[idempotent(
    key = "'sms' + msg.template + msg.phone",
    ttl = "1h",
    store = "memory",
    name = "lease_sms"
)]
pub(crate) async fn send_sms(msg: &Sms, key: &Key, probe: &Probe) -> Result<String, AppError> {
    probe.hit();
    probe.see(key.as_str());
    Ok(format!("sent {}", msg.template))
}

/// The handler's result today; an earlier deployment recorded it as a plain
/// string (`"points-v1"`), which this type no longer reads.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Points {
    points: u32,
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "lease_points")]
pub(crate) async fn grant_points(msg: &Job, probe: &Probe) -> Result<Points, AppError> {
    probe.hit();
    Ok(Points { points: msg.value })
}

/// A result whose `Serialize` writes what its `Deserialize` refuses.
#[derive(Debug, PartialEq, serde::Deserialize)]
pub(crate) struct Lopsided {
    points: u32,
}

impl serde::Serialize for Lopsided {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("points-v1")
    }
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "lease_lopsided")]
pub(crate) async fn grant_lopsided(msg: &Job, probe: &Probe) -> Result<Lopsided, AppError> {
    probe.hit();
    Ok(Lopsided { points: msg.value })
}

/// A ratio that is NaN: JSON cannot carry it. The record of a key lasts a
/// second.
#[idempotent(key = "msg.id", ttl = "1s", store = "memory", name = "lease_ratio")]
pub(crate) async fn grant_ratio(msg: &Job, probe: &Probe) -> Result<f64, AppError> {
    probe.hit();
    Ok(f64::NAN)
}

type Done = Result<Outcome<u32>, Error<AppError>>;

/// Delivers `msg` to [`job`] in a task of its own (to park in the body).
fn spawn_job<F: LeaseFixture>(
    fx: &Arc<F>,
    probe: &Arc<Probe>,
    msg: Job,
) -> tokio::task::JoinHandle<Done> {
    let (fx, probe) = (Arc::clone(fx), Arc::clone(probe));
    tokio::spawn(async move { job(fx.store(), &msg, &probe, &*fx).await })
}

/// Starts `n` deliveries of [`job`] at the same moment, the `i`th with the
/// message `msg(i)`; returns their results in order.
async fn jobs_together<F: LeaseFixture>(
    fx: &Arc<F>,
    probe: &Arc<Probe>,
    n: usize,
    msg: impl Fn(usize) -> Job,
) -> Vec<Done> {
    together(n, |i| {
        let (fx, probe, msg) = (Arc::clone(fx), Arc::clone(probe), msg(i));
        async move { job(fx.store(), &msg, &probe, &*fx).await }
    })
    .await
}

// ---------------------------------------------------------------------------
// The scenarios

/// The first delivery runs the body and leaves a completed record: outcome,
/// timestamps, the ttl as its expiry, the fencing token of its claim.
pub(crate) async fn first_delivery_executes_and_records_completed<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Job::new("j-1", 7);
    let before = fx.now_ms().await;
    let out = job(fx.store(), &msg, &probe, &*fx).await.unwrap();
    let after = fx.now_ms().await;
    assert_eq!(out, Outcome::Executed(7));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-1").await, 1);

    let rec = fx.record(JOB, &msg.key()).await.expect("a record");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.outcome.as_deref(), Some("7"));
    assert_eq!(
        (rec.handler.as_str(), rec.key.as_str()),
        (JOB, msg.key().as_str())
    );
    assert_eq!(rec.attempts, 1);
    // On a manual clock `before == after`: the stamps are exact.
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    // The record keeps the fencing token of the claim that completed it.
    assert_ne!(fx.token(JOB, &msg.key()).await, Token::Shown(None));
    assert_eq!(fx.records().await, 1);
}

/// A repeat gets the recorded outcome and the body does not run again, even
/// with another payload under the same key.
pub(crate) async fn duplicate_returns_recorded_outcome_without_running_the_body<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("j-2", 11);
    let first = job(fx.store(), &msg, &probe, &*fx).await.unwrap();
    assert!(first.is_executed());
    for _ in 0..5 {
        let again = job(fx.store(), &msg, &probe, &*fx).await.unwrap();
        assert_eq!(again, Outcome::Duplicate(11));
    }
    let other = Job::new("j-2", 99);
    assert_eq!(
        job(fx.store(), &other, &probe, &*fx).await.unwrap(),
        Outcome::Duplicate(11)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-2").await, 1);
    assert_eq!(fx.records().await, 1);
}

/// A failing body releases its claim (the record goes), so the redelivery
/// runs the body again.
pub(crate) async fn body_error_releases_the_claim_and_the_retry_executes<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let failing = Job {
        fail: true,
        ..Job::new("j-3", 5)
    };
    let err = job(fx.store(), &failing, &probe, &*fx).await.unwrap_err();
    assert_eq!(err.key(), Some(&failing.key()));
    assert!(
        matches!(&err, Error::Handler { handler: JOB, error: AppError::Refused(m), .. } if m == "job j-3 failed"),
        "{err:?}"
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(
        fx.record(JOB, &failing.key()).await,
        None,
        "the claim was not released"
    );
    assert_eq!(fx.records().await, 0);

    let out = job(fx.store(), &Job::new("j-3", 5), &probe, &*fx)
        .await
        .unwrap();
    assert_eq!(out, Outcome::Executed(5));
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-3").await, 1);
    let rec = fx.record(JOB, &failing.key()).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref(), rec.attempts),
        (Status::Completed, Some("5"), 1)
    );
}

/// 64 deliveries of one message at the same moment: one executes, the
/// others are duplicates or in progress.
pub(crate) async fn concurrent_deliveries_of_one_message_execute_exactly_once<F: LeaseFixture>(
    fx: Arc<F>,
) {
    const N: usize = 64;
    let probe = Probe::new();
    let results = jobs_together(&fx, &probe, N, |_| Job::new("j-4", 3)).await;
    let tally = Tally::of(results);
    eprintln!("{N} concurrent deliveries of one message: {tally:?}");
    tally.assert_leased(1, N - 1);
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-4").await, 1);
    assert_eq!(fx.records().await, 1);
}

/// While a body runs every other delivery is in progress, with a hint of
/// when the result is likely (not the hour-long lease that is left); once
/// it completed every delivery is a duplicate.
pub(crate) async fn deliveries_while_the_body_runs_are_in_progress_then_duplicates<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    const N: usize = 32;
    let probe = Probe::new();
    let first = spawn_job(&fx, &probe, Job::parked("j-5", 8));
    probe.wait_parked().await;

    let during = jobs_together(&fx, &probe, N, |_| Job::new("j-5", 8)).await;
    for r in &during {
        match r {
            Err(Error::InProgress { retry_after, .. }) => {
                assert!(*retry_after >= Duration::from_millis(10), "{retry_after:?}");
                assert!(*retry_after < Duration::from_secs(60), "{retry_after:?}");
            }
            other => panic!("expected InProgress while the body runs, got {other:?}"),
        }
    }

    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(8));
    let after = jobs_together(&fx, &probe, N, |_| Job::new("j-5", 8)).await;
    let tally = Tally::of(after);
    assert_eq!(tally.duplicate, N, "{tally:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-5").await, 1);
}

/// 32 messages, two concurrent copies each: every message executes once.
pub(crate) async fn concurrent_distinct_messages_each_execute_exactly_once<F: LeaseFixture>(
    fx: Arc<F>,
) {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let probe = Probe::new();
    let results = jobs_together(&fx, &probe, MESSAGES * COPIES, |i| {
        Job::new(&format!("m-{}", i % MESSAGES), 1)
    })
    .await;
    let tally = Tally::of(results);
    eprintln!("{MESSAGES} messages x {COPIES} concurrent copies: {tally:?}");
    tally.assert_leased(MESSAGES, MESSAGES * (COPIES - 1));
    assert_eq!(probe.runs(), MESSAGES);
    for m in 0..MESSAGES {
        assert_eq!(fx.effects(&format!("m-{m}")).await, 1, "message m-{m}");
    }
    assert_eq!(fx.records().await, MESSAGES);
}

/// A storm of duplicates: 200 concurrent deliveries of 10 messages. Each
/// message takes effect once, and every delivery that got an outcome got
/// the executed delivery's value.
pub(crate) async fn storm_of_concurrent_duplicates_executes_each_message_once<F: LeaseFixture>(
    fx: Arc<F>,
) {
    const TASKS: usize = 200;
    const MESSAGES: usize = 10;
    let probe = Probe::new();
    // Each delivery carries a value of its own, so a duplicate shows whose
    // outcome it got.
    let results = jobs_together(&fx, &probe, TASKS, |i| {
        Job::new(
            &format!("storm-{}", i % MESSAGES),
            u32::try_from(i).unwrap(),
        )
    })
    .await;

    let mut values: Vec<Vec<u32>> = vec![Vec::new(); MESSAGES];
    let mut executed = [0usize; MESSAGES];
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(Outcome::Executed(v)) => {
                executed[i % MESSAGES] += 1;
                values[i % MESSAGES].push(*v);
            }
            Ok(Outcome::Duplicate(v)) => values[i % MESSAGES].push(*v),
            _ => {}
        }
    }
    let tally = Tally::of(results);
    eprintln!("{TASKS} concurrent deliveries of {MESSAGES} messages: {tally:?}");
    tally.assert_leased(MESSAGES, TASKS - MESSAGES);
    assert_eq!(probe.runs(), MESSAGES);
    for m in 0..MESSAGES {
        let id = format!("storm-{m}");
        assert_eq!(executed[m], 1, "{id}");
        assert_eq!(fx.effects(&id).await, 1, "{id} took effect more than once");
        assert!(
            values[m].windows(2).all(|w| w[0] == w[1]),
            "{id}: {:?}",
            values[m]
        );
        let rec = fx.record(JOB, &Job::new(&id, 0).key()).await.unwrap();
        assert_eq!(rec.outcome, Some(values[m][0].to_string()), "{id}");
    }
}

/// A delivery that finds a live claim learns what is left of its lease
/// (the record's expiry), and gets a redelivery hint of what the claim has
/// held so far: no body of this handler has finished yet to suggest less.
pub(crate) async fn in_progress_reports_what_is_left_of_the_lease<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Job::new("j-7", 1);
    let first = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(
            async move { hint_job(fx.store(), &Job::parked("j-7", 1), &probe, &*fx).await },
        )
    };
    probe.wait_parked().await;
    let rec = fx.record(HINT, &msg.key()).await.expect("the claim");
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::InProgress, None)
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    let token = fx.token(HINT, &msg.key()).await;
    assert_ne!(token, Token::Shown(None), "a claim without a fencing token");

    fx.advance(Duration::from_millis(200)).await;
    let err = hint_job(fx.store(), &msg, &probe, &*fx).await.unwrap_err();
    // What the claim had held when the call returned: on a manual clock
    // exactly the 200 ms; Redis counts whole milliseconds (1 ms of slack).
    let held = Duration::from_millis(u64::try_from(fx.now_ms().await - rec.created_at_ms).unwrap());
    match err {
        Error::InProgress {
            retry_after,
            handler: HINT,
            key,
        } => {
            assert_eq!(key, msg.key());
            let least = Duration::from_millis(200)
                .saturating_sub(fx.slack())
                .max(Duration::from_millis(10));
            assert!(
                (least..=held + Duration::from_millis(1)).contains(&retry_after),
                "{retry_after:?}, held {held:?}"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(probe.runs(), 1);
}

/// A completed record suppresses its key until its ttl (1 s) is over, then
/// the key runs again as a new window. On a manual clock the boundary is
/// exact: a duplicate one millisecond before, a new run at the ttl.
pub(crate) async fn after_the_ttl_the_key_runs_again<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Job::new("j-6", 4);
    let out = short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap();
    assert!(out.is_executed());
    let first = fx.record(SHORT_TTL, &msg.key()).await.unwrap();
    assert_expires_in(&*fx, &first, Duration::from_secs(1)).await;
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Duplicate(4)
    );

    // Just before the ttl (by the slack): still a duplicate.
    let left =
        Duration::from_millis(u64::try_from(first.expires_at_ms - fx.now_ms().await).unwrap());
    let slack = fx.slack();
    fx.advance(left - Duration::from_millis(1) - slack).await;
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Duplicate(4)
    );
    // At the ttl (past it by the slack) the record stops suppressing the key.
    fx.advance(Duration::from_millis(1) + 2 * slack).await;
    if F::DELETES_EXPIRED {
        assert_eq!(
            fx.record(SHORT_TTL, &msg.key()).await,
            None,
            "the record outlived its ttl"
        );
    }
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Executed(4)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-6").await, 2);

    // The new window starts now, with one record and a fresh attempt count.
    let second = fx.record(SHORT_TTL, &msg.key()).await.unwrap();
    assert_eq!((second.status, second.attempts), (Status::Completed, 1));
    assert!(
        (first.expires_at_ms..=fx.now_ms().await).contains(&second.created_at_ms),
        "{first:?} {second:?}"
    );
    assert_eq!(fx.records().await, 1);
}

/// A stalled body loses its lease to another consumer: A claims and parks;
/// while its lease holds B is turned away; the lease runs out (see
/// [`LeaseFixture::run_out_lease`]) and B takes the key over and completes.
/// When A's body finishes, its completion carries a stale token:
/// `LeaseLost`, and B's outcome is the one recorded, kept for the ttl.
pub(crate) async fn expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let key = Job::new("j-8", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("j-8", 1));
    probe.wait_parked().await;
    let token_a = fx.token(JOB, &key).await;

    let b = job(fx.store(), &Job::new("j-8", 2), &probe, &*fx).await;
    assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");

    fx.run_out_lease(JOB, &key).await;
    let b = job(fx.store(), &Job::new("j-8", 2), &probe, &*fx).await;
    assert_eq!(b.unwrap(), Outcome::Executed(2), "B takes the key over");
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    let attempts = if F::COUNTS_TAKEOVERS { 2 } else { 1 };
    assert_eq!(rec.attempts, attempts, "one claim plus one takeover");

    // A finishes late: its result is not recorded.
    probe.open_gate();
    match a.await.unwrap() {
        Err(Error::LeaseLost { handler, key: k }) => {
            assert_eq!(handler, JOB);
            assert_eq!(k, key);
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Exactly one completion stands: B's, kept for the ttl, under B's token.
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    if token_a != Token::Hidden {
        assert_ne!(fx.token(JOB, &key).await, token_a, "A's token stands");
    }
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    assert_eq!(fx.records().await, 1);
    for value in [3, 4] {
        assert_eq!(
            job(fx.store(), &Job::new("j-8", value), &probe, &*fx)
                .await
                .unwrap(),
            Outcome::Duplicate(2)
        );
    }
    // Both bodies ran: that is what LeaseLost warns about.
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-8").await, 2);
}

/// As above, but B's body returns what A's does, so the record holds the
/// very bytes A's completion carries: A's completion is still
/// `LeaseLost`, since the record is B's (another token), not A's.
pub(crate) async fn a_takeover_recording_the_same_outcome_leaves_the_stale_completion_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let key = Job::new("same-1", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("same-1", 5));
    probe.wait_parked().await;
    let token_a = fx.token(JOB, &key).await;
    fx.run_out_lease(JOB, &key).await;
    let b = job(fx.store(), &Job::new("same-1", 5), &probe, &*fx).await;
    assert_eq!(b.unwrap(), Outcome::Executed(5), "B takes the key over");
    let token_b = fx.token(JOB, &key).await;

    probe.open_gate();
    let a = a.await.unwrap();
    assert!(
        matches!(&a, Err(Error::LeaseLost { handler: JOB, key: k }) if *k == key),
        "expected LeaseLost for A, got {a:?}"
    );
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("5"))
    );
    assert_eq!(fx.token(JOB, &key).await, token_b, "B's record stands");
    if token_a != Token::Hidden {
        assert_ne!(token_a, token_b);
    }
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("same-1").await, 2);
}

/// The value a body returns when its completion's reply is to be lost: a
/// number no other request of a scenario holds, so the proxy finds the
/// completion by it.
pub(crate) const LOST_REPLY_VALUE: u32 = 918_273_645;

/// The store writes a completion and its reply is lost (the connection
/// drops after the write; see [`Lossy`]); the runtime sends the completion
/// again, which finds the record completed by its own token: the call is
/// `Executed`, not `LeaseLost`, and the outcome stands for the ttl. On the
/// stores with a server the connection really drops.
pub(crate) async fn a_completion_whose_reply_was_lost_is_executed_not_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let lossy = fx.lossy().await;
    let probe = Probe::new();
    // A first call on the link: whatever a store loads or prepares once,
    // it has, so the lost reply is the completion's own.
    let warm = Job::new("lost-0", 1);
    assert_eq!(
        job(&lossy, &warm, &probe, &*fx).await.unwrap(),
        Outcome::Executed(1)
    );

    lossy.lose_next_completion();
    let msg = Job::new("lost-1", LOST_REPLY_VALUE);
    let out = job(&lossy, &msg, &probe, &*fx).await;
    assert_eq!(lossy.lost(), 1, "the completion's reply was not lost");
    eprintln!(
        "a completion's reply lost ({}): {out:?}",
        if lossy.is_real() {
            "the connection dropped"
        } else {
            "simulated"
        }
    );
    assert_eq!(out.unwrap(), Outcome::Executed(LOST_REPLY_VALUE));
    let rec = fx.record(JOB, &msg.key()).await.expect("a record");
    assert_eq!(rec.status, Status::Completed, "{rec:?}");
    assert_eq!(rec.outcome, Some(LOST_REPLY_VALUE.to_string()));
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    // Redeliveries, through either store, are duplicates.
    let again = job(&lossy, &msg, &probe, &*fx).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(LOST_REPLY_VALUE));
    let again = job(fx.store(), &msg, &probe, &*fx).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(LOST_REPLY_VALUE));
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("lost-1").await, 1);
}

/// A's lease runs out while its body is stalled, but nobody takes the key
/// over: when A finishes, its completion is recorded, because the body's
/// effect happened and a redelivery must not repeat it.
pub(crate) async fn a_late_completion_nobody_overtook_is_recorded<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let key = Job::new("late-1", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("late-1", 1));
    probe.wait_parked().await;
    fx.run_out_lease(JOB, &key).await;
    match fx.record(JOB, &key).await {
        None => assert!(F::DELETES_EXPIRED, "the claim vanished"),
        Some(rec) => {
            assert!(!F::DELETES_EXPIRED, "Redis kept an expired lease: {rec:?}");
            assert!(
                rec.expires_at_ms <= fx.now_ms().await,
                "the lease ran out: {rec:?}"
            );
        }
    }

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    assert_eq!(
        job(fx.store(), &Job::new("late-1", 9), &probe, &*fx)
            .await
            .unwrap(),
        Outcome::Duplicate(1)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("late-1").await, 1);
}

/// The fencing token also guards release: A's lease runs out, C takes the
/// key over and is still running when A's body fails. A's release carries
/// its stale token and must leave C's claim alone.
pub(crate) async fn stale_failure_after_a_takeover_does_not_release_the_new_claim<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let (probe_a, probe_c) = (Probe::new(), Probe::new());
    let key = Job::new("j-9", 0).key();
    let failing = Job {
        fail: true,
        ..Job::parked("j-9", 1)
    };
    let a = spawn_job(&fx, &probe_a, failing);
    probe_a.wait_parked().await;
    fx.run_out_lease(JOB, &key).await;

    // C takes the expired lease over and parks, so its claim is in
    // progress when A fails.
    let c = spawn_job(&fx, &probe_c, Job::parked("j-9", 3));
    probe_c.wait_parked().await;
    let token_c = fx.token(JOB, &key).await;

    probe_a.open_gate();
    let a = a.await.unwrap();
    assert!(
        matches!(&a, Err(Error::Handler { .. })),
        "expected A's own Handler error, got {a:?}"
    );
    let rec = fx
        .record(JOB, &key)
        .await
        .expect("A's stale release deleted C's claim");
    let attempts = if F::COUNTS_TAKEOVERS { 2 } else { 1 };
    assert_eq!((rec.status, rec.attempts), (Status::InProgress, attempts));
    assert_eq!(fx.token(JOB, &key).await, token_c, "C's claim stands");
    let d = job(fx.store(), &Job::new("j-9", 4), &probe_a, &*fx).await;
    assert!(matches!(d, Err(Error::InProgress { .. })), "{d:?}");

    probe_c.open_gate();
    assert_eq!(c.await.unwrap().unwrap(), Outcome::Executed(3));
    assert_eq!(
        job(fx.store(), &Job::new("j-9", 5), &probe_a, &*fx)
            .await
            .unwrap(),
        Outcome::Duplicate(3)
    );
    assert_eq!((probe_a.runs(), probe_c.runs()), (1, 1));
    assert_eq!(fx.effects("j-9").await, 1, "only C's effect happened");
}

/// The heartbeat for real: a body parked well past two 400 ms leases keeps
/// its claim (extended every 133 ms), so a second consumer is turned away,
/// and the first completes.
pub(crate) async fn heartbeat_keeps_a_long_body_s_lease_alive<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let key = Job::new("j-10", 0).key();
    let a = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(async move {
            short_lease_job(fx.store(), &Job::parked("j-10", 1), &probe, &*fx).await
        })
    };
    probe.wait_parked().await;
    let parked_at = Instant::now();
    let claimed = fx.record(SHORT_LEASE, &key).await.unwrap();

    // Well past two leases: without the heartbeat the key would be free.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    match short_lease_job(fx.store(), &Job::new("j-10", 2), &probe, &*fx).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
        }
        other => panic!("a second consumer took over a lease the heartbeat should keep: {other:?}"),
    }
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_extended(&rec, &claimed);

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert!(parked_at.elapsed() >= Duration::from_millis(1_000));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-10").await, 1);
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
}

/// The heartbeat extends the lease from the store's time: with the time
/// moved past the lease (a manual clock, or the database's shifted), the
/// next beat (a third of the lease later, in real time) renews it from the
/// new time, and no other consumer can take the key over. Only for stores
/// whose time a test moves.
pub(crate) async fn heartbeat_renews_the_lease_from_the_store_s_clock<F: LeaseFixture>(fx: Arc<F>) {
    assert!(
        !matches!(fx.time(), Moves::Real),
        "a store whose time the test moves"
    );
    let t0 = fx.now_ms().await;
    let slack = ms(fx.slack());
    let probe = Probe::new();
    let key = Job::new("j-12", 0).key();
    let a = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(async move {
            short_lease_job(fx.store(), &Job::parked("j-12", 1), &probe, &*fx).await
        })
    };
    probe.wait_parked().await;
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    // Exactly t0 on a manual clock; where real time runs, beats may already
    // have renewed the lease, each from its own now.
    assert!(
        (t0..=t0 + slack).contains(&rec.created_at_ms),
        "t0 {t0}: {rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 400, "{rec:?}");

    // The claim's lease is over on the store's time...
    fx.advance(Duration::from_millis(1_000)).await;
    // ...until the next beat renews it from the new time.
    eventually(
        Duration::from_secs(2),
        "a heartbeat at the new time",
        || async {
            let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
            rec.updated_at_ms >= t0 + 1_000
        },
    )
    .await;
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    let now = fx.now_ms().await;
    assert!(
        (t0 + 1_000..=now).contains(&rec.updated_at_ms),
        "t0 {t0}, now {now}: {rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 400, "{rec:?}");
    match short_lease_job(fx.store(), &Job::new("j-12", 2), &probe, &*fx).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
        }
        other => panic!("a second consumer took over a renewed lease: {other:?}"),
    }
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_eq!(rec.attempts, 1, "no takeover happened");

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-12").await, 1);
}

/// A recorded outcome that no longer decodes into the return type (an
/// earlier deployment's, written here through the store's own claim and
/// completion) is a `Codec` error naming the key; the body does not run.
pub(crate) async fn stored_outcome_that_no_longer_decodes_is_a_codec_error<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("j-11", 6);
    let spec = idem_runtime::registry::find(POINTS).expect("registered");
    let key = msg.key();
    let Claim::Fresh { token } = fx.store().claim(spec, &key, None).await.unwrap() else {
        panic!("a fresh key")
    };
    let completed = fx.store().complete(spec, &key, &token, "\"points-v1\"");
    assert!(completed.await.unwrap());

    let err = grant_points(fx.store(), &msg, &probe).await.unwrap_err();
    assert!(
        matches!(&err, Error::Codec { handler: POINTS, key, .. } if *key == msg.key()),
        "{err:?}"
    );
    assert!(err.to_string().contains(POINTS), "{err}");
    assert_eq!(probe.runs(), 0, "a codec failure must not run the body");
    let rec = fx.record(POINTS, &msg.key()).await.unwrap();
    assert_eq!(
        rec.outcome.as_deref(),
        Some("\"points-v1\""),
        "left as it was"
    );
}

/// The body succeeded, so its effect happened, but its value cannot be
/// recorded (it would not read back; a NaN float): the call is
/// `Unrecordable` naming what serde said, and the key is settled as failed
/// for the ttl with the reason, so no delivery runs the body again: each
/// gets `Unrecordable` from the record, with the same reason, though the
/// handler's error type has no final errors. Once the ttl is over, the key
/// runs again.
pub(crate) async fn an_unrecordable_result_settles_the_key_and_deliveries_get_unrecordable<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("j-13", 6);
    let err = grant_lopsided(fx.store(), &msg, &probe).await.unwrap_err();
    let reason = match &err {
        Error::Unrecordable {
            handler: LOPSIDED,
            key,
            source,
        } => {
            assert_eq!(*key, msg.key());
            let reason = source.to_string();
            assert!(reason.contains("would not read back"), "{reason}");
            reason
        }
        other => panic!("expected Unrecordable, got {other:?}"),
    };
    let rec = fx.record(LOPSIDED, &msg.key()).await.expect("a record");
    assert_eq!((rec.status, rec.failures), (Status::Failed, 1), "{rec:?}");
    assert_eq!(rec.unrecordable().as_deref(), Some(reason.as_str()));
    assert_eq!(
        rec.last_error,
        Some(format!(
            "the body took effect, but its result cannot be recorded: {reason}"
        ))
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    let again = together(8, |_| {
        let (fx, probe, msg) = (Arc::clone(&fx), Arc::clone(&probe), msg.clone());
        async move { grant_lopsided(fx.store(), &msg, &probe).await }
    })
    .await;
    for r in again {
        match r {
            Err(Error::Unrecordable {
                handler: LOPSIDED,
                key,
                source,
            }) => {
                assert_eq!(key, msg.key());
                assert_eq!(source.to_string(), reason, "the recorded reason");
            }
            other => panic!("expected Unrecordable from the record, got {other:?}"),
        }
    }
    assert_eq!(probe.runs(), 1, "no delivery ran the body again");

    // A NaN, with a ttl of a second: settled, then free again after it.
    let nan = Job::new("j-14", 0);
    for run in 1..=2 {
        let first = match grant_ratio(fx.store(), &nan, &probe).await {
            Err(Error::Unrecordable { source, .. }) => source.to_string(),
            other => panic!("expected Unrecordable, got {other:?}"),
        };
        assert!(first.contains("NaN"), "{first}");
        match grant_ratio(fx.store(), &nan, &probe).await {
            Err(Error::Unrecordable { source, .. }) => assert_eq!(source.to_string(), first),
            other => panic!("expected Unrecordable from the record, got {other:?}"),
        }
        assert_eq!(probe.runs(), 1 + run, "the body ran once per window");
        let rec = fx.record(RATIO, &nan.key()).await.expect("a record");
        assert_eq!(rec.status, Status::Failed, "{rec:?}");
        assert!(
            rec.unrecordable().is_some_and(|why| why.contains("NaN")),
            "{rec:?}"
        );
        fx.advance(Duration::from_secs(1) + fx.slack()).await;
    }
}

/// A `None` key part: `KeyMissing`, no body, nothing written; with the part
/// present the handler runs once.
pub(crate) async fn none_key_part_is_key_missing_and_the_body_does_not_run<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Sms {
        phone: None,
        template: "welcome",
    };
    let err = send_sms(fx.store(), &msg, &probe).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyMissing {
                handler: SMS,
                part: "msg.phone"
            }
        ),
        "{err:?}"
    );
    assert!(err.key().is_none());
    assert!(err.to_string().contains("msg.phone"), "{err}");
    assert_eq!(probe.runs(), 0);
    assert_eq!(fx.records().await, 0);

    let msg = Sms {
        phone: Some("+200".into()),
        ..msg
    };
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_executed()
    );
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
}

/// The body reads its own derived key (to pass on to an external call); it
/// is the key the record is stored under.
pub(crate) async fn body_reads_its_own_key<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Sms {
        phone: Some("+100".into()),
        template: "welcome",
    };
    let key = Key::from_parts(&[&"sms", &"welcome", &"+100"]).unwrap();
    assert_eq!(
        send_sms(fx.store(), &msg, &probe).await.unwrap(),
        Outcome::Executed("sent welcome".to_owned())
    );
    assert_eq!(probe.seen(), [key.as_str()]);
    let rec = fx.record(SMS, &key).await.expect("recorded under that key");
    assert_eq!(rec.key, key.as_str());
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
}

// ---------------------------------------------------------------------------
// Instantiation

/// Hands the scenarios every lease store runs to `$then!`, after `$args`:
/// `$then! { $args scenario: Time, ... }`, each with the [`Time`] its
/// fixture opens on.
#[allow(unused_macros)]
macro_rules! scenarios {
    ($($then:ident)::+ ! { $($args:tt)* }) => {
        $($then)::+ ! { $($args)*
            first_delivery_executes_and_records_completed: Manual,
            duplicate_returns_recorded_outcome_without_running_the_body: Manual,
            body_error_releases_the_claim_and_the_retry_executes: Manual,
            concurrent_deliveries_of_one_message_execute_exactly_once: Manual,
            deliveries_while_the_body_runs_are_in_progress_then_duplicates: Manual,
            concurrent_distinct_messages_each_execute_exactly_once: Manual,
            storm_of_concurrent_duplicates_executes_each_message_once: Manual,
            in_progress_reports_what_is_left_of_the_lease: Manual,
            after_the_ttl_the_key_runs_again: Manual,
            expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost: Manual,
            a_takeover_recording_the_same_outcome_leaves_the_stale_completion_lease_lost: Manual,
            a_completion_whose_reply_was_lost_is_executed_not_lease_lost: Manual,
            a_late_completion_nobody_overtook_is_recorded: Manual,
            stale_failure_after_a_takeover_does_not_release_the_new_claim: Manual,
            heartbeat_keeps_a_long_body_s_lease_alive: Real,
            stored_outcome_that_no_longer_decodes_is_a_codec_error: Manual,
            an_unrecordable_result_settles_the_key_and_deliveries_get_unrecordable: Manual,
            none_key_part_is_key_missing_and_the_body_does_not_run: Manual,
            body_reads_its_own_key: Manual,
            deliveries_with_another_payload_are_mismatches_and_run_nothing: Manual,
            failures_are_counted_exactly_under_16_concurrent_consumers: Manual,
            a_final_error_is_recorded_and_replayed: Manual,
            a_claim_whose_lease_ran_out_counts_as_a_failure: Manual,
            a_stalled_last_attempt_that_finishes_is_recorded: Manual,
            a_huge_error_text_is_cut_and_counted: Manual,
            a_settled_record_reads_back_the_same_expiry_each_time: Manual,
            a_batch_answers_each_message_in_input_order: Manual,
            a_failing_batch_records_nothing_and_its_redelivery_runs_it: Manual,
            a_batch_body_answering_too_few_values_is_an_outcome_count_error: Manual,
            a_batch_completion_whose_reply_was_lost_is_executed_not_lease_lost: Manual,
            a_batch_value_that_cannot_be_recorded_settles_its_key_alone: Manual,
            overlapping_batches_from_8_consumers_execute_every_key_once: Manual,
        }
    };
}

/// One `#[tokio::test]` per scenario, on a fixture of type `$Fx` of its own.
#[allow(unused_macros)]
macro_rules! tests {
    ($Fx:ty; $($scenario:ident: $time:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                use crate::common::lease;
                lease::run::<$Fx, _>(lease::Time::$time, lease::$scenario).await;
            }
        )*
    };
}

/// The lease suite on the fixture type `$Fx`: `lease::suite!(MemoryFx);`.
#[allow(unused_macros)]
macro_rules! suite {
    ($Fx:ty) => {
        crate::common::lease::scenarios!(crate::common::lease::tests! { $Fx; });
    };
}

/// The scenarios that need the store's expiry on a manual clock, for the
/// fixtures that have one (SQL, memory).
#[allow(unused_macros)]
macro_rules! clock_suite {
    ($Fx:ty) => {
        crate::common::lease::tests! { $Fx;
            heartbeat_renews_the_lease_from_the_store_s_clock: Manual,
        }
    };
}

#[allow(unused_imports)]
pub(crate) use {clock_suite, scenarios, suite, tests};
