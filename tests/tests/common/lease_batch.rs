//! The lease suite's scenarios about batch handlers: one claim for a
//! batch's keys, one body run over its fresh messages, one answer per
//! message in input order. Run on every lease store with the rest of the
//! suite (see [`scenarios!`](super::lease::scenarios)).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::Status;
use idem_runtime::{Error, Outcome, idempotent};

use super::lease::{Effects, Job, LeaseFixture};
use super::{AppError, Probe, together};

/// The registered name of [`job_batch`].
pub(crate) const JOB_BATCH: &str = "lease_job_batch";

/// A message id the batch body answers one value short for.
pub(crate) const SHORT: &str = "answer-one-short";

/// Applies each fresh message's effect and answers its value; fails the
/// whole batch before any effect if a message says so, and answers one
/// value too few when the batch holds [`SHORT`].
#[idempotent(
    key = "msgs.id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_job_batch"
)]
pub(crate) async fn job_batch(
    msgs: &[Job],
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<Vec<u32>, AppError> {
    probe.hit();
    for msg in msgs {
        probe.see(msg.id.clone());
    }
    if let Some(msg) = msgs.iter().find(|m| m.fail) {
        return Err(AppError::Refused(format!("job {} failed", msg.id)));
    }
    let mut values = Vec::with_capacity(msgs.len());
    for msg in msgs {
        effects.apply(&msg.id).await?;
        values.push(msg.value);
    }
    if msgs.iter().any(|m| m.id == SHORT) {
        values.pop();
    }
    Ok(values)
}

/// Each message's value, or the kind of its error, for comparing a
/// batch's answers.
fn shown(results: &[Result<Outcome<u32>, Error<AppError>>]) -> Vec<String> {
    results
        .iter()
        .map(|r| match r {
            Ok(Outcome::Executed(v)) => format!("executed {v}"),
            Ok(Outcome::Duplicate(v)) => format!("duplicate {v}"),
            Err(e) => e.kind().to_owned(),
        })
        .collect()
}

pub(crate) async fn a_batch_answers_each_message_in_input_order<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let first = job_batch(fx.store(), &[Job::new("b-2", 20)], &probe, &*fx)
        .await
        .expect("the first batch");
    assert_eq!(shown(&first), ["executed 20"]);

    let batch = [
        Job::new("b-1", 10),
        Job::new("b-2", 21),
        // The same key again, with another value: a duplicate of the first.
        Job::new("b-1", 99),
        Job::new("b-3", 30),
    ];
    let results = job_batch(fx.store(), &batch, &probe, &*fx)
        .await
        .expect("the batch");
    assert_eq!(
        shown(&results),
        ["executed 10", "duplicate 20", "duplicate 10", "executed 30"]
    );
    assert_eq!(probe.runs(), 2, "one body run per batch");
    // The second body saw the fresh messages only, in input order.
    assert_eq!(probe.seen(), ["b-2", "b-1", "b-3"]);
    for id in ["b-1", "b-2", "b-3"] {
        assert_eq!(fx.effects(id).await, 1, "{id}");
    }
    let rec = fx
        .record(JOB_BATCH, &Job::new("b-3", 0).key())
        .await
        .expect("a record of b-3");
    assert_eq!(rec.outcome.as_deref(), Some("30"));

    // The same batch again runs nothing and answers every recorded value.
    let again = job_batch(fx.store(), &batch, &probe, &*fx)
        .await
        .expect("the batch again");
    assert_eq!(
        shown(&again),
        [
            "duplicate 10",
            "duplicate 20",
            "duplicate 10",
            "duplicate 30"
        ]
    );
    assert_eq!(probe.runs(), 2);
}

