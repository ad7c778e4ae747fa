//! Mistakes and their messages: unknown handlers and keys, malformed
//! keys, a key of the wrong number of parts, names matched exactly.

use idem_runtime::store::{Inspect, Status};

use super::{on, orders};
use crate::common::fixtures::StoreFx;
use crate::common::{GLOB_SPECS, ORDERS, ORDERS_SPEC, SMS_SPEC, complete, idem, key};

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
