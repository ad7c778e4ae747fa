//! Changing records: `forget`, `sweep`, and the table's `schema`.

use std::time::Duration;

use idem_runtime::store::Inspect;
use serde_json::{Value, json};

use super::{on, orders, populate};
use crate::common::fixtures::StoreFx;
use crate::common::{
    ORDERS, ORDERS_SPEC, SHORT_SPEC, claim, claimable_afresh, complete, idem, key,
};

pub(crate) async fn forget_refuses_a_live_claim_unless_forced_and_the_key_runs_again<F: StoreFx>(
    fx: &F,
) {
    populate(fx).await;
    let store = fx.store();

    // A live claim is refused, and left as it was.
    let line = on(fx, &["forget", ORDERS, "L-1", "apple"]).fails(4);
    let live = Inspect::lookup(store, ORDERS, key("L-1", "apple").as_str())
        .await
        .unwrap()
        .expect("the claim stands");
    let token = live.token.clone().unwrap();
    assert!(
        line.contains("key L-1 + apple of `cli_orders` is held by a live claim")
            && line.contains(&token)
            && line.contains("pass --force"),
        "{line}"
    );
    // Forced, it goes, and the key can be claimed again.
    let text = on(fx, &["forget", ORDERS, "L-1", "apple", "--force"])
        .ok()
        .stdout;
    assert!(
        text.starts_with(
            "forgot key L-1 + apple of `cli_orders` (it was in_progress, 1 attempt, 0 failures)"
        ),
        "{text}"
    );
    let k = key("L-1", "apple");
    assert_eq!(
        Inspect::lookup(store, ORDERS, k.as_str()).await.unwrap(),
        None
    );
    claimable_afresh(store, &ORDERS_SPEC, &k).await;

    // A key out of attempts runs again once forgotten, as a first delivery.
    let k = key("X-1", "apple");
    let forgot = on(fx, &["--json", "forget", ORDERS, "X-1", "apple"]).json();
    assert_eq!(forgot["result"], "deleted");
    assert_eq!(forgot["record"]["status"], "retry");
    assert_eq!(forgot["record"]["failures"], 3);
    let token = claim(store, &ORDERS_SPEC, &k, None).await;
    let record = Inspect::lookup(store, ORDERS, k.as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.attempts, record.failures), (1, 0));
    assert_eq!(record.token.as_deref(), Some(token.as_str()));

    // A stuck claim is not live: no --force needed. So is a completed
    // record, by its stored form.
    on(fx, &["forget", ORDERS, "S-1", "apple"]).ok();
    claimable_afresh(store, &ORDERS_SPEC, &key("S-1", "apple")).await;
    on(fx, &["forget", ORDERS, "--raw", "3:D-1|5:apple"]).ok();
    claimable_afresh(store, &ORDERS_SPEC, &key("D-1", "apple")).await;

    // Nothing to forget.
    let line = on(fx, &["forget", ORDERS, "D-1", "apple"]).fails(3);
    assert!(
        line.contains(
            "no record of key D-1 + apple (stored 3:D-1|5:apple) for handler `cli_orders`"
        ),
        "{line}"
    );
}

pub(crate) async fn sweep_deletes_expired_records<F: StoreFx>(fx: &F) {
    populate(fx).await;
    if F::NATIVE_EXPIRY {
        // A record whose ttl ends at once is gone by itself.
        complete(fx.store(), &SHORT_SPEC, &key("V-1", "apple"), "null").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let text = on(fx, &["sweep"]).ok().stdout;
        assert_eq!(
            text,
            "redis expires its records by itself (key TTLs): nothing to sweep\n"
        );
        let swept = on(fx, &["--json", "sweep"]).json();
        assert_eq!(swept, json!({"deleted": 0, "native_expiry": true}));
        let listing = on(fx, &["--json", "list", ORDERS]).json();
        assert_eq!(
            orders(&listing),
            ["S-1", "L-1", "D-1", "F-1", "R-1", "X-1"],
            "V-1 expired by itself; the stuck claim waits for its takeover"
        );
        return;
    }
    let text = on(fx, &["sweep"]).ok().stdout;
    assert!(
        text.starts_with("deleted 2 expired records from table `"),
        "{text}"
    );
    let listing = on(fx, &["--json", "list", ORDERS]).json();
    assert_eq!(orders(&listing), ["L-1", "D-1", "F-1", "R-1", "X-1"]);
    let swept = on(fx, &["--json", "sweep"]).json();
    assert_eq!(swept, json!({"deleted": 0, "native_expiry": false}));
    let stats = on(fx, &["--json", "stats"]).json();
    assert_eq!(stats["handlers"][0]["expired"], 0);
}

pub(crate) async fn schema_reports_the_table_s_version<F: StoreFx>(fx: &F) {
    let schema = on(fx, &["--json", "schema"]).json();
    assert_eq!(schema["store"], F::NAME);
    if F::NATIVE_EXPIRY {
        assert_eq!(schema["version"], Value::Null);
        assert_eq!(schema["current"], Value::Null);
        let text = on(fx, &["schema"]).ok().stdout;
        assert!(text.starts_with("redis keeps no schema"), "{text}");
        return;
    }
    let table = fx.args()[3].clone();
    assert_eq!(schema["table"], table.as_str());
    let current = idem_runtime::store::sql::SCHEMA_VERSION;
    assert_eq!(schema["version"], current);
    assert_eq!(schema["current"], current);
    let text = on(fx, &["schema"]).ok().stdout;
    assert_eq!(
        text,
        format!("table `{table}`: schema version {current} (this release's is {current})\n")
    );
    let mut args = fx.args_on("idem_cli_never_made");
    args.push("schema".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let line = idem(&args).fails(3);
    assert!(line.contains("no table `idem_cli_never_made`"), "{line}");
}
