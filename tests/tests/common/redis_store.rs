//! Store-level scenarios of the Redis store, run on one server
//! (`redis_lease.rs`) and on a cluster (`redis_cluster.rs`), each on a
//! fixture (key prefix) of its own:
//!
//! * the batch methods (`claim_batch`, `complete_batch`, `release_batch`,
//!   `extend_batch`): fresh keys, a mix of recorded, live and fresh ones,
//!   and fencing after a takeover;
//! * records the previous release wrote, as hashes, by its own scripts
//!   (`tests/fixtures/redis_hash/`): read, honoured, completed.
//!
//! [`redis_store_scenarios!`] hands the list to a runner.

use std::time::Duration;

use idem_runtime::Key;
use idem_runtime::registry::{HandlerSpec, Mode};
use idem_runtime::store::{BatchItem, Claim, Failure, Held, LeaseStore, Standing};
use idem_runtime::store::{Forgot, Inspect, LEASE_RAN_OUT, Query, Record, Status};

use super::RedisFx;
use super::lease::{self, Job, LeaseFixture, system_now_ms};

const fn spec(name: &'static str, max_attempts: Option<u32>) -> HandlerSpec {
    HandlerSpec {
        name,
        function: name,
        key: "id",
        ttl: Duration::from_secs(3_600),
        lease: Duration::from_secs(30),
        store: "redis",
        mode: Mode::Lease,
        module: module_path!(),
        file: file!(),
        line: line!(),
        fingerprint: Some("*"),
        max_attempts,
    }
}

static BATCH: HandlerSpec = spec("rs_batch", None);
static COUNTED: HandlerSpec = spec("rs_counted", Some(3));
static OLD: HandlerSpec = spec("rs_old", None);
static OLD_COUNTED: HandlerSpec = spec("rs_old_counted", Some(3));

fn key(id: &str) -> Key {
    Key::from_parts(&[&id]).unwrap()
}

fn items<'a>(keys: &'a [Key], fingerprint: Option<&'a str>) -> Vec<BatchItem<'a>> {
    keys.iter()
        .map(|key| BatchItem { key, fingerprint })
        .collect()
}

fn token(claim: &Claim) -> &str {
    match claim {
        Claim::Fresh { token } => token,
        Claim::Refused(standing) => panic!("expected a claim, got {standing:?}"),
    }
}

