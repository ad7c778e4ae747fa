//! Lease mode on Redis Cluster: a cluster of three masters that this test
//! starts on free loopback ports (and kills afterwards, also on failure)
//! runs the lease suite (`common/lease.rs`), then shows where records live:
//! each in the slot of its hash tag, different keys on different nodes.
//!
//! One `#[test]` on purpose: it owns the cluster, so no process outlives
//! the run; the scenarios run one after the other, each under a key prefix
//! of its own.

use crate::common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::lease::{self, JOB, Job, job};
use common::{Probe, RedisFx};
use idem_runtime::Outcome;
use idem_tests::RedisCluster;

/// Runs each scenario on a fixture of its own on the cluster of `$urls`.
macro_rules! in_sequence {
    ($urls:ident; $($scenario:ident: $time:ident,)*) => {
        $( run(&$urls, stringify!($scenario), lease::$scenario).await; )*
    };
}

/// Runs each store-level scenario on a fixture of its own on the cluster.
macro_rules! store_in_sequence {
    ($urls:ident; $($scenario:ident,)*) => {
        $(
            run(&$urls, stringify!($scenario), |fx: Arc<RedisFx>| async move {
                common::redis_store::$scenario(&fx).await
            })
            .await;
        )*
    };
}

/// Runs `scenario` on a fresh fixture (key prefix) on the cluster.
async fn run<Fut: Future<Output = ()>>(
    urls: &[String],
    name: &str,
    scenario: impl FnOnce(Arc<RedisFx>) -> Fut,
) {
    let fx = Arc::new(RedisFx::cluster(urls, "rc").await);
    let t = Instant::now();
    scenario(fx).await;
    eprintln!("cluster: {name} ok in {:?}", t.elapsed());
}

#[test]
fn lease_suite_on_a_three_master_cluster() {
    let started = Instant::now();
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    eprintln!("cluster of 3 masters up in {:?}", started.elapsed());
    let urls = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");

    rt.block_on(async {
        lease::scenarios!(in_sequence! { urls; });
        common::redis_store::redis_store_scenarios!(store_in_sequence! { urls; });
        run(
            &urls,
            "a_record_lives_in_the_slot_of_its_hash_tag",
            a_record_lives_in_the_slot_of_its_hash_tag,
        )
        .await;
        run(
            &urls,
            "records_of_different_keys_spread_over_the_nodes",
            records_of_different_keys_spread_over_the_nodes,
        )
        .await;
    });
    drop(rt);
    drop(cluster);
    eprintln!("cluster test done in {:?}", started.elapsed());
    // One after the other, the scenarios take about 21 s here, 8 of them
    // the two that wait out a dropped call's lease in real time: a bound
    // that keeps the one test of a whole cluster from growing unnoticed.
    assert!(
        started.elapsed() < Duration::from_secs(35),
        "{:?}",
        started.elapsed()
    );
}

/// `CLUSTER KEYSLOT` of a record's key is the slot of its hash tag
/// `{<len>:<handler>|<key>}` alone, whatever the prefix; the node that
/// serves that slot holds the record, and every other node redirects to it
/// (`MOVED <slot> <owner>`).
async fn a_record_lives_in_the_slot_of_its_hash_tag(fx: Arc<RedisFx>) {
    let fx = &*fx;
    let probe = Probe::new();
    let msg = Job::new("slot-1", 1);
    assert_eq!(
        job(&fx.store, &msg, &probe, fx).await.unwrap(),
        Outcome::Executed(1)
    );
    let rkey = fx.rkey(JOB, &msg.key());
    let open = rkey.find('{').unwrap();
    let close = open + rkey[open..].find('}').unwrap();
    let tag = &rkey[open + 1..close];
    assert_eq!(tag, format!("{}:{JOB}|{}", JOB.len(), msg.key().as_str()));

    let keyslot = |k: String| async move {
        let slot: u16 = fx.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(k)).await;
        slot
    };
    let slot = keyslot(rkey.clone()).await;
    assert_eq!(keyslot(tag.to_owned()).await, slot);
    assert_eq!(keyslot(format!("another-prefix:{{{tag}}}")).await, slot);

    let mut owners = Vec::new();
    let mut redirects = Vec::new();
    for url in fx.nodes() {
        let exists: redis::RedisResult<i64> =
            fx.on_node(url, redis::cmd("EXISTS").arg(&rkey)).await;
        match exists {
            Ok(1) => owners.push(url.clone()),
            Ok(n) => panic!("{url} serves slot {slot} but has no {rkey} ({n})"),
            Err(e) => {
                let (addr, moved_slot) = e.redirect_node().unwrap_or_else(|| panic!("{url}: {e}"));
                assert_eq!(moved_slot, slot, "{url} redirects {rkey} to another slot");
                redirects.push(format!("redis://{addr}"));
            }
        }
    }
    assert_eq!(owners.len(), 1, "{rkey} lives on {owners:?}");
    assert_eq!(redirects.len(), fx.nodes().len() - 1);
    assert!(
        redirects.iter().all(|r| *r == owners[0]),
        "{redirects:?} vs {owners:?}"
    );
    let in_slot: Vec<String> = fx
        .on_node(
            &owners[0],
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100),
        )
        .await
        .unwrap();
    assert!(in_slot.contains(&rkey), "{in_slot:?}");
    eprintln!("cluster: {rkey} in slot {slot} on {}", owners[0]);
}

/// Thirty messages' records, found by scanning each node on its own: each
/// record is on exactly one node, the one serving its slot, and the records
/// spread over more than one node (the hash tags differ by key).
async fn records_of_different_keys_spread_over_the_nodes(fx: Arc<RedisFx>) {
    let fx = &*fx;
    const MESSAGES: usize = 30;
    let probe = Probe::new();
    for m in 0..MESSAGES {
        let msg = Job::new(&format!("spread-{m}"), 1);
        assert!(
            job(&fx.store, &msg, &probe, fx)
                .await
                .unwrap()
                .is_executed()
        );
    }
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = Vec::new();
    for (url, key) in fx.keys_by_node().await {
        // The effect counters (no hash tag) live under the prefix too.
        if !key.contains('{') {
            continue;
        }
        // A key outside the node's slots would answer MOVED here.
        let served: redis::RedisResult<i64> =
            fx.on_node(&url, redis::cmd("EXISTS").arg(&key)).await;
        assert_eq!(
            served.ok(),
            Some(1),
            "{url} holds {key} but does not serve its slot"
        );
        *by_node.entry(url).or_default() += 1;
        found.push(key);
    }
    found.sort();
    let mut expected: Vec<String> = (0..MESSAGES)
        .map(|m| fx.rkey(JOB, &Job::new(&format!("spread-{m}"), 0).key()))
        .collect();
    expected.sort();
    assert_eq!(found, expected, "each record on exactly one node");
    eprintln!("cluster: {MESSAGES} records by node: {by_node:?}");
    assert!(by_node.len() > 1, "all records on one node: {by_node:?}");
}