pub(crate) async fn a_failing_batch_records_nothing_and_its_redelivery_runs_it<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let failing = [
        Job::new("f-1", 1),
        Job {
            fail: true,
            ..Job::new("f-2", 2)
        },
    ];
    let err = job_batch(fx.store(), &failing, &probe, &*fx)
        .await
        .expect_err("the body fails");
    assert!(matches!(err, Error::Handler { .. }), "{err:?}");
    for msg in &failing {
        assert!(
            fx.record(JOB_BATCH, &msg.key()).await.is_none(),
            "{} keeps no claim",
            msg.id
        );
        assert_eq!(fx.effects(&msg.id).await, 0);
    }

    let redelivered = [Job::new("f-1", 1), Job::new("f-2", 2)];
    let results = job_batch(fx.store(), &redelivered, &probe, &*fx)
        .await
        .expect("the redelivery");
    assert_eq!(shown(&results), ["executed 1", "executed 2"]);
    assert_eq!(probe.runs(), 2);
}

pub(crate) async fn a_batch_body_answering_too_few_values_is_an_outcome_count_error<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let batch = [Job::new("c-1", 1), Job::new(SHORT, 2)];
    let err = job_batch(fx.store(), &batch, &probe, &*fx)
        .await
        .expect_err("one value short");
    assert!(
        matches!(
            err,
            Error::OutcomeCount {
                fresh: 2,
                returned: 1,
                ..
            }
        ),
        "{err:?}"
    );
    // The effects happened: every fresh key is settled as failed, with the
    // reason, so no redelivery runs the body again within the ttl.
    for msg in &batch {
        let rec = fx.record(JOB_BATCH, &msg.key()).await.expect("a record");
        assert_eq!(rec.status, Status::Failed, "{rec:?}");
        let why = rec.unrecordable().expect("settled as unrecordable");
        assert!(
            why.contains("given 2 fresh messages but returned 1 values"),
            "{why}"
        );
    }
    let again = job_batch(fx.store(), &batch, &probe, &*fx)
        .await
        .expect("the redelivery");
    assert_eq!(shown(&again), ["unrecordable", "unrecordable"]);
    for r in &again {
        assert!(
            matches!(r, Err(Error::Unrecordable { source, .. })
                if source.to_string().contains("returned 1 values")),
            "{r:?}"
        );
    }
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("c-1").await, 1);
}

/// Answers each message's value as a ratio, NaN (which JSON cannot carry)
/// for the ids that start with `nan`.
#[idempotent(
    key = "msgs.id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_ratio_batch"
)]
pub(crate) async fn ratio_batch(msgs: &[Job], probe: &Probe) -> Result<Vec<f64>, AppError> {
    probe.hit();
    Ok(msgs
        .iter()
        .map(|m| {
            if m.id.starts_with("nan") {
                f64::NAN
            } else {
                f64::from(m.value)
            }
        })
        .collect())
}

/// One message of a batch whose value cannot be recorded: that key is
/// settled as failed with the reason and answers `Unrecordable` (its repeat
/// in the batch too); the others are recorded as usual. A redelivery runs
/// nothing.
pub(crate) async fn a_batch_value_that_cannot_be_recorded_settles_its_key_alone<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let batch = [
        Job::new("q-1", 1),
        Job::new("nan-1", 2),
        Job::new("q-2", 3),
        Job::new("nan-1", 4),
    ];
    let kinds = |results: &[Result<Outcome<f64>, Error<AppError>>]| -> Vec<String> {
        results
            .iter()
            .map(|r| match r {
                Ok(Outcome::Executed(v)) => format!("executed {v}"),
                Ok(Outcome::Duplicate(v)) => format!("duplicate {v}"),
                Err(Error::Unrecordable { key, source, .. }) => {
                    assert_eq!(*key, Job::new("nan-1", 0).key());
                    assert!(source.to_string().contains("NaN"), "{source}");
                    "unrecordable".to_owned()
                }
                Err(e) => e.kind().to_owned(),
            })
            .collect()
    };
    let results = ratio_batch(fx.store(), &batch, &probe)
        .await
        .expect("the batch");
    assert_eq!(
        kinds(&results),
        ["executed 1", "unrecordable", "executed 3", "unrecordable"]
    );
    let rec = fx
        .record("lease_ratio_batch", &Job::new("nan-1", 0).key())
        .await
        .expect("a record");
    assert_eq!(rec.status, Status::Failed, "{rec:?}");
    assert!(
        rec.unrecordable().is_some_and(|why| why.contains("NaN")),
        "{rec:?}"
    );
    let rec = fx
        .record("lease_ratio_batch", &Job::new("q-2", 0).key())
        .await
        .expect("a record");
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("3.0"))
    );

    let again = ratio_batch(fx.store(), &batch, &probe)
        .await
        .expect("the redelivery");
    assert_eq!(
        kinds(&again),
        ["duplicate 1", "unrecordable", "duplicate 3", "unrecordable"]
    );
    assert_eq!(probe.runs(), 1, "the redelivery ran nothing");
}

