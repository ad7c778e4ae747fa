//! Helpers for idem's integration tests, one concern per module:
//!
//! * [`services`]: where the servers are, reaching them, and what a test
//!   does when one is unreachable (skip, or fail under
//!   `IDEM_REQUIRE_SERVICES=1`; see [`or_skip!`]);
//! * [`databases`]: names of a test's own on the shared servers (tables, key
//!   prefixes) and the guards that remove them afterwards;
//! * [`processes`]: servers a test starts and kills itself (`redis-server`,
//!   a Redis Cluster), and a test of the running binary as a child process
//!   (a consumer of its own, under libfaketime if need be);
//! * [`brokers`]: the same for RabbitMQ, NATS and Kafka;
//! * [`http`]: an axum server on a loopback port and a client of it, for
//!   the Idempotency-Key tests;
//! * [`links`]: a network link a test breaks on purpose (a proxy that loses
//!   the reply to one request);
//! * [`otel`]: spans as OpenTelemetry exports them, for the tests of trace
//!   context.
//!
//! The items are re-exported here, so a test writes `idem_tests::pg_pool`.

// rocketmq-client-rust's futures are deep: proving one Send needs more
// than the default limit.
#![recursion_limit = "256"]

pub mod brokers;
pub mod databases;
pub mod http;
pub mod links;
pub mod otel;
pub mod processes;
pub mod services;
pub mod tls;

/// The README's Rust samples, compiled (and run, unless `no_run`) as this
/// crate's doctests, whose dependency on `idem-runtime` has every feature.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use databases::{
    DeleteKeys, DropMySqlTables, DropTables, next_period, unique_prefix, unique_table,
};
pub use http::{HttpClient, Reply, Server};
pub use links::LostReply;
pub use processes::{
    ChildTest, ClusterNode, LIBFAKETIME, RedisCluster, RedisServer, TansuServer, crc16_after,
    free_port, key_slot,
};
pub use services::{
    mysql_pool, mysql_url, pg_pool, pg_url, redis_store, redis_url, services_required, unavailable,
};
