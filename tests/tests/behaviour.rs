//! The behaviour tests of idem, one module per subject (a store, a broker,
//! a mode, an operation), in one test binary: what they share (`common`:
//! the suites written once, the stores' fixtures) is compiled once, and
//! libtest keeps every thread busy across all of them rather than waiting
//! on each file's slowest test. A module runs alone with `cargo test
//! --test behaviour <module>::`.
//!
//! Binaries of their own: `registry_duplicate` (its clashing handler names
//! would poison every handler here), `heartbeat` and `trace` (each installs
//! a global tracing subscriber of its own), and the seven slow tests (see
//! the slow-tests feature in Cargo.toml). The modules here share the
//! handlers' registry and the metrics recorder: a handler's name, and so
//! the series a test reads, are its own across all of them.

// the RocketMQ client's futures, nested in the tests' own
#![recursion_limit = "256"]

mod common;

mod attribute_batch;
mod attribute_ops;
mod body_contention;
mod custom_store;
mod dead_letters;
mod errors;
mod http;
mod http_crash;
mod kafka;
mod keys;
mod memory_lease;
mod mysql_body_retry;
mod mysql_lease;
mod mysql_store;
mod mysql_tx;
mod nats;
mod observability;
mod observability_rules;
mod outbox;
mod pg_batch_plans;
mod pg_lease;
mod pg_partitions;
mod pg_tx;
mod rabbitmq;
mod redis_cluster;
mod redis_lease;
mod replay;
mod rocketmq;
mod schema_upgrade;
mod skewed_clock;
mod sqlite_lease;
mod sqlite_schema;
mod sqlite_tx;
mod sweeper;
mod tls;
