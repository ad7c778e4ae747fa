//! Reading records: `show`, `list` and `stats` on the records of
//! [`populate`](super::populate).

use idem_runtime::store::Failure;
use idem_tests::otel::{in_a_trace, traceparent};
use serde_json::{Value, json};

use super::{Population, T0, on, orders, populate, sans_expired, written_at};
use crate::common::fixtures::StoreFx;
use crate::common::{
    FINGERPRINT, ORDERS, ORDERS_SPEC, SMS, SMS_SPEC, claim, complete, fail, idem_env, key, now,
};

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
        "settled in   -\n",
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

    assert_eq!(shown["trace"], Value::Null);

    // A record settled inside an OpenTelemetry trace keeps the span that
    // settled it.
    let traced = key("T-1", "apple");
    let ((), span) = in_a_trace("delivery", complete(fx.store(), &ORDERS_SPEC, &traced, "1")).await;
    let (trace_id, parent) = (span.span_context.trace_id().to_string(), traceparent(&span));
    let text = on(fx, &["show", ORDERS, "T-1", "apple"]).ok().stdout;
    let line = format!("settled in   trace {trace_id}  ({parent})\n");
    assert!(text.contains(&line), "{line:?} is not in:\n{text}");
    let shown_traced = on(fx, &["--json", "show", ORDERS, "T-1", "apple"]).json();
    assert_eq!(shown_traced["trace"], parent.as_str());
    assert_eq!(shown_traced["trace_id"], trace_id.as_str());

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
