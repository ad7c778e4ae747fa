//! The claim rules: what a delivery may do with the record of its key,
//! written once for every store.
//!
//! A key's record is absent or in one of four [`Status`]es, and it has an
//! end (`expires_at_ms`): the end of the lease while it is in progress, the
//! end of the dedup window (the handler's ttl) once it is settled. A claim
//! at `now` reads the record and moves it:
//!
//! ```text
//!                  claim                    complete
//!   absent ───────────────────▶ in_progress ─────────▶ completed ─┐
//!     ▲  ▲                       │  ▲  │  │  fail (final)          │
//!     │  │        release        │  │  │  └──────────▶ failed ─────┤
//!     │  └───────────────────────┘  │  │  fail (may pass)          │
//!     │                             │  └─────────────▶ retry ──────┤
//!     │      claim: lease ran out,  │   claim: attempts left       │
//!     │      or a retry with ───────┴──────────────────────┘       │
//!     │      attempts left                                         │
//!     └──────────── the window is over (expired, swept) ───────────┘
//! ```
//!
//! What a claim finds, and what it does:
//!
//! * **Absent, or expired and settled** (completed, failed or retry past
//!   its end: the window is over): the claim takes the key, and the counts
//!   start again (one attempt, no failure, no last error).
//! * **A live record with another payload fingerprint** (both the record
//!   and the delivery have one, and they differ): refused with
//!   [`Standing::Mismatch`], whatever the status; the key names another
//!   message. Checked before the status.
//! * **Completed**, live: refused with [`Standing::Completed`], the recorded
//!   outcome. **Failed**, live: refused with [`Standing::Failed`], the
//!   recorded error.
//! * **In progress, its lease holds**: refused with
//!   [`Standing::InProgress`], the lease's remaining time as the hint.
//! * **In progress, its lease ran out** (the consumer stopped, or stalled
//!   past its lease): the claim takes it over with one more attempt, one
//!   more failure and [`LEASE_RAN_OUT`] as the last error. When the
//!   handler has `max_attempts` and that failure is the last one allowed,
//!   the key is exhausted instead: the record becomes a retry one with the
//!   stall counted (keeping its token), and the delivery is refused with
//!   [`Standing::Exhausted`]. A lease that ended a ttl ago or more ended its
//!   window: the record is taken as if it were absent.
//! * **Retry**, live: a failure that may pass. Below `max_attempts` (or
//!   without it), the claim takes the key with one more attempt, keeping
//!   the failures and the last error; at `max_attempts` failures, refused
//!   with [`Standing::Exhausted`].
//!
//! The holder of a claim then completes it (completed, the window starts),
//! fails it (failed or retry, one more failure, the window starts),
//! releases it (absent again) or extends its lease; each only while the
//! record still holds the claim's token. A completed record keeps the token
//! of the claim that completed it: a completion sent again with that token
//! (the store wrote the first one, and its reply was lost) answers that it
//! recorded and changes nothing, while a completion with any other token,
//! whatever outcome the record holds, answers that the lease was lost.
//!
//! The stores that decide in the process apply these rules through
//! [`ClaimPlan`] (memory; Redis, which then writes its decision only if the
//! record is still the one it read). The SQL stores write them into their
//! claim statements (`claimable` and `take_over_assignments` in
//! `store/sql/`), and read what a record that stands says, or whether a
//! standing row may be taken, with [`Standing::of`],
//! [`Standing::of_ran_out`] and [`may_take`].

use std::time::Duration;

use crate::registry::HandlerSpec;
use crate::store::contract::Standing;
use crate::store::{Record, Status};

/// Whether the lease of a claim in progress ended less than `ttl` before
/// `now`: its stall still counts as a failure. One that ended longer ago
/// belongs to a window that is over.
pub(crate) fn in_window(record: &Record, now: i64, ttl: Duration) -> bool {
    record.expires_at_ms > now.saturating_sub(crate::clock::millis(ttl))
}

/// The last error a claim records when it takes over a claim whose lease
/// ran out: that delivery's body never reported back.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{LEASE_RAN_OUT, Record};
///
/// fn stalled(record: &Record) -> bool {
///     record.last_error.as_deref() == Some(LEASE_RAN_OUT)
/// }
/// # let _ = stalled;
/// ```
pub const LEASE_RAN_OUT: &str =
    "the lease ran out before the body finished (the consumer stopped, or stalled past its lease)";