/// A batch's completion is written and its reply lost (see
/// [`Lossy`](super::lossy::Lossy); the connection really drops on the
/// stores with a server): the runtime sends it again, which finds every
/// record completed by the batch's own tokens. Each message is `Executed`,
/// not `LeaseLost`, and a redelivery is a duplicate.
pub(crate) async fn a_batch_completion_whose_reply_was_lost_is_executed_not_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let lossy = fx.lossy().await;
    let probe = Probe::new();
    let warm = job_batch(&lossy, &[Job::new("lb-0", 1)], &probe, &*fx)
        .await
        .expect("a first batch on the link");
    assert_eq!(shown(&warm), ["executed 1"]);

    lossy.lose_next_completion();
    let value = super::lease::LOST_REPLY_VALUE;
    let batch = [Job::new("lb-1", value), Job::new("lb-2", value + 1)];
    let results = job_batch(&lossy, &batch, &probe, &*fx)
        .await
        .expect("the batch");
    assert_eq!(lossy.lost(), 1, "the completion's reply was not lost");
    assert_eq!(
        shown(&results),
        [
            format!("executed {value}"),
            format!("executed {}", value + 1)
        ]
    );
    for (msg, v) in batch.iter().zip([value, value + 1]) {
        let rec = fx.record(JOB_BATCH, &msg.key()).await.expect("a record");
        assert_eq!(rec.outcome, Some(v.to_string()), "{rec:?}");
        assert_eq!(fx.effects(&msg.id).await, 1, "{}", msg.id);
    }
    let again = job_batch(fx.store(), &batch, &probe, &*fx)
        .await
        .expect("the redelivery");
    assert_eq!(
        shown(&again),
        [
            format!("duplicate {value}"),
            format!("duplicate {}", value + 1)
        ]
    );
    assert_eq!(probe.runs(), 2);
}

/// Message ids `0..KEYS`, read by 8 consumers in overlapping windows.
const KEYS: usize = 120;

pub(crate) async fn overlapping_batches_from_8_consumers_execute_every_key_once<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    // Consumer i reads 50 consecutive ids from 15 * i, wrapping: every id
    // is in three or four consumers' batches.
    let answers = together(8, |i| {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        async move {
            let mut batch: Vec<Job> = (0..50)
                .map(|n| {
                    let id = (15 * i + n) % KEYS;
                    Job::new(&format!("o-{id}"), u32::try_from(id).unwrap())
                })
                .collect();
            let mut settled = Vec::new();
            // Redeliver what another consumer held, as a broker would.
            for _ in 0..200 {
                let results = job_batch(fx.store(), &batch, &probe, &*fx)
                    .await
                    .expect("a batch call");
                let mut busy = Vec::new();
                for (msg, result) in batch.into_iter().zip(results) {
                    match result {
                        Err(Error::InProgress { .. }) => busy.push(msg),
                        other => settled.push((msg.id, other)),
                    }
                }
                if busy.is_empty() {
                    return settled;
                }
                batch = busy;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("consumer {i} kept finding keys in progress");
        }
    })
    .await;

    let mut executed: HashMap<String, usize> = HashMap::new();
    for (id, result) in answers.into_iter().flatten() {
        let value = match result {
            Ok(Outcome::Executed(v)) => {
                *executed.entry(id.clone()).or_default() += 1;
                v
            }
            Ok(Outcome::Duplicate(v)) => v,
            Err(e) => panic!("{id}: {e:?}"),
        };
        assert_eq!(format!("o-{value}"), id, "the recorded value of {id}");
    }
    assert_eq!(executed.len(), KEYS, "every key executed");
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");
    for id in 0..KEYS {
        assert_eq!(fx.effects(&format!("o-{id}")).await, 1, "o-{id}");
    }
}
