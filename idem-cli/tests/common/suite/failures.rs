//! Keys turned away after failing: out of attempts, or settled with a
//! result that could not be recorded.

use std::sync::atomic::{AtomicU32, Ordering};

use idem_runtime::Error;
use idem_runtime::store::LeaseStore;
use serde_json::json;

use super::{on, orders};
use crate::common::fixtures::StoreFx;
use crate::common::{RATIO, RESERVE, Reserve, ratio, reserve, two_hours_ago};

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
