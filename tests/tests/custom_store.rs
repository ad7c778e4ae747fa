//! The store boundary is open: a store written outside idem runs handlers
//! through the public traits, named by its path (`store = "crate::custom_store::Ledger"`),
//! and a lease-mode handler runs on any lease store, whatever store its
//! attribute names.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{
    Claim, Failure, LeaseStore, Standing, StoreTransaction, TxClaim, TxCommit, TxStore,
};
use idem_runtime::{Error, Key, MemoryStore, Outcome, StoreError, idempotent};

// ---------------------------------------------------------------------------
// A transaction-mode store of the application's own: an in-process ledger
// whose transaction buffers credits and applies them with the outcome, or
// drops them.

#[derive(Default)]
struct LedgerState {
    balances: HashMap<String, i64>,
    /// (handler, key) -> what stands: an outcome or a final error.
    records: HashMap<(String, String), Standing>,
    /// (handler, key) -> failures counted, and the last one's text.
    failures: HashMap<(String, String), (u32, String)>,
    /// Claims whose transaction is open.
    open: HashSet<(String, String)>,
}

/// The store.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<LedgerState>>);

impl Ledger {
    fn state(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn balance(&self, account: &str) -> i64 {
        self.state().balances.get(account).copied().unwrap_or(0)
    }
}

/// Its transaction: the credits a body made, applied at commit.
struct LedgerTx {
    credits: Vec<(String, i64)>,
}

impl LedgerTx {
    fn credit(&mut self, account: &str, amount: i64) {
        self.credits.push((account.to_owned(), amount));
    }
}

impl StoreTransaction for LedgerTx {}

impl TxStore for Ledger {
    type Tx = LedgerTx;

    fn store_name(&self) -> &'static str {
        "ledger"
    }

