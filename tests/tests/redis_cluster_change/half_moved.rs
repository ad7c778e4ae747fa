//! A batch whose keys sit in a slot half moved to another master.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_runtime::{Key, Outcome};
use idem_tests::{ClusterNode, RedisCluster, key_slot};

use super::{BATCH, Ledger, Msg, apply_batch, retryable};
use crate::common::RedisFx;

/// `n` slots that `node` serves, spread over its ranges.
pub(super) fn slots_of(node: &ClusterNode, n: usize) -> Vec<u16> {
    let all: Vec<u16> = node.slots.iter().flat_map(|&(a, b)| a..=b).collect();
    let step = (all.len() / n).max(1);
    all.into_iter().step_by(step).take(n).collect()
}

/// A batch holding two keys of one slot that is half moved: one key the
/// old master still has (its record, completed), one it has not (a fresh
/// message). The old master serves the first and answers `ASK` for the
/// second; each must run on the node that has (or, for a new key, takes)
/// its record, and nothing may be written on the importing node for a key
/// the old master still has (which would also make moving that key fail).
pub(super) async fn a_batch_across_a_slot_half_moved(fx: &RedisFx, cluster: &Mutex<RedisCluster>) {
    let ledger = Ledger::default();
    let (from, to) = {
        let c = cluster.lock().unwrap();
        let masters: Vec<ClusterNode> = c
            .topology()
            .expect("topology")
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .collect();
        (masters[0].clone(), masters[1].clone())
    };
    // Two ids whose batch records share a slot of `from`.
    let mut seen: HashMap<u16, String> = HashMap::new();
    let (old, new, slot) = (0..)
        .find_map(|i| {
            let id = format!("half-{i}");
            let key = Key::from_parts(&[&id.as_str()]).expect("a key");
            let slot = key_slot(fx.rkey(BATCH, &key).as_bytes());
            if !from.serves(slot) {
                return None;
            }
            seen.insert(slot, id.clone()).map(|first| (first, id, slot))
        })
        .expect("two ids in one slot");
    let rkey = |id: &str| fx.rkey(BATCH, &Key::from_parts(&[&id]).expect("a key"));
    let keyslot: u16 = fx
        .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(rkey(&old)))
        .await;
    assert_eq!(keyslot, slot, "key_slot computes the slot Redis does");
    assert_eq!(
        apply_batch(&fx.store, &[Msg::new(&old)], &ledger)
            .await
            .expect("the first batch")[0]
            .as_ref()
            .ok(),
        Some(&Outcome::Executed(1))
    );
    {
        let c = cluster.lock().unwrap();
        c.begin_migration(slot, &from, &to)
            .expect("begin the migration");
    }
    // Retried as a consumer would, for at most 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answers = Vec::new();
    let mut errors = Vec::new();
    let mut pending = vec![Msg::new(&old), Msg::new(&new)];
    while !pending.is_empty() && Instant::now() < deadline {
        let mut again = Vec::new();
        match apply_batch(&fx.store, &pending, &ledger).await {
            Ok(a) => {
                for (msg, r) in pending.iter().zip(a) {
                    match r {
                        Err(e) if retryable(&e) => {
                            errors.push(format!("{}: {e}", msg.id));
                            again.push(msg.clone());
                        }
                        r => answers.push((
                            msg.id.clone(),
                            format!("{:?}", r.map_err(|e| e.to_string())),
                        )),
                    }
                }
            }
            Err(e) if retryable(&e) => {
                errors.push(format!("batch: {e}"));
                again = pending.clone();
            }
            Err(e) => panic!("{e}"),
        }
        pending = again;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let on_importing = |id: &str| -> i64 {
        let mut conn = redis::Client::open(to.url())
            .and_then(|c| c.get_connection())
            .expect("a connection to the importing node");
        let _: () = redis::cmd("ASKING").query(&mut conn).expect("ASKING");
        redis::cmd("EXISTS")
            .arg(rkey(id))
            .query(&mut conn)
            .expect("EXISTS")
    };
    let stray = on_importing(&old);
    let placed = on_importing(&new);
    let moved = {
        let c = cluster.lock().unwrap();
        let moved = c.move_keys(slot, &from, &to, Duration::ZERO);
        // The slot ends on `to` either way, so the cluster is whole.
        if moved.is_err() {
            let _ = redis::Client::open(from.url())
                .and_then(|cl| cl.get_connection())
                .and_then(|mut conn| {
                    redis::cmd("MIGRATE")
                        .arg("127.0.0.1")
                        .arg(to.port)
                        .arg("")
                        .arg(0)
                        .arg(5000)
                        .arg("REPLACE")
                        .arg("KEYS")
                        .arg(rkey(&old))
                        .query::<String>(&mut conn)
                });
        }
        c.end_migration(slot, &from, &to)
            .expect("end the migration");
        moved
    };
    let runs = ledger.snapshot();
    let line = format!(
        "cluster change: a batch across slot {slot} half moved ({} -> {}): answers {answers:?}, \
         retryable errors {} (first: {:?}); on the importing node: {old} {stray}, {new} {placed}; \
         moving the slot's keys: {moved:?}; runs {:?}\n",
        from.port,
        to.port,
        errors.len(),
        errors.first(),
        runs.iter()
            .map(|(k, v)| (k.clone(), v.len()))
            .collect::<BTreeMap<_, _>>(),
    );
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    assert!(
        pending.is_empty(),
        "the batch never passed: {} errors, the first {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(
        stray, 0,
        "a claim of {old} was written on the importing node"
    );
    assert_eq!(placed, 1, "the new key's record is on the importing node");
    assert_eq!(moved, Ok(1), "moving {old}");
    answers.sort();
    let mut expected = vec![
        (old.clone(), "Ok(Duplicate(1))".to_owned()),
        (new.clone(), "Ok(Executed(1))".to_owned()),
    ];
    expected.sort();
    assert_eq!(answers, expected);
    for id in [&old, &new] {
        assert_eq!(
            runs.get(&format!("{BATCH}/{id}")).map(Vec::len),
            Some(1),
            "{id}"
        );
        let again = apply_batch(&fx.store, &[Msg::new(id)], &ledger)
            .await
            .expect("a batch");
        assert_eq!(again[0].as_ref().ok(), Some(&Outcome::Duplicate(1)), "{id}");
    }
}
