//! The scenarios, each on a fixture of its own: records written by the
//! runtime, read, listed, counted, forgotten and swept by the binary.
//!
//! One file a subject: `read.rs` (show, list, stats), `change.rs` (forget,
//! sweep, schema), `errors.rs` (mistakes and their messages),
//! `failures.rs` (exhausted and unrecordable keys).

mod change;
mod errors;
mod failures;
mod read;

#[allow(unused_imports)]
pub(crate) use change::{
    forget_refuses_a_live_claim_unless_forced_and_the_key_runs_again,
    schema_reports_the_table_s_version, sweep_deletes_expired_records,
};
#[allow(unused_imports)]
pub(crate) use errors::{
    a_key_of_the_wrong_number_of_parts_says_how_many, errors_are_one_line_with_their_exit_code,
    handler_names_are_matched_exactly,
};
#[allow(unused_imports)]
pub(crate) use failures::{
    an_exhausted_key_reads_as_exhausted, an_unrecordable_result_reads_as_such_until_it_is_forgotten,
};
#[allow(unused_imports)]
pub(crate) use read::{
    list_filters_and_orders_a_handler_s_records, show_prints_every_field_of_a_record,
    stats_count_records_by_handler_and_status,
};

use idem_runtime::store::{Claim, Failure, LeaseStore as _, Standing};
use serde_json::Value;

use super::fixtures::StoreFx;
use super::{FINGERPRINT, ORDERS_SPEC, Run, claim, complete, fail, idem, key, now, two_hours_ago};

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
