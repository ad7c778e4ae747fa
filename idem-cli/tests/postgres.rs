//! The `idem` binary's suite (`common/suite.rs`) on PostgreSQL (`DATABASE_URL`), on a dedup table of each test's own.

mod common;

use std::time::Duration;

use idem_runtime::PgStore;
use idem_runtime::store::sql::Partitions;
use idem_tests::{DropTables, next_period, pg_pool, pg_url, unique_table};
use serde_json::json;

use common::{SHORT_SPEC, SMS, SMS_SPEC, complete, idem, key};

common::suite::cli_suite!(common::fixtures::PgFx);

/// `idem sweep` opens its store without partitions; on a table partitioned
/// by time it drops every partition whose records all expired, however
/// few rows each held, and keeps the live record. No sweep ran while the
/// records were written, so the live one went to the default partition
/// (the migration made partitions for three periods ahead, not four),
/// where its place is that of the first expired record in theirs: a
/// delete of expired rows by place alone would take it too.
#[tokio::test]
async fn sweep_drops_every_expired_partition_of_a_partitioned_table() {
    let Some(pool) = pg_pool(4).await else {
        return;
    };
    let table = unique_table("idem_cli_part");
    let _drop = DropTables::new(&[&table]);
    let width = Duration::from_secs(1);
    let store = PgStore::from_pool(pool)
        .with_table(&table)
        .expect("a valid table name")
        .with_partitions(Partitions::every(width).expect("a valid width"));
    store.migrate().await.expect("migrate");
    // Three periods of 5 records that expire as they are completed, then
    // a fourth of a record kept an hour.
    for period in 0..3 {
        next_period(width).await;
        for i in 0..5 {
            let order = format!("P{period}-{i}");
            complete(&store, &SHORT_SPEC, &key(&order, "apple"), "null").await;
        }
    }
    next_period(width).await;
    complete(&store, &SMS_SPEC, &key("L-1", "apple"), "null").await;
    next_period(width).await;

    let url = pg_url();
    let args = ["--store", &url, "--table", &table, "--json", "sweep"];
    assert_eq!(
        idem(&args).json(),
        json!({"deleted": 15, "native_expiry": false})
    );
    assert_eq!(store.count().await.expect("count"), 1);
    let left = idem(&["--store", &url, "--table", &table, "--json", "list", SMS]).json();
    assert_eq!(left["records"].as_array().map(Vec::len), Some(1), "{left}");
}
