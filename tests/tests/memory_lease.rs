//! Lease mode on the in-memory store: the lease suite (`common/lease.rs`),
//! each test on a store of its own; the bodies' effects are counted next to
//! it.

use crate::common;

common::lease::suite!(common::MemoryFx);
common::lease::clock_suite!(common::MemoryFx);

/// A lease-mode batch whose values cannot all be recorded, on a store whose
/// batch completion or failures fail: the keys that cannot be recorded are
/// settled before the others are completed, and a store that keeps failing
/// costs the batch one lease, not one a key.
mod unrecordable_batches {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use idem_runtime::registry::HandlerSpec;
    use idem_runtime::store::{Claim, Failure, Held, Inspect, LeaseStore, Status};
    use idem_runtime::{Error, Key, MemoryStore, StoreError, idempotent};

    /// The memory store, but its batch completion always fails, and its
    /// `fail` fails while `failing` is set (counting the tries).
    #[derive(Clone, Default)]
    struct Faulty {
        inner: MemoryStore,
        failing: Arc<AtomicUsize>,
        fails_tried: Arc<AtomicUsize>,
    }

    impl LeaseStore for Faulty {
        fn store_name(&self) -> &'static str {
            "faulty"
        }
        async fn claim(
            &self,
            spec: &'static HandlerSpec,
            key: &Key,
            fingerprint: Option<&str>,
        ) -> Result<Claim, StoreError> {
            self.inner.claim(spec, key, fingerprint).await
        }
        async fn fail(
            &self,
            spec: &'static HandlerSpec,
            key: &Key,
            token: &str,
            failure: Failure<'_>,
        ) -> Result<bool, StoreError> {
            self.fails_tried.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) > 0 {
                return Err(StoreError::Backend("the store is down".into()));
            }
            self.inner.fail(spec, key, token, failure).await
        }
        async fn complete(
            &self,
            spec: &'static HandlerSpec,
            key: &Key,
            token: &str,
            outcome: &str,
        ) -> Result<bool, StoreError> {
            self.inner.complete(spec, key, token, outcome).await
        }
        async fn complete_batch(
            &self,
            _spec: &'static HandlerSpec,
            _done: &[(Held<'_>, &str)],
        ) -> Result<Vec<bool>, StoreError> {
            Err(StoreError::Backend(
                "the batch completion is refused".into(),
            ))
        }
        async fn release(
            &self,
            spec: &'static HandlerSpec,
            key: &Key,
            token: &str,
        ) -> Result<(), StoreError> {
            self.inner.release(spec, key, token).await
        }
        async fn extend(
            &self,
            spec: &'static HandlerSpec,
            key: &Key,
            token: &str,
        ) -> Result<bool, StoreError> {
            self.inner.extend(spec, key, token).await
        }
    }

    #[derive(Debug, Clone)]
    struct Job {
        id: String,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("app")]
    struct AppError;

    #[idempotent(
        key = "id",
        ttl = "1h",
        lease = "1s",
        store = "memory",
        name = "settle_ratio"
    )]
    async fn ratio(msgs: &[Job]) -> Result<Vec<f64>, AppError> {
        Ok(msgs
            .iter()
            .map(|m| {
                if m.id.starts_with("nan") {
                    f64::NAN
                } else {
                    1.0
                }
            })
            .collect())
    }

    #[idempotent(
        key = "id",
        ttl = "1h",
        lease = "1s",
        store = "memory",
        name = "settle_short"
    )]
    async fn short(msgs: &[Job]) -> Result<Vec<u8>, AppError> {
        Ok(vec![1; msgs.len().saturating_sub(1)])
    }

    #[tokio::test]
    async fn an_unrecordable_key_is_settled_even_when_the_batch_completion_fails() {
        let store = Faulty::default();
        let batch = [Job { id: "ok-1".into() }, Job { id: "nan-1".into() }];
        let err = ratio(&store, &batch).await.unwrap_err();
        assert!(matches!(err, Error::NotRecorded { .. }), "{err:?}");
        let key = Key::from_parts(&[&"nan-1"]).unwrap();
        let record = store
            .inner
            .lookup("settle_ratio", key.as_str())
            .await
            .unwrap()
            .expect("the unrecordable key has a record");
        assert_eq!(record.status, Status::Failed, "{record:?}");
        assert!(record.unrecordable().is_some(), "{record:?}");
    }

    #[tokio::test]
    async fn a_failing_store_costs_a_batch_one_lease_not_one_a_key() {
        let store = Faulty::default();
        store.failing.store(1, Ordering::SeqCst);
        let batch: Vec<Job> = (0..16)
            .map(|i| Job {
                id: format!("s-{i}"),
            })
            .collect();
        let started = Instant::now();
        let err = short(&store, &batch).await.unwrap_err();
        assert!(matches!(err, Error::OutcomeCount { .. }), "{err:?}");
        // One lease (1 s) of tries for the first key, none for the others.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let tried = store.fails_tried.load(Ordering::SeqCst);
        assert!(tried < 16, "{tried} tries of `fail`");
    }
}
