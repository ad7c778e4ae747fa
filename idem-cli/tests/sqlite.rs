//! The `idem` binary's suite (`common/suite.rs`) on SQLite, on a database file of each test's own (a temporary directory).

mod common;

common::suite::cli_suite!(common::fixtures::SqliteFx);
