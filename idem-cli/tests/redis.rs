//! The `idem` binary's suite (`common/suite.rs`) on Redis (`REDIS_URL`), under a key prefix of each test's own.

mod common;

common::suite::cli_suite!(common::fixtures::RedisFx);
