//! The scenario: publish, kill and restart members, drop their
//! connections, drain, and read the truth back; offsets in the broker or in
//! the handler's transaction.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem_tests::or_skip;
use sqlx::AssertSqlSafe;

use idem_runtime::consume::dead::{Selection, groups};
use idem_runtime::consume::kafka::dead::DeadLetters;
use idem_tests::brokers::kafka_brokers;

use super::{
    DEADLINE, Ends, Heard, KILLS, MEMBERS, MESSAGES, Member, PARTITIONS, POISON, PUBLISHED_TWICE,
    Rng, Run, SERIAL, SESSION_TIMEOUT, Seen, stop_all,
};

async fn chaos(offsets_in_db: bool) {
    let _serial = SERIAL.lock().await;
    let run = or_skip!(Run::open(offsets_in_db).await);
    let started = Instant::now();
    let mut rng = Rng::seeded();
    let seed = rng.0;
    let heard = Arc::new(Heard::default());
    let env = run.env();
    let mut members: Vec<Member> = (0..MEMBERS).map(|_| Member::start(&env, &heard)).collect();
    let mut kills = 0u32;
    // Kills of a member that held partitions.
    let mut kills_holding = 0u32;
    let mut terminated = 0i64;
    let mut produced = false;

    let produce = async {
        run.produce().await;
        produced = true;
    };
    let chaos = async {
        // Kill a member at random intervals and start another at once, and
        // now and then terminate the members' Postgres connections. Each
        // kill waits for the group to have handed out partitions since the
        // last one (tansu takes up to a session timeout), and takes a
        // member that holds some where one does: a kill lands on work.
        let mut assigned = heard.assignments.load(Ordering::SeqCst);
        while kills < KILLS {
            let wait = Instant::now() + SESSION_TIMEOUT + Duration::from_secs(2);
            while heard.assignments.load(Ordering::SeqCst) == assigned && Instant::now() < wait {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(300 + rng.below(1_700))).await;
            assert!(
                started.elapsed() < DEADLINE,
                "the run passed {DEADLINE:?} while killing members (seed {seed}, {kills} kills)"
            );
            let holding: Vec<usize> = (0..members.len())
                .filter(|i| members[*i].holds.load(Ordering::SeqCst) > 0)
                .collect();
            let among = if holding.is_empty() {
                (0..members.len()).collect()
            } else {
                holding
            };
            let pick = usize::try_from(rng.below(among.len() as u64)).unwrap_or(0);
            let victim = members.remove(among[pick]);
            if victim.holds.load(Ordering::SeqCst) > 0 {
                kills_holding += 1;
            }
            assigned = heard.assignments.load(Ordering::SeqCst);
            tokio::task::spawn_blocking(move || victim.kill())
                .await
                .expect("kill");
            kills += 1;
            let (env, heard) = (env.clone(), Arc::clone(&heard));
            let fresh = tokio::task::spawn_blocking(move || Member::start(&env, &heard))
                .await
                .expect("restart");
            members.push(fresh);
            // Until a connection was dropped, at every kill; then at half
            // of them, as the seed says.
            if terminated == 0 || rng.below(2) == 0 {
                terminated += run.terminate_backends().await;
            }
        }
    };
    tokio::join!(produce, chaos);
    assert!(produced);
    // Stop the members at once; each settles, commits and leaves.
    let mut reports = stop_all(members).await;
    let applied_in_chaos = run.applied().await;
    let chaos_took = started.elapsed();
    let assigned_in_chaos = heard.assignments.load(Ordering::SeqCst);
    // tansu 0.6 does not rebalance the group when a member's session
    // expires (only the member whose heartbeat finds it out rejoins, and an
    // expired member can come back), so a killed member's last partitions
    // can stay its own and the live members never hear of it. A fresh set
    // of members, once every killed member's session is over, takes them
    // all, and drains what is left.
    tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
    let fresh: Vec<Member> = (0..MEMBERS).map(|_| Member::start(&env, &heard)).collect();
    while !run.done().await && started.elapsed() < DEADLINE {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained = started.elapsed();
    reports.extend(stop_all(fresh).await);

    let rows: Vec<(i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT message_id, applied FROM {}",
        run.table
    )))
    .fetch_all(&run.admin)
    .await
    .expect("read the business table");
    let doubled = rows.iter().filter(|(_, n)| *n > 1).count();
    let ids: std::collections::BTreeSet<i64> = rows.iter().map(|(id, _)| *id).collect();
    let missing: Vec<i64> = (0..MESSAGES).filter(|id| !ids.contains(id)).collect();
    let lost = missing.len();
    let seen = Seen::read(&run.admin, &run.table).await;
    let ends = Ends::scan(run.all_topics()).await;
    let retries = ends.count(&run.retry_topics);
    let dead_lettered = ends.count(std::slice::from_ref(&run.dead_letter_topic));
    let produced: Vec<(i32, i64)> = run.produced.lock().unwrap().clone().into_iter().collect();
    let scanned: Vec<(i32, i64)> = (0..PARTITIONS)
        .map(|p| (p, ends.of(&run.topic, p)))
        .collect();
    let published = MESSAGES + PUBLISHED_TWICE;
    let delivered: u64 = reports
        .iter()
        .map(|r| r.acked + r.retried + r.dead_lettered)
        .sum();
    let alerts: u64 = reports.iter().map(|r| r.alerts).sum();
    let reported_duplicates: u64 = reports.iter().map(|r| r.duplicates).sum();
    let reported_rebalances: u64 = reports.iter().map(|r| r.rebalances).sum();
    // Calls beyond one per published copy and one per retry copy: messages
    // run again after a kill or a rebalance. The calls counted are a floor
    // (a member killed between a call and its count loses the count), so
    // this can come out a little below zero where nothing was run again.
    let redelivered = seen.calls - published - retries;
    let watermarks = run.kafka.ends(&run.topic).await;
    let behind_broker = run.behind(&ends, false).await;
    let behind_db = if offsets_in_db {
        run.behind(&ends, true).await
    } else {
        Vec::new()
    };
    let elapsed = started.elapsed();
    println!(
        "kafka chaos, offsets in the {} (seed {seed}), chaos for {chaos_took:.1?}, drained in {drained:.1?}, ended in {elapsed:.1?}: \
         published {published}, delivered {delivered} (graceful members' reports), calls {} (counted), \
         redelivered {redelivered}, duplicates {}, retries {retries}, dead-lettered {dead_lettered}, \
         rebalances {} (assignments taken), kills {kills} ({kills_holding} holding partitions), backends terminated {terminated}, \
         doubled {doubled}, lost {lost}",
        if offsets_in_db { "database" } else { "broker" },
        seen.calls,
        seen.duplicates,
        heard.assignments.load(Ordering::SeqCst),
    );
    println!(
        "kafka chaos: applied by the members under chaos {applied_in_chaos}, by the fresh ones {}; \
         assignments under chaos {assigned_in_chaos}; graceful members' duplicates {reported_duplicates}, assignments {reported_rebalances}, \
         alerts {alerts}; calls answered with a retry {}; \
         the topic's ends {scanned:?} (its high watermarks {watermarks:?}); \
         broker commits behind {behind_broker:?}; database offsets behind {behind_db:?}; members logged {:?}",
        ids.len() as i64 - applied_in_chaos,
        seen.retried,
        heard.warnings.lock().unwrap(),
    );
    if lost > 0 {
        // Where the first lost messages are, and what was committed there.
        for id in missing.iter().take(10) {
            println!(
                "kafka chaos: message {id} lost; its copies: {:?}",
                ends.copies.get(id)
            );
        }
        for t in run.consumed_topics() {
            println!(
                "kafka chaos: {t} committed {:?}",
                run.kafka.committed(&run.group, &t).await
            );
        }
    }
    assert!(
        drained < DEADLINE,
        "the run did not drain within {DEADLINE:?} (seed {seed}): applied {} of {MESSAGES}, behind (partition committed end): {:?}",
        ids.len(),
        if offsets_in_db {
            &behind_db
        } else {
            &behind_broker
        },
    );
    assert_eq!(
        scanned, produced,
        "the topic read back is not what was published"
    );
    assert_eq!(doubled, 0, "messages applied twice");
    assert_eq!(lost, 0, "messages never applied");
    // The poison messages: each dead-lettered, some maybe twice; one group
    // of POISON messages, whose replay runs each once and removes the copies.
    assert!(
        dead_lettered >= POISON,
        "{dead_lettered} dead letters of {POISON} poison messages"
    );
    let dead = DeadLetters::connect(&kafka_brokers(), &run.dead_letter_topic)
        .await
        .expect("the dead letters");
    let listed = dead.list(&Selection::new()).await.expect("listed");
    assert_eq!(listed.len() as i64, dead_lettered, "{listed:?}");
    let found = groups(&listed);
    assert_eq!(found.len(), 1, "one cause: {found:?}");
    assert_eq!(found[0].kind.as_deref(), Some("decode"), "{found:?}");
    assert_eq!(
        (found[0].messages as i64, found[0].dead_letters as i64),
        (POISON, dead_lettered),
        "{found:?}"
    );
    let done = dead
        .replay(&Selection::new().group(found[0].id.clone()))
        .await
        .expect("the group replayed");
    println!(
        "kafka chaos: {dead_lettered} dead letters of {POISON} poison messages; the group's replay ran {} and removed {} copies",
        done.count(),
        done.copies.len()
    );
    assert_eq!(done.count() as i64, POISON, "{done:?}");
    assert_eq!(done.copies.len() as i64, dead_lettered - POISON, "{done:?}");
    if offsets_in_db {
        // The offsets that count are the database's; the broker's are a
        // copy, committed after them, and stay behind where a member died
        // between the two and no member took a message of that partition
        // since (printed above).
        assert!(
            behind_db.is_empty(),
            "the offsets in the database are not at the partitions' ends: {behind_db:?}"
        );
    } else {
        assert!(
            behind_broker.is_empty(),
            "the group's committed offsets are not at the partitions' ends: {behind_broker:?}"
        );
    }
    assert!(
        elapsed < DEADLINE,
        "the run took {elapsed:?}, over {DEADLINE:?}"
    );
    assert!(terminated > 0, "no Postgres connection was terminated");
    assert!(
        kills_holding * 2 >= KILLS,
        "fewer than half the kills took a member holding partitions: the group did not rebalance under the kills"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_kafka_with_members_killed_and_connections_dropped() {
    chaos(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_kafka_with_offsets_in_the_handlers_transaction() {
    chaos(true).await;
}