impl Standing {
    /// What a live record says to a delivery with payload `fingerprint`, or
    /// `None` when the record lets this delivery claim the key (a failure
    /// that may be retried, within `spec.max_attempts`). `retry_after` is
    /// what an in-progress record reports.
    ///
    /// The one place the rules are written, for every store: a fingerprint
    /// that differs from the record's comes first (whatever the record's
    /// state, the key names another message); then the record's status.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Standing;
    /// use idem_runtime::store::{Record, Status};
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// #     fingerprint: Some("*"), max_attempts: Some(3),
    /// # };
    ///
    /// let mut record = Record::new("notify", "3:m-1", Status::Retry, 0, 60_000);
    /// record.failures = 3;
    /// record.fingerprint = Some("ab12".into());
    /// let left = Duration::from_secs(1);
    /// assert!(matches!(Standing::of(&record, &SPEC, Some("ab12"), left), Some(Standing::Exhausted { failures: 3, .. })));
    /// assert!(matches!(Standing::of(&record, &SPEC, Some("ffff"), left), Some(Standing::Mismatch { .. })));
    /// record.failures = 2;
    /// assert_eq!(Standing::of(&record, &SPEC, Some("ab12"), left), None);
    /// ```
    pub fn of(
        record: &Record,
        spec: &HandlerSpec,
        fingerprint: Option<&str>,
        retry_after: Duration,
    ) -> Option<Standing> {
        if let (Some(recorded), Some(given)) = (record.fingerprint.as_deref(), fingerprint)
            && recorded != given
        {
            return Some(Standing::Mismatch {
                recorded: recorded.to_owned(),
            });
        }
        match record.status {
            Status::Completed => Some(Standing::Completed {
                outcome: record.outcome.clone().unwrap_or_default(),
                trace: record.trace.clone(),
            }),
            Status::Failed => Some(Standing::Failed {
                error: record.outcome.clone().unwrap_or_default(),
                trace: record.trace.clone(),
            }),
            Status::InProgress => Some(Standing::InProgress { retry_after }),
            Status::Retry => match spec.max_attempts {
                Some(max) if record.failures >= i64::from(max) => Some(Standing::Exhausted {
                    failures: u32::try_from(record.failures).unwrap_or(u32::MAX),
                    last_error: record.last_error.clone(),
                }),
                _ => None,
            },
        }
    }

    /// What a claim in progress whose lease ran out by `now_ms` says to a
    /// delivery of a handler with `max_attempts`: the stalled claim counts
    /// as a failure, and when that failure is the last one allowed, the key
    /// is exhausted instead of taken over. The store then records the count
    /// (status [`Retry`](Status::Retry), one more failure,
    /// [`LEASE_RAN_OUT`] as the last error).
    /// A claim whose lease ended a ttl ago or more ended its window: it is
    /// taken over as a fresh one. `None`: the claim may be taken over.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Standing;
    /// use idem_runtime::store::{Record, Status};
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// #     fingerprint: None, max_attempts: Some(3),
    /// # };
    ///
    /// let mut stalled = Record::new("notify", "3:m-1", Status::InProgress, 0, 30_000);
    /// stalled.failures = 2;
    /// assert!(matches!(Standing::of_ran_out(&stalled, &SPEC, 30_000), Some(Standing::Exhausted { failures: 3, .. })));
    /// assert_eq!(Standing::of_ran_out(&stalled, &SPEC, 29_999), None); // its lease holds
    /// stalled.failures = 1;
    /// assert_eq!(Standing::of_ran_out(&stalled, &SPEC, 30_000), None); // two failures: a third try
    /// stalled.failures = 2;
    /// // a stall whose lease ended a ttl ago belongs to a window that is over
    /// assert_eq!(Standing::of_ran_out(&stalled, &SPEC, 30_000 + 3_600_000), None);
    /// ```
    pub fn of_ran_out(record: &Record, spec: &HandlerSpec, now_ms: i64) -> Option<Standing> {
        let max = spec.max_attempts?;
        let ran_out = record.status == Status::InProgress
            && record.is_expired(now_ms)
            && in_window(record, now_ms, spec.ttl);
        let failures = record.failures.saturating_add(1);
        (ran_out && failures >= i64::from(max)).then(|| Standing::Exhausted {
            failures: u32::try_from(failures).unwrap_or(u32::MAX),
            last_error: Some(LEASE_RAN_OUT.to_owned()),
        })
    }
}

/// What a claim carries over from the record it replaces: the counts of a
/// failed delivery's record it may retry, one more failure for a claim
/// whose lease ran out, nothing from a record whose window is over. The
/// memory store applies it as is; the SQL stores and Redis write the same
/// rules in their claim statements.
pub(crate) struct Carried {
    pub(crate) attempts: i64,
    pub(crate) failures: i64,
    pub(crate) last_error: Option<String>,
}

