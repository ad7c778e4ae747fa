//! The lease suite's scenarios about a claim and its duplicates: the first
//! delivery, duplicates, a failed body's retry, concurrent and storming
//! deliveries.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::Status;
use idem_runtime::{Error, Outcome};

use super::{JOB, Job, LeaseFixture, Token, assert_expires_in, job, jobs_together, spawn_job};
use crate::common::{AppError, Probe, Tally};

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
