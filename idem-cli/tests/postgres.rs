//! The `idem` binary's suite (`common/suite.rs`) on PostgreSQL (`DATABASE_URL`), on a dedup table of each test's own.

mod common;

common::suite::cli_suite!(common::fixtures::PgFx);
