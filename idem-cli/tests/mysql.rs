//! The `idem` binary's suite (`common/suite.rs`) on MariaDB (`MYSQL_URL`, given to the binary as `mariadb://`), on a dedup table of each test's own.

mod common;

common::suite::cli_suite!(common::fixtures::MySqlFx);
