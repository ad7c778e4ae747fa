//! The `idem` binary's suite (`common/suite.rs`) on a Redis Cluster of
//! three masters that this test starts on free loopback ports (and kills
//! afterwards): the binary is given the nodes with `--cluster`, and lists
//! and counts by scanning every master. One `#[test]`, which owns the
//! cluster; each scenario has a key prefix of its own.

mod common;

use std::time::Instant;

use common::fixtures::RedisFx;
use common::suite;
use idem_tests::RedisCluster;

/// Runs each scenario on a fixture of its own on the cluster of `$urls`.
macro_rules! in_sequence {
    ($urls:ident; $($scenario:ident,)*) => {
        $(
            let fx = RedisFx::on_cluster(&$urls).await;
            let t = Instant::now();
            suite::$scenario(&fx).await;
            eprintln!("cluster: {} ok in {:?}", stringify!($scenario), t.elapsed());
        )*
    };
}

#[test]
fn the_suite_on_a_three_master_cluster() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let urls = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        in_sequence! { urls;
            show_prints_every_field_of_a_record,
            list_filters_and_orders_a_handler_s_records,
            stats_count_records_by_handler_and_status,
            forget_refuses_a_live_claim_unless_forced_and_the_key_runs_again,
            sweep_deletes_expired_records,
            schema_reports_the_table_s_version,
            errors_are_one_line_with_their_exit_code,
            handler_names_are_matched_exactly,
            an_exhausted_key_reads_as_exhausted,
        }
    });
}
