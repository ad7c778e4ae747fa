//! The scenarios, each on a fixture of its own: records written by the
//! runtime, read, listed, counted, forgotten and swept by the binary.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_runtime::Error;
use idem_runtime::store::{Claim, Failure, LeaseStore, Standing};
use idem_runtime::store::{Inspect, Status};
use serde_json::{Value, json};

use super::fixtures::StoreFx;
use super::{
    FINGERPRINT, GLOB_SPECS, ORDERS, ORDERS_SPEC, RATIO, RESERVE, Reserve, Run, SHORT_SPEC, SMS,
    SMS_SPEC, claim, claimable_afresh, complete, fail, idem, idem_env, key, now, ratio, reserve,
    two_hours_ago,
};

/// One `#[tokio::test]` per scenario on the fixture type `$Fx`, skipped
/// (saying why) when its server is unreachable.
#[allow(unused_macros)]
macro_rules! cli_suite {
    ($Fx:ty) => {
        $crate::common::suite::cli_suite!(@tests $Fx;
            show_prints_every_field_of_a_record,
            list_filters_and_orders_a_handler_s_records,
            stats_count_records_by_handler_and_status,
            forget_refuses_a_live_claim_unless_forced_and_the_key_runs_again,
            sweep_deletes_expired_records,
            schema_reports_the_table_s_version,
            errors_are_one_line_with_their_exit_code,
            handler_names_are_matched_exactly,
            a_key_of_the_wrong_number_of_parts_says_how_many,
            an_exhausted_key_reads_as_exhausted,
            an_unrecordable_result_reads_as_such_until_it_is_forgotten,
        );
    };
    (@tests $Fx:ty; $($scenario:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                use $crate::common::fixtures::StoreFx as _;
                let fx = idem_tests::or_skip!(<$Fx>::open().await);
                $crate::common::suite::$scenario(&fx).await;
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use cli_suite;

/// Runs the binary on `fx`'s store with `args` after the store's.
pub(crate) fn on<F: StoreFx>(fx: &F, args: &[&str]) -> Run {
    let mut all = fx.args();
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    idem(&all)
}

/// 2023-11-14T22:13:20Z, as ms since the epoch.
const T0: i64 = 1_700_000_000_000;

/// How far after the moment a store was set to write at
/// ([`StoreFx::store_at`]) its record's times may fall: a SQL store writes
/// the database's time, moved by a shift, and that time runs on while the
/// statement is on its way. Redis and memory write at the very moment.
const WRITTEN_WITHIN: i64 = 5_000;

/// `value` (ms since the epoch) is `at`, or up to [`WRITTEN_WITHIN`] later.
fn written_at(value: &Value, at: i64) -> i64 {
    let ms = value.as_i64().unwrap_or_else(|| panic!("ms, not {value}"));
    assert!(
        (at..=at + WRITTEN_WITHIN).contains(&ms),
        "{ms} is not {at} or within {WRITTEN_WITHIN} ms after it"
    );
    ms
}

/// When the records of [`populate`] were written.
struct Population {
    /// The stuck claim and the expired record, two hours ago.
    past: i64,
    /// A minute ago: the other records, a second apart.
    base: i64,
}

/// `cli_orders` records of every kind, each claimed at a time of its own:
///
/// | order | written | record |
/// | --- | --- | --- |
/// | S-1 | two hours ago | in progress, its lease long run out (stuck) |
/// | E-1 | two hours ago, 1 s later | completed, its hour over (expired; not on Redis) |
/// | L-1 | base + 1 s | in progress, live, with a fingerprint |
/// | D-1 | base + 2 s | completed |
/// | F-1 | base + 3 s | failed for good |
/// | R-1 | base + 4 s | failed once, waiting for a retry |
/// | X-1 | base + 5..7 s | failed three times: out of attempts |
async fn populate<F: StoreFx>(fx: &F) -> Population {
    let past = two_hours_ago();
    let base = now() - 60_000;
    let sku = "apple";
    claim(&fx.store_at(past), &ORDERS_SPEC, &key("S-1", sku), None).await;
    if !F::NATIVE_EXPIRY {
        complete(
            &fx.store_at(past + 1_000),
            &ORDERS_SPEC,
            &key("E-1", sku),
            "1",
        )
        .await;
    }
    claim(
        &fx.store_at(base + 1_000),
        &ORDERS_SPEC,
        &key("L-1", sku),
        Some(FINGERPRINT),
    )
    .await;
    complete(
        &fx.store_at(base + 2_000),
        &ORDERS_SPEC,
        &key("D-1", sku),
        r#"{"left":7}"#,
    )
    .await;
    fail(
        &fx.store_at(base + 3_000),
        &ORDERS_SPEC,
        &key("F-1", sku),
        Failure::Final {
            error: "unknown SKU pear-9",
            encoded: r#"{"UnknownSku":"pear-9"}"#,
        },
    )
    .await;
    fail(
        &fx.store_at(base + 4_000),
        &ORDERS_SPEC,
        &key("R-1", sku),
        Failure::Counted {
            error: "warehouse API timed out",
        },
    )
    .await;
    for i in 0..3 {
        fail(
            &fx.store_at(base + 5_000 + i * 1_000),
            &ORDERS_SPEC,
            &key("X-1", sku),
            Failure::Counted {
                error: "warehouse API timed out",
            },
        )
        .await;
    }
    // The runtime turns the next delivery of X-1 away.
    assert!(matches!(
        fx.store()
            .claim(&ORDERS_SPEC, &key("X-1", sku), None)
            .await
            .unwrap(),
        Claim::Refused(Standing::Exhausted { failures: 3, .. })
    ));
    Population { past, base }
}

/// The order ids (first key parts) of a `--json` listing.
fn orders(listing: &Value) -> Vec<String> {
    listing["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key_parts"][0].as_str().expect("a key part").to_owned())
        .collect()
}

/// `expected`, without E-1 on a store that cannot hold it.
fn sans_expired<F: StoreFx>(expected: &[&str]) -> Vec<String> {
    expected
        .iter()
        .filter(|o| !(F::NATIVE_EXPIRY && **o == "E-1"))
        .map(|o| (*o).to_owned())
        .collect()
}

pub(crate) async fn show_prints_every_field_of_a_record<F: StoreFx>(fx: &F) {
    let k = key("A-17", "apple");
    complete(&fx.store_at(T0), &ORDERS_SPEC, &k, r#"{"left":7}"#).await;

    let text = on(fx, &["show", ORDERS, "A-17", "apple"]).ok().stdout;
    // T0, or up to WRITTEN_WITHIN (5 s) later: 22:13:2x.
    for line in [
        "handler      cli_orders\n",
        "key          A-17 + apple  (stored 4:A-17|5:apple)\n",
        "outcome      {\"left\":7}\n",
        "attempts     1\n",
        "failures     0\n",
        "last error   -\n",
        "fingerprint  -\n",
        "lease holder -\n",
        "created      2023-11-14T22:13:2",
        "updated      2023-11-14T22:13:2",
    ] {
        assert!(text.contains(line), "{line:?} is not in:\n{text}");
    }
    // The handler's limit: a SQL row keeps it; a completed Redis record
    // holds its outcome in its place (the limit matters to retries only).
    let limit = if F::NATIVE_EXPIRY { "-" } else { "3" };
    assert!(text.contains(&format!("max attempts {limit}\n")), "{text}");
    if F::NATIVE_EXPIRY {
        // Redis keeps it for the ttl from when it was written, by its own clock.
        assert!(
            text.contains("status       completed (counts until "),
            "{text}"
        );
    } else {
        assert!(text.contains("status       completed (expired "), "{text}");
        assert!(text.contains("expires      2023-11-14T23:13:2"), "{text}");
    }

    let shown = on(fx, &["--json", "show", ORDERS, "A-17", "apple"]).json();
    assert_eq!(shown["handler"], ORDERS);
    assert_eq!(shown["key"], "4:A-17|5:apple");
    assert_eq!(shown["key_parts"], json!(["A-17", "apple"]));
    assert_eq!(shown["status"], "completed");
    assert_eq!(shown["outcome"], json!({"left": 7}));
    assert_eq!(shown["attempts"], 1);
    assert_eq!(shown["failures"], 0);
    assert_eq!(shown["last_error"], Value::Null);
    assert_eq!(shown["fingerprint"], Value::Null);
    // The token of the claim that completed the record, which holds no
    // lease (the text says `lease holder -`).
    assert!(shown["token"].is_string(), "{shown}");
    let created = written_at(&shown["created_at_ms"], T0);
    // Claimed, then completed by a statement of its own.
    let updated = written_at(&shown["updated_at_ms"], created);
    let created_at = shown["created_at"].as_str().unwrap();
    assert!(created_at.starts_with("2023-11-14T22:13:2"), "{created_at}");
    assert_eq!(shown["expired"], !F::NATIVE_EXPIRY);
    if !F::NATIVE_EXPIRY {
        assert_eq!(shown["expires_at_ms"], updated + 3_600_000);
        let expires_at = shown["expires_at"].as_str().unwrap();
        assert!(expires_at.starts_with("2023-11-14T23:13:2"), "{expires_at}");
    }

    // The stored form names the same record, and so does IDEM_STORE_URL.
    let mut args = fx.args();
    let url = args.remove(1);
    args.remove(0);
    let mut raw: Vec<&str> = args.iter().map(String::as_str).collect();
    raw.extend(["--json", "show", ORDERS, "--raw", "4:A-17|5:apple"]);
    let by_raw = idem_env(&raw, &[("IDEM_STORE_URL", &url)]).json();
    assert_eq!(by_raw["key"], shown["key"]);
    assert_eq!(by_raw["created_at_ms"], shown["created_at_ms"]);
    assert_eq!(by_raw["outcome"], shown["outcome"]);

    // A live claim: its lease holder and the payload's fingerprint.
    let live = key("L-1", "apple");
    let token = claim(fx.store(), &ORDERS_SPEC, &live, Some(FINGERPRINT)).await;
    let shown = on(fx, &["--json", "show", ORDERS, "L-1", "apple"]).json();
    assert_eq!(shown["status"], "in_progress");
    assert_eq!(shown["token"], token.as_str());
    assert_eq!(shown["fingerprint"], FINGERPRINT);
    assert_eq!(shown["outcome"], Value::Null);
    assert_eq!(shown["expired"], false);
    let created = shown["created_at_ms"].as_i64().unwrap();
    assert!((now() - 60_000..=now()).contains(&created), "{shown}");
    assert_eq!(shown["expires_at_ms"].as_i64().unwrap(), created + 600_000);
    let text = on(fx, &["show", ORDERS, "L-1", "apple"]).ok().stdout;
    assert!(text.contains(&format!("lease holder {token}\n")), "{text}");
    assert!(
        text.contains("status       in_progress (live claim, its lease ends in 9m 5"),
        "{text}"
    );
    assert!(
        text.contains(&format!("fingerprint  {FINGERPRINT}\n")),
        "{text}"
    );

    // A final failure: its error is the outcome; a retry: the last error.
    fail(
        fx.store(),
        &ORDERS_SPEC,
        &key("F-1", "apple"),
        Failure::Final {
            error: "unknown SKU pear-9",
            encoded: r#"{"UnknownSku":"pear-9"}"#,
        },
    )
    .await;
    let shown = on(fx, &["--json", "show", ORDERS, "F-1", "apple"]).json();
    assert_eq!(shown["status"], "failed");
    assert_eq!(shown["outcome"], json!({"UnknownSku": "pear-9"}));
    assert_eq!(shown["failures"], 1);
    assert_eq!(shown["last_error"], "unknown SKU pear-9");
    fail(
        fx.store(),
        &ORDERS_SPEC,
        &key("R-1", "apple"),
        Failure::Counted {
            error: "warehouse API timed out",
        },
    )
    .await;
    let text = on(fx, &["show", ORDERS, "R-1", "apple"]).ok().stdout;
    assert!(text.contains("status       retry (counts until "), "{text}");
    assert!(text.contains("failures     1\n"), "{text}");
    assert!(
        text.contains("last error   warehouse API timed out\n"),
        "{text}"
    );
}

pub(crate) async fn list_filters_and_orders_a_handler_s_records<F: StoreFx>(fx: &F) {
    populate(fx).await;
    let list = |args: &[&str]| {
        let mut all = vec!["--json", "list", ORDERS];
        all.extend(args);
        orders(&on(fx, &all).json())
    };
    let every = sans_expired::<F>(&["S-1", "E-1", "L-1", "D-1", "F-1", "R-1", "X-1"]);
    assert_eq!(list(&[]), every, "oldest claim first");
    let mut newest = every.clone();
    newest.reverse();
    assert_eq!(list(&["--newest-first"]), newest);
    assert_eq!(list(&["--limit", "2"]), every[..2].to_vec());
    assert_eq!(list(&["--newest-first", "--limit", "1"]), ["X-1"]);
    assert_eq!(list(&["--limit", "0"]), Vec::<String>::new());
    assert_eq!(list(&["--stuck"]), ["S-1"]);
    assert_eq!(list(&["--failed"]), ["F-1", "R-1", "X-1"]);
    assert_eq!(
        list(&["--status", "completed"]),
        sans_expired::<F>(&["E-1", "D-1"])
    );
    assert_eq!(list(&["--status", "in_progress"]), ["S-1", "L-1"]);
    assert_eq!(list(&["--status", "retry"]), ["R-1", "X-1"]);
    assert_eq!(list(&["--status", "exhausted"]), ["X-1"]);
    assert_eq!(list(&["--status", "failed"]), ["F-1"]);

    let listing = on(fx, &["--json", "list", ORDERS, "--failed", "--limit", "5"]).json();
    assert_eq!(listing["handler"], ORDERS);
    assert_eq!(listing["filter"], "failed");
    assert_eq!(listing["limit"], 5);
    assert_eq!(listing["order"], "oldest_first");
    let out_of_attempts = &listing["records"][2];
    assert_eq!(out_of_attempts["status"], "retry");
    assert_eq!(out_of_attempts["failures"], 3);
    assert_eq!(out_of_attempts["attempts"], 3);
    assert_eq!(out_of_attempts["last_error"], "warehouse API timed out");
    assert_eq!(out_of_attempts["max_attempts"], 3);
    assert_eq!(out_of_attempts["exhausted"], true);
    assert_eq!(
        listing["records"][1]["exhausted"], false,
        "R-1 has attempts left"
    );

    let text = on(fx, &["list", ORDERS]).ok().stdout;
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "{} records of `cli_orders`, oldest claim first:",
                every.len()
            )
            .as_str()
        )
    );
    let header = lines.next().unwrap();
    assert!(header.starts_with("KEY"), "{text}");
    for column in [
        "STATUS",
        "ATTEMPTS",
        "FAILURES",
        "CREATED",
        "EXPIRES",
        "LAST ERROR",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let stuck = lines.next().unwrap();
    assert!(stuck.starts_with("S-1 + apple"), "{text}");
    assert!(stuck.contains("in_progress, stuck"), "{text}");
    assert!(stuck.contains("2h ago"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("X-1 + apple")
            && l.contains("retry, exhausted")
            && l.contains("3 of 3")
            && l.ends_with("warehouse API timed out")),
        "{text}"
    );
    let text = on(fx, &["list", ORDERS, "--stuck"]).ok().stdout;
    assert!(
        text.starts_with("1 record of `cli_orders` stuck past their lease, oldest claim first:"),
        "{text}"
    );
    let text = on(fx, &["list", SMS]).fails(3);
    assert!(text.contains("unknown handler `cli_sms`"), "{text}");
    complete(fx.store(), &SMS_SPEC, &key("m-1", "x"), "null").await;
    let text = on(fx, &["list", SMS, "--stuck"]).ok().stdout;
    assert_eq!(text, "no records of `cli_sms` stuck past their lease\n");
}

pub(crate) async fn stats_count_records_by_handler_and_status<F: StoreFx>(fx: &F) {
    let text = on(fx, &["stats"]).ok().stdout;
    assert!(text.starts_with("no records in "), "{text}");
    let Population { past, base } = populate(fx).await;
    complete(&fx.store_at(base), &SMS_SPEC, &key("m-1", "x"), "null").await;
    complete(&fx.store_at(base), &SMS_SPEC, &key("m-2", "x"), "null").await;

    let stats = on(fx, &["--json", "stats"]).json();
    assert_eq!(stats["store"], F::NAME);
    let at = stats["at_ms"].as_i64().unwrap();
    assert!((base..=now()).contains(&at), "{stats}");
    let expired_completed = u64::from(!F::NATIVE_EXPIRY);
    let oldest_claim = written_at(&stats["handlers"][0]["oldest_in_progress_at_ms"], past);
    assert_eq!(
        stats["handlers"],
        json!([
            {
                "handler": ORDERS,
                "records": 6 + expired_completed,
                "in_progress": 2,
                "completed": 1 + expired_completed,
                "failed": 1,
                "retry": 2,
                "oldest_in_progress_at_ms": oldest_claim,
                "expired": 1 + expired_completed,
                "oldest_in_progress_at": stats["handlers"][0]["oldest_in_progress_at"],
            },
            {
                "handler": SMS,
                "records": 2,
                "in_progress": 0,
                "completed": 2,
                "failed": 0,
                "retry": 0,
                "oldest_in_progress_at_ms": null,
                "expired": 0,
                "oldest_in_progress_at": null,
            },
        ])
    );
    let oldest = stats["handlers"][0]["oldest_in_progress_at"]
        .as_str()
        .unwrap();
    assert!(oldest.ends_with('Z') && oldest.len() == 24, "{oldest}");

    let text = on(fx, &["stats"]).ok().stdout;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header[..7],
        [
            "HANDLER",
            "RECORDS",
            "IN_PROGRESS",
            "COMPLETED",
            "FAILED",
            "RETRY",
            "EXPIRED"
        ]
    );
    let orders: Vec<String> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let n = |v: u64| v.to_string();
    assert_eq!(
        orders[..7],
        [
            ORDERS.to_owned(),
            n(6 + expired_completed),
            n(2),
            n(1 + expired_completed),
            n(1),
            n(2),
            n(1 + expired_completed)
        ]
    );
    assert!(orders[8].starts_with("(2h"), "{text}");
    let sms: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(sms, [SMS, "2", "0", "2", "0", "0", "0", "-"]);
}

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
    assert_eq!(schema["version"], 3);
    assert_eq!(schema["current"], 3);
    let text = on(fx, &["schema"]).ok().stdout;
    assert_eq!(
        text,
        format!("table `{table}`: schema version 3 (this release's is 3)\n")
    );
    let mut args = fx.args_on("idem_cli_never_made");
    args.push("schema".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let line = idem(&args).fails(3);
    assert!(line.contains("no table `idem_cli_never_made`"), "{line}");
}

