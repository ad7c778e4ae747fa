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

// The core scenarios, one file a subject.
mod cancel;
mod claims;
mod outcomes;
mod takeover;

#[allow(unused_imports)]
pub(crate) use cancel::{
    a_call_dropped_while_recording_holds_its_key_a_whole_lease,
    a_dropped_call_holds_its_key_a_whole_lease_from_the_drop,
};
#[allow(unused_imports)]
pub(crate) use claims::{
    body_error_releases_the_claim_and_the_retry_executes,
    concurrent_deliveries_of_one_message_execute_exactly_once,
    concurrent_distinct_messages_each_execute_exactly_once,
    deliveries_while_the_body_runs_are_in_progress_then_duplicates,
    duplicate_returns_recorded_outcome_without_running_the_body,
    first_delivery_executes_and_records_completed,
    storm_of_concurrent_duplicates_executes_each_message_once,
};
#[allow(unused_imports)]
pub(crate) use outcomes::{
    an_unrecordable_result_settles_the_key_and_deliveries_get_unrecordable, body_reads_its_own_key,
    none_key_part_is_key_missing_and_the_body_does_not_run,
    stored_outcome_that_no_longer_decodes_is_a_codec_error,
};
#[allow(unused_imports)]
pub(crate) use takeover::{
    a_completion_whose_reply_was_lost_is_executed_not_lease_lost,
    a_late_completion_nobody_overtook_is_recorded,
    a_takeover_recording_the_same_outcome_leaves_the_stale_completion_lease_lost,
    after_the_ttl_the_key_runs_again,
    expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost,
    heartbeat_keeps_a_long_body_s_lease_alive, heartbeat_renews_the_lease_from_the_store_s_clock,
    in_progress_reports_what_is_left_of_the_lease,
    stale_failure_after_a_takeover_does_not_release_the_new_claim,
};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::clock::{Clock, ManualClock, TimeShift};
use idem_runtime::store::{LeaseStore, Record, Status};
use idem_runtime::{Error, Key, Outcome, idempotent};

use super::lossy::Lossy;
use super::{AppError, Probe, together};

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
pub(crate) const DROPPED: &str = "lease_dropped";

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

/// A 3 s lease, renewed every second: the body takes effect, then waits
/// for the probe's gate (a provider's answer that is slow to come).
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "3s",
    store = "memory",
    name = "lease_dropped"
)]
pub(crate) async fn effect_then_wait(
    msg: &Job,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<u32, AppError> {
    probe.hit();
    effects.apply(&msg.id).await?;
    probe.park().await;
    Ok(msg.value)
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

/// The value a body returns when its completion's reply is to be lost: a
/// number no other request of a scenario holds, so the proxy finds the
/// completion by it.
pub(crate) const LOST_REPLY_VALUE: u32 = 918_273_645;

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
            a_dropped_call_holds_its_key_a_whole_lease_from_the_drop: Real,
            a_call_dropped_while_recording_holds_its_key_a_whole_lease: Real,
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
