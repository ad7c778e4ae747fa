use idem_runtime::registry::{HandlerSpec, Mode};
use idem_runtime::{BatchItem, Claim, Held, Key, LeaseStore, PgStore, TxBatchCommit, TxStore};
use std::time::{Duration, Instant};

static SPEC: HandlerSpec = HandlerSpec {
    name: "scratch_pgbatch",
    function: "f",
    key: "id",
    ttl: Duration::from_secs(3600),
    lease: Duration::from_secs(30),
    store: "postgres",
    mode: Mode::Transaction,
    module: "m",
    file: "f.rs",
    line: 1,
    fingerprint: None,
    max_attempts: None,
};

#[tokio::main]
async fn main() {
    let store = PgStore::connect("postgres://postgres@127.0.0.1/test")
        .await
        .unwrap()
        .with_table("scratch_pgbatch")
        .unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    sqlx::query("DROP TABLE IF EXISTS scratch_raw")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE scratch_raw (handler TEXT, key TEXT, PRIMARY KEY (handler, key))")
        .execute(&pool)
        .await
        .unwrap();
    let mut next = 0u64;
    let (mut raw, mut tx, mut lease) = (vec![], vec![], vec![]);
    for round in 0..12 {
        for v in 0..3 {
            let v = (v + round) % 3;
            let keys: Vec<String> = (0..1000).map(|i| format!("k{}", next + i)).collect();
            next += 1000;
            let t = Instant::now();
            let n = 20;
            for _ in 0..n {
                let keys: Vec<String> = (0..1000).map(|i| format!("k{}", next + i)).collect();
                next += 1000;
                match v {
                    0 => {
                        sqlx::query("INSERT INTO scratch_raw (handler, key) SELECT 'h', k FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING").bind(&keys).execute(&pool).await.unwrap();
                    }
                    1 => {
                        let ks: Vec<Key> = keys
                            .iter()
                            .map(|k| Key::from_parts(&[k]).unwrap())
                            .collect();
                        let items: Vec<BatchItem<'_>> = ks
                            .iter()
                            .map(|key| BatchItem {
                                key,
                                fingerprint: None,
                            })
                            .collect();
                        let found = store.begin_batch(&SPEC, &items).await.unwrap();
                        let outcomes = vec![Some("null"); items.len()];
                        assert_eq!(
                            store
                                .commit_batch(found.tx, &SPEC, &items, &outcomes)
                                .await
                                .unwrap(),
                            TxBatchCommit::Committed
                        );
                    }
                    _ => {
                        let ks: Vec<Key> = keys
                            .iter()
                            .map(|k| Key::from_parts(&[k]).unwrap())
                            .collect();
                        let items: Vec<BatchItem<'_>> = ks
                            .iter()
                            .map(|key| BatchItem {
                                key,
                                fingerprint: None,
                            })
                            .collect();
                        let claims = store.claim_batch(&SPEC, &items).await.unwrap();
                        let held: Vec<(Held<'_>, &str)> = items
                            .iter()
                            .zip(&claims)
                            .map(|(i, c)| {
                                let Claim::Acquired { token } = c else {
                                    panic!()
                                };
                                (Held { key: i.key, token }, "null")
                            })
                            .collect();
                        store.complete_batch(&SPEC, &held).await.unwrap();
                    }
                }
            }
            let kps = (n * 1000) as f64 / t.elapsed().as_secs_f64();
            [&mut raw, &mut tx, &mut lease][v].push(kps);
            let _ = keys;
        }
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (r, t, l) = (med(raw), med(tx), med(lease));
    println!(
        "raw {r:.0} tx {t:.0} ({:.3}) lease {l:.0} ({:.3})",
        t / r,
        l / r
    );
    sqlx::query("DROP TABLE scratch_raw")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DROP TABLE scratch_pgbatch")
        .execute(&pool)
        .await
        .unwrap();
}