pub(crate) async fn errors_are_one_line_with_their_exit_code<F: StoreFx>(fx: &F) {
    complete(fx.store(), &ORDERS_SPEC, &key("D-1", "apple"), "7").await;
    complete(fx.store(), &SMS_SPEC, &key("m-1", "x"), "null").await;

    for args in [
        &["show", "nope", "A-17"][..],
        &["list", "nope"],
        &["forget", "nope", "A-17"],
    ] {
        let line = on(fx, args).fails(3);
        assert!(
            line.contains("unknown handler `nope`")
                && line.ends_with("handlers with records: `cli_orders`, `cli_sms`"),
            "{line}"
        );
    }
    let line = on(fx, &["show", ORDERS, "Z-9", "apple"]).fails(3);
    assert!(
        line.contains(
            "no record of key Z-9 + apple (stored 3:Z-9|5:apple) for handler `cli_orders`"
        ),
        "{line}"
    );
    let line = on(fx, &["show", ORDERS, "--raw", "9:short"]).fails(2);
    assert_eq!(
        line,
        "idem: malformed --raw key: \"9:short\" is not a stored key: a part's length runs past the end of the key"
    );
    let line = on(fx, &["forget", ORDERS, "--raw", "D-1|apple"]).fails(2);
    assert!(line.starts_with("idem: malformed --raw key"), "{line}");
    let line = on(fx, &["show", ORDERS]).fails(2);
    assert!(
        line.starts_with("idem: no key given for handler `cli_orders`"),
        "{line}"
    );
    // A numeric part that looks like an option is a part.
    on(fx, &["show", ORDERS, "-5", "x"]).fails(3);

    let mut args = fx.args_on("idem_cli_elsewhere");
    args.extend(["list".to_owned(), ORDERS.to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if F::NATIVE_EXPIRY {
        let line = idem(&args).fails(3);
        assert!(
            line.ends_with("prefix `idem_cli_elsewhere` holds no records at all"),
            "{line}"
        );
    } else {
        let line = idem(&args).fails(1);
        assert!(line.contains("no table `idem_cli_elsewhere`"), "{line}");
    }
    // Nothing above changed a record.
    let record = Inspect::lookup(fx.store(), ORDERS, key("D-1", "apple").as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
}

pub(crate) async fn handler_names_are_matched_exactly<F: StoreFx>(fx: &F) {
    // Names of one length, some holding glob characters: `a*b` would match
    // `axb` in a Redis SCAN pattern, `a?c` would match `abc`.
    for (i, spec) in GLOB_SPECS.iter().enumerate() {
        complete(
            fx.store(),
            spec,
            &key(&format!("o-{i}"), "x"),
            &i.to_string(),
        )
        .await;
    }
    for (i, spec) in GLOB_SPECS.iter().enumerate() {
        let listing = on(fx, &["--json", "list", spec.name]).json();
        assert_eq!(orders(&listing), [format!("o-{i}")], "{}", spec.name);
        let shown = on(fx, &["--json", "show", spec.name, &format!("o-{i}"), "x"]).json();
        assert_eq!(shown["outcome"], i);
    }
    let stats = on(fx, &["--json", "stats"]).json();
    let names: Vec<&str> = stats["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["handler"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a*b", "a?c", "abc", "axb"]);
    let line = on(fx, &["list", "a*"]).fails(3);
    assert!(
        line.ends_with("handlers with records: `a*b`, `a?c`, `abc`, `axb`"),
        "{line}"
    );
}

pub(crate) async fn a_key_of_the_wrong_number_of_parts_says_how_many<F: StoreFx>(fx: &F) {
    complete(fx.store(), &ORDERS_SPEC, &key("D-1", "apple"), "7").await;
    for args in [
        &["show", ORDERS, "D-1"][..],
        &["show", ORDERS, "D-1", "apple", "2"],
        &["forget", ORDERS, "D-1"],
    ] {
        let line = on(fx, args).fails(2);
        assert_eq!(
            line,
            format!(
                "idem: handler `cli_orders` has keys of 2 parts (as its record of key D-1 + apple), not {}: \
                 give its parts after the handler, in the order of its key expression",
                args.len() - 2
            ),
            "{args:?}"
        );
    }
    // The right number of parts, but no such key: not found, as before.
    let line = on(fx, &["show", ORDERS, "D-2", "apple"]).fails(3);
    assert!(line.contains("no record of key D-2 + apple"), "{line}");
}

/// Delivers `msg` to `cli_reserve` on `store` until it is turned away as
/// out of attempts: three runs, three failures, then `Exhausted`.
async fn deliver_until_exhausted<S: LeaseStore>(store: &S, msg: &Reserve, runs: &AtomicU32) {
    let before = runs.load(Ordering::SeqCst);
    for run in 1..=3 {
        match reserve(store, msg, runs).await {
            Err(Error::Handler { .. }) => {}
            other => panic!(
                "delivery {run} of {} runs and fails: {other:?}",
                msg.order_id
            ),
        }
    }
    match reserve(store, msg, runs).await {
        Err(Error::Exhausted { failures: 3, .. }) => {}
        other => panic!("the fourth delivery is turned away: {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        before + 3,
        "the body ran 3 times"
    );
}

/// A handler with `max_attempts = 3` whose body always fails, delivered
/// through its generated function until the runtime turns its key away:
/// `show` and `list` (text and JSON) say the key is exhausted and of how
/// many failures, `list --status exhausted` lists it alone, and once it
/// is forgotten the next delivery runs the body again. A key with
/// attempts left, and (SQL) an exhausted key whose window is over, are
/// not exhausted.
pub(crate) async fn an_exhausted_key_reads_as_exhausted<F: StoreFx>(fx: &F) {
    let runs = AtomicU32::new(0);
    let out = Reserve::new("X-9", "apple");
    deliver_until_exhausted(fx.store(), &out, &runs).await;
    let left = Reserve::new("R-9", "apple");
    assert!(matches!(
        reserve(fx.store(), &left, &runs).await,
        Err(Error::Handler { .. })
    ));
    if !F::NATIVE_EXPIRY {
        // Exhausted two hours ago: its hour is over, the next delivery runs.
        let past = Reserve::new("P-9", "apple");
        deliver_until_exhausted(&fx.store_at(two_hours_ago()), &past, &runs).await;
    }

    let text = on(fx, &["show", RESERVE, "X-9", "apple"]).ok().stdout;
    for line in [
        "status       retry (exhausted: 3 of 3 failures; its deliveries are refused until ",
        "attempts     3\n",
        "failures     3\n",
        "max attempts 3\n",
        "last error   warehouse down (run 3 for X-9)\n",
    ] {
        assert!(text.contains(line), "{line:?} is not in:\n{text}");
    }
    assert!(text.contains(", or until it is forgotten)\n"), "{text}");
    let shown = on(fx, &["--json", "show", RESERVE, "X-9", "apple"]).json();
    assert_eq!(
        (
            &shown["status"],
            &shown["failures"],
            &shown["max_attempts"],
            &shown["exhausted"],
            &shown["expired"]
        ),
        (
            &json!("retry"),
            &json!(3),
            &json!(3),
            &json!(true),
            &json!(false)
        ),
        "{shown}"
    );
    let shown = on(fx, &["--json", "show", RESERVE, "R-9", "apple"]).json();
    assert_eq!(
        (
            &shown["failures"],
            &shown["max_attempts"],
            &shown["exhausted"]
        ),
        (&json!(1), &json!(3), &json!(false)),
        "{shown}"
    );
    let text = on(fx, &["show", RESERVE, "R-9", "apple"]).ok().stdout;
    assert!(text.contains("status       retry (counts until "), "{text}");

    // The listing: the status says it, the failures column gives the limit.
    let text = on(fx, &["list", RESERVE]).ok().stdout;
    let row = |order: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{order} + apple")))
            .unwrap_or_else(|| panic!("no {order} in:\n{text}"));
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (x, r) = (row("X-9"), row("R-9"));
    assert_eq!(x[1..4], ["retry, exhausted", "3", "3 of 3"], "{text}");
    assert_eq!(
        x.last().unwrap(),
        "warehouse down (run 3 for X-9)",
        "{text}"
    );
    assert_eq!(r[1..4], ["retry", "1", "1 of 3"], "{text}");
    if !F::NATIVE_EXPIRY {
        assert_eq!(
            row("P-9")[1..4],
            ["retry, expired", "3", "3 of 3"],
            "{text}"
        );
    }

    let listing = on(fx, &["--json", "list", RESERVE, "--status", "exhausted"]).json();
    assert_eq!(listing["filter"], "exhausted");
    assert_eq!(orders(&listing), ["X-9"]);
    assert_eq!(listing["records"][0]["exhausted"], true);
    let text = on(fx, &["list", RESERVE, "--status", "exhausted"])
        .ok()
        .stdout;
    assert!(
        text.starts_with("1 record of `cli_reserve` out of attempts, oldest claim first:\n"),
        "{text}"
    );
    // Which keys, not their order: on a cluster the shards' claims may
    // share a millisecond.
    let retry = on(fx, &["--json", "list", RESERVE, "--status", "retry"]).json();
    let (mut listed, mut expected) = (orders(&retry), sans_expired_of::<F>(&["P-9", "X-9", "R-9"]));
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    let bad = on(fx, &["list", RESERVE, "--status", "out"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains("expected one of in_progress, completed, failed, retry, exhausted"),
        "{bad:?}"
    );

    // Forgotten, it runs again, as a first delivery.
    let text = on(fx, &["forget", RESERVE, "X-9", "apple"]).ok().stdout;
    assert!(
        text.starts_with(
            "forgot key X-9 + apple of `cli_reserve` (it was retry, exhausted, 3 attempts, 3 failures)"
        ),
        "{text}"
    );
    let before = runs.load(Ordering::SeqCst);
    assert!(matches!(
        reserve(fx.store(), &out, &runs).await,
        Err(Error::Handler { .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), before + 1);
    let text = on(fx, &["list", RESERVE, "--status", "exhausted"])
        .ok()
        .stdout;
    assert_eq!(text, "no records of `cli_reserve` out of attempts\n");
    let shown = on(fx, &["--json", "show", RESERVE, "X-9", "apple"]).json();
    assert_eq!(
        (&shown["failures"], &shown["exhausted"]),
        (&json!(1), &json!(false))
    );
}

/// `expected` without P-9, the record exhausted two hours ago, on a store
/// that cannot hold it.
fn sans_expired_of<F: StoreFx>(expected: &[&str]) -> Vec<String> {
    expected
        .iter()
        .filter(|o| !(F::NATIVE_EXPIRY && **o == "P-9"))
        .map(|o| (*o).to_owned())
        .collect()
}

/// A key settled because its body's result could not be recorded (a NaN)
/// reads as such: `show` says why and until when its deliveries are
/// refused, `list` marks it, `--json` gives the reason. Once forgotten, the
/// key runs again.
pub(crate) async fn an_unrecordable_result_reads_as_such_until_it_is_forgotten<F: StoreFx>(fx: &F) {
    let runs = AtomicU32::new(0);
    let msg = Reserve::new("N-1", "apple");
    for _ in 0..2 {
        let err = ratio(fx.store(), &msg, &runs).await.unwrap_err();
        assert!(matches!(err, Error::Unrecordable { .. }), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the redelivery ran nothing");

    let text = on(fx, &["show", RATIO, "N-1", "apple"]).ok().stdout;
    for line in [
        "status       failed (unrecordable: the body took effect but its result could not be recorded; its deliveries are refused until ",
        "outcome      - (the result could not be recorded: the result is NaN, which JSON cannot carry",
        "last error   the body took effect, but its result cannot be recorded: the result is NaN",
        "failures     1\n",
    ] {
        assert!(text.contains(line), "{line:?} is not in:\n{text}");
    }
    assert!(text.contains(", or until it is forgotten)\n"), "{text}");
    let shown = on(fx, &["--json", "show", RATIO, "N-1", "apple"]).json();
    assert_eq!(shown["status"], "failed");
    let why = shown["unrecordable"].as_str().expect("the reason");
    assert!(why.starts_with("the result is NaN"), "{shown}");
    assert_eq!(shown["outcome"], json!({ "idem:unrecordable": why }));

    let text = on(fx, &["list", RATIO]).ok().stdout;
    let row = text
        .lines()
        .find(|l| l.starts_with("N-1 + apple"))
        .unwrap_or_else(|| panic!("no N-1 in:\n{text}"));
    assert!(row.contains("failed, unrecordable"), "{row}");
    let listed = on(fx, &["--json", "list", RATIO]).json();
    assert_eq!(listed["records"][0]["unrecordable"], why);

    // Forgotten, the key runs again (and is settled again).
    on(fx, &["forget", RATIO, "N-1", "apple"]).ok();
    let err = ratio(fx.store(), &msg, &runs).await.unwrap_err();
    assert!(matches!(err, Error::Unrecordable { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
