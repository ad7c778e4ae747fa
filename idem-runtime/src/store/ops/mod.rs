//! What an operator asks a store, apart from any handler: the [`Inspect`]
//! trait (look a record up, list a handler's records, count them, forget a
//! key, sweep, name the handlers, the table's schema version), the types it
//! answers with.
//!
//! Every store of this crate implements [`Inspect`]: the SQL stores
//! (written once for the three databases, in `store/sql/inspect.rs`), Redis
//! and the memory store. The `idem` command-line tool (crate `idem-cli`) is
//! built on it.
//!
//! Keys are given and returned in their stored form
//! ([`Key::as_str`](crate::Key::as_str)): build one from its parts with
//! [`Key::from_parts`](crate::Key::from_parts), exactly as a handler derives
//! it, or check a stored key someone pasted with
//! [`StoredKey::parse`](crate::store::StoredKey::parse).
//!
//! # Examples
//!
//! ```
//! # use idem_runtime::registry::{HandlerSpec, Mode};
//! # use std::time::Duration;
//! # static SPEC: HandlerSpec = HandlerSpec {
//! #     name: "notify", function: "notify", key: "message_id",
//! #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
//! #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
//! #     fingerprint: None, max_attempts: None,
//! # };
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::store::ops::{Forgot, Inspect, Query, Status};
//! use idem_runtime::store::LeaseStore;
//! use idem_runtime::{Key, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let key = Key::from_parts(&[&"m-1"])?;
//! let claim = store.claim(&SPEC, &key, None).await?;
//! # let idem_runtime::store::Claim::Fresh { token } = claim else { panic!() };
//! # store.complete(&SPEC, &key, &token, "42").await?;
//!
//! let record = Inspect::lookup(&store, "notify", key.as_str()).await?.unwrap();
//! assert_eq!(record.status, Status::Completed);
//! assert_eq!(store.list("notify", Query::new()).await?.len(), 1);
//! assert_eq!(store.stats().await?.handlers[0].completed, 1);
//!
//! // let the message run again
//! assert!(matches!(store.forget("notify", key.as_str(), false).await?, Forgot::Deleted(_)));
//! # Ok(()) }
//! ```

mod answers;
mod inspect;
mod query;
mod record;

pub use answers::{Forgot, HandlerStats, Schema, Stats, Swept};
pub use inspect::Inspect;
#[cfg(feature = "_sql")]
pub(crate) use inspect::sweep_all;
pub use query::{DEFAULT_LIMIT, Filter, Order, Query};
pub use record::{Record, Status};
pub(crate) use record::{unrecordable_encoding, unrecordable_reason};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn record(key: &str, status: Status, created: i64, expires: i64) -> Record {
        Record::new("h", key, status, created, expires)
    }

    #[test]
    fn queries_filter_sort_and_cut() {
        let records = vec![
            record("1:c", Status::Completed, 3, 100),
            record("1:a", Status::InProgress, 1, 5),
            record("1:b", Status::Retry, 2, 100),
            record("1:d", Status::InProgress, 2, 100),
        ];
        let keys = |q: Query| -> Vec<String> {
            q.apply(records.clone(), 10)
                .into_iter()
                .map(|r| r.key)
                .collect()
        };
        assert_eq!(keys(Query::new()), ["1:a", "1:b", "1:d", "1:c"]);
        assert_eq!(
            keys(Query::new().order(Order::NewestFirst).limit(2)),
            ["1:c", "1:d"]
        );
        assert_eq!(keys(Query::new().filter(Filter::Stuck)), ["1:a"]);
        assert_eq!(keys(Query::new().filter(Filter::Failed)), ["1:b"]);
        assert!(keys(Query::new().filter(Filter::Exhausted)).is_empty());
        // 1:b out of attempts, by the limit it recorded.
        let mut records = records.clone();
        records[2].failures = 2;
        records[2].max_attempts = Some(2);
        let exhausted: Vec<String> = Query::new()
            .filter(Filter::Exhausted)
            .apply(records, 10)
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(exhausted, ["1:b"]);
        assert_eq!(
            keys(Query::new().filter(Filter::Status(Status::InProgress))),
            ["1:a", "1:d"]
        );
        assert!(keys(Query::new().limit(0)).is_empty());
    }

    static SPEC: crate::registry::HandlerSpec = crate::registry::HandlerSpec {
        name: "notify",
        function: "notify",
        key: "id",
        ttl: std::time::Duration::from_secs(3_600),
        lease: std::time::Duration::from_secs(30),
        store: "memory",
        mode: crate::registry::Mode::Lease,
        module: "app",
        file: "app.rs",
        line: 1,
        fingerprint: None,
        max_attempts: Some(2),
    };

    #[tokio::test]
    async fn the_memory_store_is_inspected_as_the_others() {
        use crate::clock::{Clock as _, ManualClock};
        use crate::store::contract::{Claim, Failure, LeaseStore};
        use crate::store::memory::MemoryStore;

        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let k = |id: &str| Key::from_parts(&[&id]).unwrap();
        let Claim::Fresh { token } = store.claim(&SPEC, &k("a"), None).await.unwrap() else {
            panic!()
        };
        let Claim::Fresh { token: b } = store.claim(&SPEC, &k("b"), None).await.unwrap() else {
            panic!()
        };
        let failure = Failure::Counted { error: "timeout" };
        store.fail(&SPEC, &k("b"), &b, failure).await.unwrap();

        assert!(matches!(
            store.forget("notify", k("a").as_str(), false).await.unwrap(),
            Forgot::Refused(r) if r.token.as_deref() == Some(token.as_str())
        ));
        let failed = store
            .list("notify", Query::new().filter(Filter::Failed))
            .await
            .unwrap();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].key, k("b").as_str());
        assert_eq!(failed[0].max_attempts, Some(2));
        // One failure of two: not yet exhausted. A second one exhausts it.
        let exhausted = Query::new().filter(Filter::Exhausted);
        assert!(store.list("notify", exhausted).await.unwrap().is_empty());
        let Claim::Fresh { token: b } = store.claim(&SPEC, &k("b"), None).await.unwrap() else {
            panic!()
        };
        store.fail(&SPEC, &k("b"), &b, failure).await.unwrap();
        let listed = store.list("notify", exhausted).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].is_exhausted(clock.now_millis()));
        clock.advance(SPEC.lease);
        let stats = store.stats().await.unwrap();
        let h = stats.handler("notify").unwrap();
        assert_eq!((h.records, h.in_progress, h.retry, h.expired), (2, 1, 1, 1));
        assert_eq!(h.oldest_in_progress_at_ms, Some(1_000_000));
        assert_eq!(
            store
                .list("notify", Query::new().filter(Filter::Stuck))
                .await
                .unwrap()[0]
                .key,
            k("a").as_str()
        );
        // Its lease ran out: no longer live, so forgotten without force.
        assert!(matches!(
            store
                .forget("notify", k("a").as_str(), false)
                .await
                .unwrap(),
            Forgot::Deleted(_)
        ));
        assert_eq!(store.handlers().await.unwrap(), ["notify"]);
        assert_eq!(Inspect::sweep(&store).await.unwrap(), Swept::deleted(0));
        clock.advance(SPEC.ttl);
        assert_eq!(Inspect::sweep(&store).await.unwrap(), Swept::deleted(1));
        assert!(store.handlers().await.unwrap().is_empty());
    }
}