    async fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        _fingerprint: Option<&str>,
    ) -> Result<TxClaim<LedgerTx>, StoreError> {
        let id = (spec.name.to_owned(), key.as_str().to_owned());
        let mut state = self.state();
        if let Some(standing) = state.records.get(&id) {
            return Ok(TxClaim::Refused(standing.clone()));
        }
        if let (Some(max), Some((failures, last))) = (spec.max_attempts, state.failures.get(&id))
            && *failures >= max
        {
            return Ok(TxClaim::Refused(Standing::Exhausted {
                failures: *failures,
                last_error: Some(last.clone()),
            }));
        }
        if !state.open.insert(id) {
            return Ok(TxClaim::Refused(Standing::InProgress {
                retry_after: Duration::from_millis(10),
            }));
        }
        Ok(TxClaim::Fresh(LedgerTx {
            credits: Vec::new(),
        }))
    }

    async fn commit_outcome(
        &self,
        tx: LedgerTx,
        spec: &'static HandlerSpec,
        key: &Key,
        _fingerprint: Option<&str>,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        let id = (spec.name.to_owned(), key.as_str().to_owned());
        let mut state = self.state();
        for (account, amount) in tx.credits {
            *state.balances.entry(account).or_default() += amount;
        }
        state.open.remove(&id);
        let outcome = outcome.to_owned();
        state.records.insert(
            id,
            Standing::Completed {
                outcome,
                trace: idem_runtime::store::settling_trace(),
            },
        );
        Ok(TxCommit::Committed)
    }

    async fn commit_failure(
        &self,
        _tx: LedgerTx,
        spec: &'static HandlerSpec,
        key: &Key,
        _fingerprint: Option<&str>,
        failure: Failure<'_>,
    ) -> Result<TxCommit, StoreError> {
        // The credits are dropped; the failure is recorded in their place.
        let id = (spec.name.to_owned(), key.as_str().to_owned());
        let mut state = self.state();
        state.open.remove(&id);
        let count = state.failures.entry(id.clone()).or_default();
        count.0 += 1;
        count.1 = failure.text().to_owned();
        if let Failure::Final { encoded, .. } = failure {
            let error = encoded.to_owned();
            state.records.insert(
                id,
                Standing::Failed {
                    error,
                    trace: idem_runtime::store::settling_trace(),
                },
            );
        }
        Ok(TxCommit::Committed)
    }

    async fn rollback(
        &self,
        _tx: LedgerTx,
        spec: &'static HandlerSpec,
        key: &Key,
        _fingerprint: Option<&str>,
    ) -> Result<Option<Standing>, StoreError> {
        let id = (spec.name.to_owned(), key.as_str().to_owned());
        self.state().open.remove(&id);
        Ok(None)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

struct Payment {
    payment_id: u64,
    account: String,
    amount: i64,
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "payment_id", ttl = "1h", store = "crate::custom_store::Ledger")]
async fn credit(tx: &mut LedgerTx, msg: &Payment) -> Result<i64, Refused> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    if msg.amount <= 0 {
        return Err(Refused(format!("amount {} is not a credit", msg.amount)));
    }
    tx.credit(&msg.account, msg.amount);
    Ok(msg.amount)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_applications_own_runs_transaction_mode() {
    let ledger = Ledger::default();
    let pay = Payment {
        payment_id: 1,
        account: "alice".into(),
        amount: 30,
    };
    assert_eq!(credit(&ledger, &pay).await.unwrap(), Outcome::Executed(30));
    assert_eq!(credit(&ledger, &pay).await.unwrap(), Outcome::Duplicate(30));
    assert_eq!(ledger.balance("alice"), 30);

    // A failed body leaves nothing: no credit, no record; a redelivery runs.
    let bad = Payment {
        payment_id: 2,
        account: "alice".into(),
        amount: -5,
    };
    let err = credit(&ledger, &bad).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Handler {
                handler: "credit",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ledger.balance("alice"), 30);
    assert!(ledger.state().records.len() == 1 && ledger.state().open.is_empty());

    // Concurrent deliveries of one payment: one credit, the others are
    // duplicates or in progress (to be redelivered), never a second credit.
    let runs_before = BODY_RUNS.load(Ordering::SeqCst);
    let third = Arc::new(Payment {
        payment_id: 3,
        account: "bob".into(),
        amount: 7,
    });
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (ledger, msg) = (ledger.clone(), Arc::clone(&third));
            tokio::spawn(async move { credit(&ledger, &msg).await })
        })
        .collect();
    let mut executed = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(Outcome::Executed(7)) => executed += 1,
            Ok(Outcome::Duplicate(7)) | Err(Error::InProgress { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(BODY_RUNS.load(Ordering::SeqCst) - runs_before, 1);
    assert_eq!(ledger.balance("bob"), 7);
}

// ---------------------------------------------------------------------------
// A lease store of the application's own, named by its path, and a
// lease-mode handler declared for one store and run on another.

/// A lease store that counts claims and keeps records in a [`MemoryStore`].
#[derive(Clone, Default)]
struct Counted {
    inner: MemoryStore,
    claims: Arc<AtomicUsize>,
}

impl LeaseStore for Counted {
    fn store_name(&self) -> &'static str {
        "counted"
    }
    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(spec, key, fingerprint).await
    }
    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
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

struct Shipped {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "1h", store = "crate::custom_store::Counted")]
async fn notify(msg: &Shipped) -> Result<String, Refused> {
    Ok(format!("order {} shipped", msg.order_id))
}

#[idempotent(key = "order_id", ttl = "1h", store = "redis")]
async fn notify_redis(msg: &Shipped) -> Result<u64, Refused> {
    Ok(msg.order_id * 2)
}

#[tokio::test]
async fn a_lease_store_of_the_applications_own_runs_lease_mode() {
    let store = Counted::default();
    let msg = Shipped { order_id: 9 };
    let first = notify(&store, &msg).await.unwrap();
    assert_eq!(first, Outcome::Executed("order 9 shipped".to_owned()));
    assert!(notify(&store, &msg).await.unwrap().is_duplicate());
    assert_eq!(store.claims.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_redis_handler_runs_on_the_memory_store() {
    // What a unit test of a `store = "redis"` handler does: no server.
    let store = MemoryStore::new();
    let msg = Shipped { order_id: 21 };
    assert_eq!(
        notify_redis(&store, &msg).await.unwrap(),
        Outcome::Executed(42)
    );
    assert_eq!(
        notify_redis(&store, &msg).await.unwrap(),
        Outcome::Duplicate(42)
    );
    let key = Key::from_parts(&[&21u64]).unwrap();
    let record = store
        .record("notify_redis", &key)
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(record.outcome.as_deref(), Some("42"));

    // A shared store is a store.
    let shared = Arc::new(store);
    assert_eq!(
        notify_redis(&shared, &msg).await.unwrap(),
        Outcome::Duplicate(42)
    );
}
