//! The lease heartbeat runs as a task of its own: a body that blocks its
//! thread (a synchronous client, heavy work) keeps its lease on a
//! multi-threaded runtime, and a second consumer is told it is in progress.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(serde::Deserialize)]
struct Job {
    id: u32,
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "300ms",
    name = "hb_blocking"
)]
async fn blocking(msg: &Job) -> Result<u32, std::io::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    // Blocks this worker thread for four lease periods without yielding.
    std::thread::sleep(Duration::from_millis(1_200));
    Ok(msg.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_body_that_blocks_its_thread_keeps_its_lease() {
    let store = MemoryStore::new();
    let first = {
        let store = store.clone();
        tokio::spawn(async move { blocking(&store, &Job { id: 1 }).await })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    match blocking(&store, &Job { id: 1 }).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(300))
        }
        other => panic!("the second consumer should be told to wait, got {other:?}"),
    }
    assert_eq!(
        first.await.expect("task").expect("first"),
        Outcome::Executed(1)
    );
    assert_eq!(
        blocking(&store, &Job { id: 1 }).await.expect("after"),
        Outcome::Duplicate(1)
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
}
