//! Lease mode on Redis Cluster: a cluster of three masters that this test
//! starts on free loopback ports (and kills afterwards, also on failure)
//! runs the behaviour suite of `common/redis.rs`, then shows where records
//! live: each in the slot of its hash tag, different keys on different
//! nodes.
//!
//! One `#[test]` on purpose: it owns the cluster, so no process outlives
//! the run; the scenarios run one after the other, each under a key prefix
//! of its own.

mod common;
#[path = "common/redis.rs"]
mod suite;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::Probe;
use idem_runtime::Outcome;
use idem_tests::RedisCluster;
use suite::{Fx, JOB, Job, job};

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

    macro_rules! run {
        ($($scenario:path),* $(,)?) => {
            rt.block_on(async {
                $(
                    let fx = Fx::cluster(&urls, "rc").await;
                    let t = Instant::now();
                    $scenario(&fx).await;
                    eprintln!("cluster: {} ok in {:?}", stringify!($scenario), t.elapsed());
                )*
            })
        };
    }
    run!(
        suite::first_delivery_executes_and_records_completed,
        suite::duplicate_returns_recorded_outcome_without_running_the_body,
        suite::body_error_releases_the_claim_and_the_retry_executes,
        suite::concurrent_deliveries_of_one_message_execute_exactly_once,
        suite::deliveries_while_the_body_runs_are_in_progress_then_duplicates,
        suite::concurrent_distinct_messages_each_execute_exactly_once,
        suite::storm_of_concurrent_duplicates_executes_each_message_once,
        suite::in_progress_reports_what_is_left_of_the_lease,
        suite::after_the_ttl_the_key_runs_again,
        suite::none_key_part_is_key_missing_and_the_body_does_not_run,
        suite::stored_outcome_that_no_longer_decodes_is_a_codec_error,
        suite::body_reads_its_own_key,
        suite::stalled_body_loses_its_lease_and_its_completion_is_lease_lost,
        suite::stale_failure_after_a_takeover_does_not_release_the_new_claim,
        suite::a_late_completion_nobody_overtook_is_recorded,
        suite::heartbeat_keeps_a_long_body_s_lease_alive,
        a_record_lives_in_the_slot_of_its_hash_tag,
        records_of_different_keys_spread_over_the_nodes,
    );
    drop(rt);
    drop(cluster);
    eprintln!("cluster test done in {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// `CLUSTER KEYSLOT` of a record's key is the slot of its hash tag
/// `{<len>:<handler>|<key>}` alone, whatever the prefix; the node that
/// serves that slot holds the record, and every other node redirects to it
/// (`MOVED <slot> <owner>`).
async fn a_record_lives_in_the_slot_of_its_hash_tag(fx: &Fx) {
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
async fn records_of_different_keys_spread_over_the_nodes(fx: &Fx) {
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
