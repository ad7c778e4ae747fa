//! Running calls at the same moment, tallying how they came out, and waiting
//! for a condition.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Error, Outcome};
use tokio::sync::Barrier;

/// How a batch of concurrent calls came out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) executed: usize,
    pub(crate) duplicate: usize,
    pub(crate) in_progress: usize,
    /// Anything else, printed.
    pub(crate) other: Vec<String>,
}

impl Tally {
    pub(crate) fn of<T: Debug, E: Debug>(
        results: impl IntoIterator<Item = Result<Outcome<T>, Error<E>>>,
    ) -> Tally {
        let mut t = Tally::default();
        for r in results {
            match r {
                Ok(Outcome::Executed(_)) => t.executed += 1,
                Ok(Outcome::Duplicate(_)) => t.duplicate += 1,
                Err(Error::InProgress { .. }) => t.in_progress += 1,
                other => t.other.push(format!("{other:?}")),
            }
        }
        t
    }

    pub(crate) fn total(&self) -> usize {
        self.executed + self.duplicate + self.in_progress + self.other.len()
    }

    /// Lease mode: `executed` calls ran, the `rest` found the key completed
    /// or in progress, and nothing else happened.
    pub(crate) fn assert_leased(&self, executed: usize, rest: usize) {
        assert_eq!(self.executed, executed, "{self:?}");
        assert_eq!(self.duplicate + self.in_progress, rest, "{self:?}");
        assert!(self.other.is_empty(), "{self:?}");
    }
}

/// Spawns `n` tasks that all wait on one barrier and then run `f(i)`, so the
/// calls start at the same moment; returns their results in task order.
pub(crate) async fn together<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let call = f(i);
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task panicked"));
    }
    out
}

/// Polls `cond` every 5 ms until it holds, failing after `within`.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