impl Carried {
    /// What a claim at `now` carries over from `previous`, which it may
    /// replace (the caller checked [`Standing::of`](Standing::of)),
    /// for a handler whose records last `ttl`. A stalled claim whose lease
    /// ended a ttl ago or more ended its window: nothing of it is carried.
    pub(crate) fn from(previous: Option<&Record>, now: i64, ttl: Duration) -> Carried {
        match previous {
            Some(p) if p.status == Status::InProgress && in_window(p, now, ttl) => Carried {
                attempts: p.attempts + 1,
                failures: p.failures + 1,
                last_error: Some(LEASE_RAN_OUT.to_owned()),
            },
            Some(p) if p.status == Status::Retry && !p.is_expired(now) => Carried {
                attempts: p.attempts + 1,
                failures: p.failures,
                last_error: p.last_error.clone(),
            },
            _ => Carried {
                attempts: 1,
                failures: 0,
                last_error: None,
            },
        }
    }
}

/// What a claim at `now` does with the record it finds: the one place the
/// lease-mode claim rules are put together, for the stores that decide in
/// the process (memory; Redis, which then writes its decision only if the
/// record is still the one it read).
pub(crate) enum ClaimPlan {
    /// The record stands: [`Standing::of`](Standing::of).
    Refused(Standing),
    /// A claim whose lease ran out was the last failure allowed
    /// ([`Standing::of_ran_out`](Standing::of_ran_out)): the record
    /// becomes a [`Status::Retry`] one with the stall counted (one more
    /// failure, [`LEASE_RAN_OUT`]), keeping its token, and the delivery is
    /// refused with this answer.
    Exhausted(Standing),
    /// The key is free (absent, expired, its lease ran out, or a failure
    /// that may be retried): claim it, carrying this over.
    Take(Carried),
}

impl ClaimPlan {
    /// The plan for a claim at `now` of a key whose record is `existing`,
    /// for a delivery with payload `fingerprint`.
    pub(crate) fn of(
        existing: Option<&Record>,
        spec: &HandlerSpec,
        fingerprint: Option<&str>,
        now: i64,
    ) -> ClaimPlan {
        if let Some(standing) = live_standing(existing, spec, fingerprint, now) {
            return ClaimPlan::Refused(standing);
        }
        if let Some(exhausted) = existing.and_then(|e| Standing::of_ran_out(e, spec, now)) {
            return ClaimPlan::Exhausted(exhausted);
        }
        ClaimPlan::Take(Carried::from(existing, now, spec.ttl))
    }
}

/// `record`, a claim whose lease ran out, settled as the failure that
/// exhausts its key (see [`ClaimPlan::Exhausted`]) at `now`, for a
/// handler whose records last `ttl`.
pub(crate) fn settle_stall(record: &mut Record, now: i64, ttl: Duration) {
    record.status = Status::Retry;
    record.failures += 1;
    record.last_error = Some(LEASE_RAN_OUT.to_owned());
    record.updated_at_ms = now;
    record.expires_at_ms = crate::clock::expiry(now, ttl);
}

/// What the live record in `existing`, if any, says at `now` to a delivery
/// with payload `fingerprint` ([`Standing::of`], with what is left of the
/// record as the hint); `None` when there is none or it lets the delivery
/// claim the key.
pub(crate) fn live_standing(
    existing: Option<&Record>,
    spec: &HandlerSpec,
    fingerprint: Option<&str>,
    now: i64,
) -> Option<Standing> {
    let e = existing.filter(|e| !e.is_expired(now))?;
    let left =
        Duration::from_millis(u64::try_from(e.expires_at_ms.saturating_sub(now)).unwrap_or(0));
    Standing::of(e, spec, fingerprint, left)
}