async fn record(fx: &RedisFx, spec: &HandlerSpec, key: &Key) -> Record {
    fx.store
        .record(spec.name, key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no record of {key}"))
}

/// Message ids that put hash-tag characters, the record format's
/// separator and multi-byte characters into the keys.
fn awkward_id(i: usize) -> String {
    match i % 5 {
        0 => format!("m-{i}"),
        1 => format!("a}}b{{{i}"),
        2 => format!("{{{i}}}"),
        3 => format!("p|{i}|2|c|"),
        _ => format!("é-{i}"),
    }
}

// ---------------------------------------------------------------------------
// Batches

/// A thousand fresh keys, some with braces, `|` and `é` in them, are
/// claimed in one batch (in progress, each under its own token), completed
/// in one batch, and a second batch is refused with each one's outcome.
/// Stale tokens then extend and release nothing.
pub(crate) async fn a_batch_of_fresh_keys_is_claimed_completed_and_replayed(fx: &RedisFx) {
    const KEYS: usize = 1_000;
    let store = &fx.store;
    let keys: Vec<Key> = (0..KEYS).map(|i| key(&awkward_id(i))).collect();
    let claims = store
        .claim_batch(&BATCH, &items(&keys, None))
        .await
        .unwrap();
    assert_eq!(claims.len(), KEYS);
    let tokens: Vec<&str> = claims.iter().map(token).collect();
    let distinct: std::collections::HashSet<&&str> = tokens.iter().collect();
    assert_eq!(distinct.len(), KEYS, "one token per claim");
    for i in [0, 1, 2, 3, 4, KEYS - 1] {
        let r = record(fx, &BATCH, &keys[i]).await;
        assert_eq!(
            (r.status, r.token.as_deref()),
            (Status::InProgress, Some(tokens[i]))
        );
    }

    let outcomes: Vec<String> = (0..KEYS).map(|i| format!("{{\"n\":{i}}}")).collect();
    let done: Vec<(Held<'_>, &str)> = keys
        .iter()
        .zip(&tokens)
        .zip(&outcomes)
        .map(|((key, token), outcome)| (Held { key, token }, outcome.as_str()))
        .collect();
    let completed = store.complete_batch(&BATCH, &done).await.unwrap();
    assert!(completed.iter().all(|c| *c), "{completed:?}");

    let again = store
        .claim_batch(&BATCH, &items(&keys, None))
        .await
        .unwrap();
    for (i, claim) in again.iter().enumerate() {
        assert_eq!(
            *claim,
            Claim::Refused(Standing::Completed {
                outcome: outcomes[i].clone(),
                trace: None
            }),
            "key {i}"
        );
    }
    let held: Vec<Held<'_>> = done.iter().map(|(held, _)| *held).collect();
    let extended = store.extend_batch(&BATCH, &held).await.unwrap();
    assert!(extended.iter().all(|e| !*e), "a completed key is extended");
    store.release_batch(&BATCH, &held).await.unwrap();
    let r = record(fx, &BATCH, &keys[KEYS - 1]).await;
    assert_eq!(
        (r.status, r.outcome.as_deref(), r.token.as_deref()),
        (
            Status::Completed,
            Some(outcomes[KEYS - 1].as_str()),
            Some(tokens[KEYS - 1])
        )
    );
    // The same completion again (its reply lost): every key answers that
    // it recorded, and the records stay as they are.
    let completed = store.complete_batch(&BATCH, &done).await.unwrap();
    assert!(completed.iter().all(|c| *c), "{completed:?}");
    assert_eq!(record(fx, &BATCH, &keys[KEYS - 1]).await, r);
}

/// One batch over a completed key, a live claim, a fresh key, a counted
/// failure that may be retried, a key recorded for another payload and a
/// final failure: each gets what a single claim would.
pub(crate) async fn a_batch_mixes_recorded_live_and_fresh_keys(fx: &RedisFx) {
    let store = &fx.store;
    let ids = ["done", "busy", "fresh", "retry", "other", "gone"];
    let keys: Vec<Key> = ids.iter().map(|id| key(id)).collect();
    let claim = |k: usize| {
        let key = keys[k].clone();
        async move {
            let claim = store.claim(&COUNTED, &key, Some("f1")).await.unwrap();
            token(&claim).to_owned()
        }
    };
    let t = claim(0).await;
    assert!(store.complete(&COUNTED, &keys[0], &t, "1").await.unwrap());
    let busy = claim(1).await;
    let t = claim(3).await;
    let failure = Failure::Counted {
        error: "smtp | timeout é",
    };
    assert!(store.fail(&COUNTED, &keys[3], &t, failure).await.unwrap());
    let other = store.claim(&COUNTED, &keys[4], Some("f0")).await.unwrap();
    assert!(
        store
            .complete(&COUNTED, &keys[4], token(&other), "4")
            .await
            .unwrap()
    );
    let t = claim(5).await;
    let last = Failure::Final {
        error: "gone for good",
        encoded: "\"gone\"",
    };
    assert!(store.fail(&COUNTED, &keys[5], &t, last).await.unwrap());

    let claims = store
        .claim_batch(&COUNTED, &items(&keys, Some("f1")))
        .await
        .unwrap();
    assert_eq!(
        claims[0],
        Claim::Refused(Standing::Completed {
            outcome: "1".into(),
            trace: None
        })
    );
    match &claims[1] {
        Claim::Refused(Standing::InProgress { retry_after }) => {
            assert!(*retry_after <= COUNTED.lease, "{retry_after:?}");
            assert!(
                *retry_after > COUNTED.lease - Duration::from_secs(5),
                "{retry_after:?}"
            );
        }
        other => panic!("the live claim stands: {other:?}"),
    }
    let fresh = token(&claims[2]).to_owned();
    let retried = token(&claims[3]).to_owned();
    assert_eq!(
        claims[4],
        Claim::Refused(Standing::Mismatch {
            recorded: "f0".into()
        })
    );
    assert_eq!(
        claims[5],
        Claim::Refused(Standing::Failed {
            error: "\"gone\"".into(),
            trace: None
        })
    );

    // The retry carries the failure on; the live claim kept its token.
    let r = record(fx, &COUNTED, &keys[3]).await;
    assert_eq!(
        (r.status, r.attempts, r.failures, r.last_error.as_deref()),
        (Status::InProgress, 2, 1, Some("smtp | timeout é"))
    );
    assert_eq!(
        record(fx, &COUNTED, &keys[1]).await.token.as_deref(),
        Some(busy.as_str())
    );
    let done = [
        (
            Held {
                key: &keys[2],
                token: &fresh,
            },
            "2",
        ),
        (
            Held {
                key: &keys[3],
                token: &retried,
            },
            "3",
        ),
    ];
    assert_eq!(
        store.complete_batch(&COUNTED, &done).await.unwrap(),
        [true, true]
    );
    let r = record(fx, &COUNTED, &keys[3]).await;
    assert_eq!(
        (r.status, r.outcome.as_deref(), r.attempts, r.failures),
        (Status::Completed, Some("3"), 2, 1)
    );
    assert_eq!(
        record(fx, &COUNTED, &keys[2]).await.fingerprint.as_deref(),
        Some("f1")
    );
}

/// A batch's claims; one of their leases runs out and another consumer
/// takes that key over. The batch's completion, extension and release with
/// the stale token leave the new claim alone and report it lost; the other
/// keys complete.
pub(crate) async fn a_batch_completion_after_a_takeover_is_fenced(fx: &RedisFx) {
    let store = &fx.store;
    let keys: Vec<Key> = (0..3).map(|i| key(&format!("fence-{i}"))).collect();
    let claims = store
        .claim_batch(&BATCH, &items(&keys, None))
        .await
        .unwrap();
    let tokens: Vec<String> = claims.iter().map(|c| token(c).to_owned()).collect();

    fx.run_out_lease(BATCH.name, &keys[1]).await;
    let taken = store.claim(&BATCH, &keys[1], None).await.unwrap();
    let new_token = token(&taken).to_owned();
    assert_ne!(new_token, tokens[1]);

    let held: Vec<Held<'_>> = keys
        .iter()
        .zip(&tokens)
        .map(|(key, token)| Held { key, token })
        .collect();
    assert_eq!(
        store.extend_batch(&BATCH, &held).await.unwrap(),
        [true, false, true]
    );
    let stale = [held[1]];
    store.release_batch(&BATCH, &stale).await.unwrap();
    let done: Vec<(Held<'_>, &str)> = held.iter().map(|h| (*h, "\"late\"")).collect();
    assert_eq!(
        store.complete_batch(&BATCH, &done).await.unwrap(),
        [true, false, true]
    );
    let r = record(fx, &BATCH, &keys[1]).await;
    assert_eq!(
        (r.status, r.token.as_deref(), r.outcome),
        (Status::InProgress, Some(new_token.as_str()), None),
        "the stale token overwrote the new claim"
    );
    assert!(
        store
            .complete(&BATCH, &keys[1], &new_token, "\"new\"")
            .await
            .unwrap()
    );
    for (i, outcome) in ["\"late\"", "\"new\"", "\"late\""].iter().enumerate() {
        let r = record(fx, &BATCH, &keys[i]).await;
        assert_eq!(
            (r.status, r.outcome.as_deref()),
            (Status::Completed, Some(*outcome))
        );
    }
}

// ---------------------------------------------------------------------------
// Records of the previous release

/// The previous release's scripts, verbatim.
struct OldScripts {
    claim: redis::Script,
    complete: redis::Script,
    fail: redis::Script,
}

impl OldScripts {
    fn new() -> OldScripts {
        OldScripts {
            claim: redis::Script::new(include_str!("../../fixtures/redis_hash/claim.lua")),
            complete: redis::Script::new(include_str!("../../fixtures/redis_hash/complete.lua")),
            fail: redis::Script::new(include_str!("../../fixtures/redis_hash/fail.lua")),
        }
    }

    /// A claim as the previous release made it; its reply's tag.
    async fn claim(
        &self,
        fx: &RedisFx,
        spec: &HandlerSpec,
        key: &Key,
        token: &str,
        fingerprint: &str,
    ) -> i64 {
        let mut inv = self.claim.prepare_invoke();
        inv.key(fx.rkey(spec.name, key))
            .arg(token)
            .arg(spec.lease.as_millis() as u64)
            .arg(system_now_ms())
            .arg(fingerprint)
            .arg(spec.max_attempts.map(|m| m.to_string()).unwrap_or_default())
            .arg(spec.ttl.as_millis() as u64)
            .arg(LEASE_RAN_OUT);
        let reply: Vec<redis::Value> = fx.invoke(&inv).await;
        match reply.first() {
            Some(redis::Value::Int(tag)) => *tag,
            other => panic!("the old claim replied {other:?}"),
        }
    }

    async fn complete(
        &self,
        fx: &RedisFx,
        spec: &HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) {
        let mut inv = self.complete.prepare_invoke();
        inv.key(fx.rkey(spec.name, key))
            .arg(token)
            .arg(outcome)
            .arg(spec.ttl.as_millis() as u64)
            .arg(system_now_ms());
        assert_eq!(fx.invoke::<i64>(&inv).await, 1);
    }

    /// A failure recorded as the previous release recorded it.
    async fn fail(
        &self,
        fx: &RedisFx,
        spec: &HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) {
        let status = match failure {
            Failure::Counted { .. } => "retry",
            Failure::Final { .. } => "failed",
        };
        let mut inv = self.fail.prepare_invoke();
        inv.key(fx.rkey(spec.name, key))
            .arg(token)
            .arg(status)
            .arg(failure.recorded().unwrap_or_default())
            .arg(failure.text())
            .arg(spec.ttl.as_millis() as u64)
            .arg(system_now_ms());
        assert_eq!(fx.invoke::<i64>(&inv).await, 1);
    }
}

async fn redis_type(fx: &RedisFx, spec: &HandlerSpec, key: &Key) -> String {
    fx.query(redis::cmd("TYPE").arg(fx.rkey(spec.name, key)))
        .await
}

/// Records the previous release wrote as hashes, by its own scripts: a
/// completed one, a live claim, a counted failure, a stalled claim and a
/// final failure. This release reads each (`record`, `Inspect`), answers
/// claims as that release did, and leaves a hash it refuses as it is (a
/// consumer of that release may still read it); a claim that takes a key
/// over, and the completion of a claim held in a hash, write this
/// release's format. A handler's duplicate of a completed hash gets its
/// outcome without running.
pub(crate) async fn hashes_of_the_previous_release_are_read_and_honoured(fx: &RedisFx) {
    let old = OldScripts::new();
    let store = &fx.store;
    let k = |id: &str| key(id);
    let (done, busy, retry, stalled, gone) =
        (k("done"), k("busy"), k("retry"), k("stalled"), k("gone"));
    let t = |n: u8| format!("{n:032x}");

    assert_eq!(old.claim(fx, &OLD, &done, &t(1), "f1").await, 1);
    old.complete(fx, &OLD, &done, &t(1), "{\"points\":5}").await;
    assert_eq!(old.claim(fx, &OLD, &busy, &t(2), "").await, 1);
    assert_eq!(old.claim(fx, &OLD_COUNTED, &retry, &t(3), "").await, 1);
    let failure = Failure::Counted { error: "boom | é" };
    old.fail(fx, &OLD_COUNTED, &retry, &t(3), failure).await;
    assert_eq!(old.claim(fx, &OLD_COUNTED, &stalled, &t(4), "").await, 1);
    // Its consumer stopped: the lease ended, the record stays for the ttl.
    let _: i64 = fx
        .query(
            redis::cmd("HSET")
                .arg(fx.rkey(OLD_COUNTED.name, &stalled))
                .arg("l")
                .arg(system_now_ms() - 1),
        )
        .await;
    assert_eq!(old.claim(fx, &OLD, &gone, &t(5), "").await, 1);
    let failure = Failure::Final {
        error: "gone for good",
        encoded: "\"gone\"",
    };
    old.fail(fx, &OLD, &gone, &t(5), failure).await;
    for (spec, key) in [
        (&OLD, &done),
        (&OLD, &busy),
        (&OLD_COUNTED, &retry),
        (&OLD, &gone),
    ] {
        assert_eq!(redis_type(fx, spec, key).await, "hash");
    }

    // Read as they were written.
    let now = system_now_ms();
    let r = store
        .lookup(OLD.name, done.as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            r.status,
            r.outcome.as_deref(),
            r.attempts,
            r.failures,
            r.fingerprint.as_deref(),
            r.token.clone()
        ),
        (
            Status::Completed,
            Some("{\"points\":5}"),
            1,
            0,
            Some("f1"),
            None
        )
    );
    assert!(r.expires_at_ms > now + 3_500_000, "{r:?}");
    let r = record(fx, &OLD, &busy).await;
    assert_eq!(
        (r.status, r.token.clone()),
        (Status::InProgress, Some(t(2)))
    );
    assert!(
        (now + 25_000..=now + 30_000).contains(&r.expires_at_ms),
        "{r:?}"
    );
    let r = record(fx, &OLD_COUNTED, &retry).await;
    assert_eq!(
        (r.status, r.failures, r.last_error.as_deref()),
        (Status::Retry, 1, Some("boom | é"))
    );
    let r = record(fx, &OLD, &gone).await;
    assert_eq!(
        (r.status, r.outcome.as_deref()),
        (Status::Failed, Some("\"gone\""))
    );

    // Refusals leave the hashes as they are.
    assert_eq!(
        store.claim(&OLD, &done, Some("f1")).await.unwrap(),
        Claim::Refused(Standing::Completed {
            outcome: "{\"points\":5}".into(),
            trace: None,
        })
    );
    assert_eq!(
        store.claim(&OLD, &done, Some("f2")).await.unwrap(),
        Claim::Refused(Standing::Mismatch {
            recorded: "f1".into()
        })
    );
    match store.claim(&OLD, &busy, None).await.unwrap() {
        Claim::Refused(Standing::InProgress { retry_after }) => {
            assert!(
                retry_after <= OLD.lease && retry_after > Duration::from_secs(20),
                "{retry_after:?}"
            );
        }
        other => panic!("the old claim's lease holds: {other:?}"),
    }
    assert_eq!(
        store.claim(&OLD, &gone, None).await.unwrap(),
        Claim::Refused(Standing::Failed {
            error: "\"gone\"".into(),
            trace: None
        })
    );
    let batch = [done.clone(), k("beside")];
    let claims = store
        .claim_batch(&OLD, &items(&batch, Some("f1")))
        .await
        .unwrap();
    assert_eq!(
        claims[0],
        Claim::Refused(Standing::Completed {
            outcome: "{\"points\":5}".into(),
            trace: None,
        })
    );
    let beside = token(&claims[1]).to_owned();
    for (spec, key) in [(&OLD, &done), (&OLD, &busy), (&OLD, &gone)] {
        assert_eq!(redis_type(fx, spec, key).await, "hash", "{key}");
    }

    // The old claim's token completes it, in this release's format.
    assert!(!store.complete(&OLD, &busy, &t(9), "8").await.unwrap());
    assert!(store.complete(&OLD, &busy, &t(2), "7").await.unwrap());
    assert_eq!(redis_type(fx, &OLD, &busy).await, "string");
    assert_eq!(
        store.claim(&OLD, &busy, None).await.unwrap(),
        Claim::Refused(Standing::Completed {
            outcome: "7".into(),
            trace: None
        })
    );

    // Takeovers follow the old rules and write this release's format.
    let claim = store.claim(&OLD_COUNTED, &retry, None).await.unwrap();
    let r = record(fx, &OLD_COUNTED, &retry).await;
    assert_eq!(
        (
            r.status,
            r.token.as_deref(),
            r.attempts,
            r.failures,
            r.last_error.as_deref()
        ),
        (
            Status::InProgress,
            Some(token(&claim)),
            2,
            1,
            Some("boom | é")
        )
    );
    assert_eq!(redis_type(fx, &OLD_COUNTED, &retry).await, "string");
    let claim = store.claim(&OLD_COUNTED, &stalled, None).await.unwrap();
    let r = record(fx, &OLD_COUNTED, &stalled).await;
    assert_eq!(
        (
            r.token.as_deref(),
            r.attempts,
            r.failures,
            r.last_error.as_deref()
        ),
        (Some(token(&claim)), 2, 1, Some(LEASE_RAN_OUT)),
        "the stall is counted"
    );
    assert!(store.complete(&OLD, &batch[1], &beside, "1").await.unwrap());

    // A handler's duplicate of a completed hash replays it.
    let probe = super::Probe::new();
    let msg = Job::new("hash-done", 9);
    let job_spec = idem_runtime::registry::find(lease::JOB).unwrap();
    assert_eq!(old.claim(fx, job_spec, &msg.key(), &t(6), "").await, 1);
    old.complete(fx, job_spec, &msg.key(), &t(6), "5").await;
    assert_eq!(
        lease::job(store, &msg, &probe, fx).await.unwrap(),
        idem_runtime::Outcome::Duplicate(5)
    );
    assert_eq!(probe.runs(), 0);

    // The operator's view: both formats listed and counted; forget reads
    // a hash too, and refuses a live one.
    let listed = store.list(OLD.name, Query::default()).await.unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    let stats = store.stats().await.unwrap();
    let old_stats = stats
        .handlers
        .iter()
        .find(|h| h.handler == OLD.name)
        .unwrap();
    assert_eq!(old_stats.records, 4, "{stats:?}");
    assert!(matches!(
        store.forget(OLD.name, gone.as_str(), false).await.unwrap(),
        Forgot::Deleted(r) if r.status == Status::Failed
    ));
    assert!(store.record(OLD.name, &gone).await.unwrap().is_none());
    assert_eq!(old.claim(fx, &OLD, &k("live"), &t(7), "").await, 1);
    assert!(matches!(
        store.forget(OLD.name, k("live").as_str(), false).await.unwrap(),
        Forgot::Refused(r) if r.status == Status::InProgress
    ));
    assert!(matches!(
        store
            .forget(OLD.name, k("live").as_str(), true)
            .await
            .unwrap(),
        Forgot::Deleted(_)
    ));
}

/// A record says when it ends as it was written, read after read: a
/// settled one (completed, failed for good, counted) when Redis expires its
/// key, exactly, and a claim when its lease ends, by the consumer's clock.
/// The store's clock is stopped (a manual clock): an end derived from the
/// key's TTL at each read would move with every read.
pub(crate) async fn a_record_reads_back_the_end_it_was_written_with(fx: &RedisFx) {
    const AT: i64 = 1_800_000_000_000;
    let store = fx
        .store
        .clone()
        .with_clock(idem_runtime::clock::ManualClock::new(AT));
    let keys: Vec<Key> = ["done", "gone", "again", "held"]
        .iter()
        .map(|id| key(&format!("ends-{id}")))
        .collect();
    let mut tokens = Vec::new();
    for k in &keys {
        tokens.push(token(&store.claim(&COUNTED, k, None).await.unwrap()).to_owned());
    }
    let completed = store.complete(&COUNTED, &keys[0], &tokens[0], "1");
    assert!(completed.await.unwrap());
    let last = Failure::Final {
        error: "gone for good",
        encoded: "\"gone\"",
    };
    assert!(
        store
            .fail(&COUNTED, &keys[1], &tokens[1], last)
            .await
            .unwrap()
    );
    let counted = Failure::Counted { error: "timeout" };
    let failed = store.fail(&COUNTED, &keys[2], &tokens[2], counted);
    assert!(failed.await.unwrap());

    let lease = i64::try_from(COUNTED.lease.as_millis()).unwrap();
    let ttl = i64::try_from(COUNTED.ttl.as_millis()).unwrap();
    for (i, k) in keys.iter().enumerate() {
        let read = || async {
            store
                .record(COUNTED.name, k)
                .await
                .unwrap()
                .expect("a record")
        };
        let first = read().await;
        if i < 3 {
            // The end Redis was told, by its own clock: a ttl after the write.
            let at: i64 = fx
                .query(redis::cmd("PEXPIRETIME").arg(fx.rkey(COUNTED.name, k)))
                .await;
            assert_eq!(first.expires_at_ms, at, "{first:?}");
            let since = system_now_ms() - (at - ttl);
            assert!(
                (0..60_000).contains(&since),
                "written {since} ms ago: {first:?}"
            );
        } else {
            assert_eq!(first.expires_at_ms, AT + lease, "{first:?}");
        }
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(7)).await;
            assert_eq!(read().await, first, "two reads of an untouched record");
        }
        let listed = store.list(COUNTED.name, Query::new()).await.unwrap();
        let listed = listed.iter().find(|r| r.key == k.as_str()).expect("listed");
        assert_eq!(*listed, first, "listed as read");
    }
}

/// Hands the scenarios to `$then!`, after `$args`: `$then! { $args
/// scenario, ... }`.
#[allow(unused_macros)]
macro_rules! redis_store_scenarios {
    ($($then:ident)::+ ! { $($args:tt)* }) => {
        $($then)::+ ! { $($args)*
            a_record_reads_back_the_end_it_was_written_with,
            a_batch_of_fresh_keys_is_claimed_completed_and_replayed,
            a_batch_mixes_recorded_live_and_fresh_keys,
            a_batch_completion_after_a_takeover_is_fenced,
            hashes_of_the_previous_release_are_read_and_honoured,
        }
    };
}

#[allow(unused_imports)]
pub(crate) use redis_store_scenarios;