/// Whether a claim of `spec` for a delivery with `fingerprint` may take the
/// standing `record`, read at `now`: the rule the SQL stores' claim
/// statements write (`claimable`), read from the record. An expired record
/// may be taken unless it is a stalled claim whose failure exhausts the
/// key; a live one unless it stands (a failure that may be retried does
/// not).
#[cfg(feature = "_sql")]
pub(crate) fn may_take(
    record: &Record,
    now: i64,
    spec: &HandlerSpec,
    fingerprint: Option<&str>,
) -> bool {
    if record.is_expired(now) {
        Standing::of_ran_out(record, spec, now).is_none()
    } else {
        Standing::of(record, spec, fingerprint, Duration::ZERO).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Mode;

    static SPEC: HandlerSpec = HandlerSpec {
        name: "notify",
        function: "notify",
        key: "message_id",
        ttl: Duration::from_secs(3_600),
        lease: Duration::from_secs(30),
        store: "memory",
        mode: Mode::Lease,
        module: "app",
        file: "src/app.rs",
        line: 1,
        fingerprint: None,
        max_attempts: Some(3),
    };

    fn carried(plan: ClaimPlan) -> (i64, i64, Option<String>) {
        match plan {
            ClaimPlan::Take(c) => (c.attempts, c.failures, c.last_error),
            ClaimPlan::Refused(s) => panic!("refused: {s:?}"),
            ClaimPlan::Exhausted(s) => panic!("exhausted: {s:?}"),
        }
    }

    #[test]
    fn the_state_machine() {
        // absent: a fresh claim
        assert_eq!(carried(ClaimPlan::of(None, &SPEC, None, 0)), (1, 0, None));

        // in progress, lease holds: busy for what is left of it
        let held = Record::new("notify", "3:m-1", Status::InProgress, 0, 30_000);
        assert!(matches!(
            ClaimPlan::of(Some(&held), &SPEC, None, 10_000),
            ClaimPlan::Refused(Standing::InProgress { retry_after }) if retry_after == Duration::from_secs(20)
        ));
        // its lease ran out: taken over, the stall counted
        assert_eq!(
            carried(ClaimPlan::of(Some(&held), &SPEC, None, 30_000)),
            (2, 1, Some(LEASE_RAN_OUT.to_owned()))
        );
        // ... unless that stall is the last failure allowed
        let mut stalled = held.clone();
        stalled.failures = 2;
        assert!(matches!(
            ClaimPlan::of(Some(&stalled), &SPEC, None, 30_000),
            ClaimPlan::Exhausted(Standing::Exhausted { failures: 3, .. })
        ));
        settle_stall(&mut stalled, 30_000, SPEC.ttl);
        assert_eq!((stalled.status, stalled.failures), (Status::Retry, 3));
        assert_eq!(stalled.expires_at_ms, 30_000 + 3_600_000);
        // a lease that ended a ttl ago: its window is over
        assert_eq!(
            carried(ClaimPlan::of(Some(&held), &SPEC, None, 30_000 + 3_600_000)),
            (1, 0, None)
        );

        // retry with attempts left: taken, failures kept
        let mut retry = Record::new("notify", "3:m-1", Status::Retry, 0, 3_600_000);
        retry.failures = 2;
        retry.last_error = Some("timeout".into());
        assert_eq!(
            carried(ClaimPlan::of(Some(&retry), &SPEC, None, 1_000)),
            (2, 2, Some("timeout".into()))
        );
        retry.failures = 3;
        assert!(matches!(
            ClaimPlan::of(Some(&retry), &SPEC, None, 1_000),
            ClaimPlan::Refused(Standing::Exhausted { failures: 3, .. })
        ));
        // over its window: fresh
        assert_eq!(
            carried(ClaimPlan::of(Some(&retry), &SPEC, None, 3_600_000)),
            (1, 0, None)
        );

        // completed: the outcome; with another fingerprint: a mismatch first
        let mut done = Record::new("notify", "3:m-1", Status::Completed, 0, 3_600_000);
        done.outcome = Some("42".into());
        done.fingerprint = Some("ab12".into());
        assert!(matches!(
            ClaimPlan::of(Some(&done), &SPEC, Some("ab12"), 1_000),
            ClaimPlan::Refused(Standing::Completed { .. })
        ));
        assert!(matches!(
            ClaimPlan::of(Some(&done), &SPEC, Some("ffff"), 1_000),
            ClaimPlan::Refused(Standing::Mismatch { .. })
        ));
    }

    #[cfg(feature = "_sql")]
    #[test]
    fn a_standing_row_is_taken_by_the_same_rules() {
        let mut done = Record::new("notify", "3:m-1", Status::Completed, 0, 3_600_000);
        done.fingerprint = Some("ab12".into());
        assert!(!may_take(&done, 1_000, &SPEC, Some("ab12")));
        assert!(may_take(&done, 3_600_000, &SPEC, Some("ffff")));
        let mut stalled = Record::new("notify", "3:m-1", Status::InProgress, 0, 30_000);
        assert!(may_take(&stalled, 30_000, &SPEC, None));
        stalled.failures = 2;
        assert!(!may_take(&stalled, 30_000, &SPEC, None));
    }
}
