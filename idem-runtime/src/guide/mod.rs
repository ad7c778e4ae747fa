//! # The idem guide
//!
//! The README shows a transaction-mode handler and one consumer; this guide
//! is the rest, one chapter a subject. Every Rust sample in it is a doctest:
//! `cargo test --workspace` compiles and runs each one (the listings of the
//! generated code are checked by the macro's snapshot test instead).
//!
//! The samples that need a server connect to the one on loopback named in
//! [`contributing`]. When that server is unreachable, such a sample returns
//! early and rustdoc reports it as `ok`: the skip is silent, because rustdoc
//! does not show a passing doctest's output. With `IDEM_REQUIRE_SERVICES=1`
//! the sample fails instead, and its panic says which server was
//! unreachable and why.
//!
//! A chapter whose samples need a store or a broker that is a cargo feature
//! is tested when that feature is on (`cargo test --workspace` turns them
//! all on).
//!
//! Start with the [`tutorial`], then read what your handlers need:
//!
//! | chapter | what it answers |
//! | --- | --- |
//! | [`tutorial`] | a first handler, what a duplicate gets, a lease-mode handler, a consumer; the cargo features and the runnable examples |
//! | [`attribute`] | every argument of `#[idempotent]`, the handler shapes it takes, what it refuses at compile time |
//! | [`modes`] | transaction mode and lease mode: what each guarantees, and when to use which |
//! | [`keys`] | how a key is encoded, stored and shown |
//! | [`failures`] | errors and what a consumer does with each; payload fingerprints, attempt limits, final errors |
//! | [`batches`] | handlers that take a whole batch of messages |
//! | [`stores`] | the stores side by side, the dedup table, a store of your own |
//! | [`postgres`], [`mysql`], [`redis`] | each server store: its options, round trips, and what was proven on it |
//! | [`consumers`] | the RabbitMQ and NATS JetStream consumers: acks, retries, dead letters, chaos runs |
//! | [`kafka`] | the Kafka consumer: partition order, commits, retry and dead-letter topics, rebalances, offsets in the database |
//! | [`rocketmq`] | the RocketMQ consumer: its topics, retries at the broker's delay levels, keys from the `KEYS`, what idem sets on the client, dead letters and their ledger |
//! | [`http`] | the Idempotency-Key header on axum routes: scopes, statuses, transaction and lease mode |
//! | [`outbox`] | sending messages on from a transaction: staging, derived message ids, relays, what a crash leaves |
//! | [`operations`] | the `idem` CLI, records, dead letters, the registry, tracing and metrics |
//! | [`expansion`] | the code the attribute generates, verbatim |
//! | [`benchmarks`] | what idem costs, measured, with the commands to measure it again |
//! | [`design`] | the design decisions, and why they went the way they did |
//! | [`glossary`] | the types that say what became of a delivery, who sees each, and when |
//! | [`contributing`] | the layout of the workspace, the tests and the servers they use |

#[cfg(any(doc, feature = "rabbitmq"))]
#[doc = include_str!("tutorial.md")]
pub mod tutorial {}

#[doc = include_str!("attribute.md")]
pub mod attribute {}

#[doc = include_str!("modes.md")]
pub mod modes {}

#[doc = include_str!("keys.md")]
pub mod keys {}

#[doc = include_str!("failures.md")]
pub mod failures {}

#[cfg(any(doc, feature = "postgres"))]
#[doc = include_str!("batches.md")]
pub mod batches {}

#[cfg(any(doc, feature = "redis"))]
#[doc = include_str!("stores.md")]
pub mod stores {}

#[cfg(any(doc, feature = "postgres"))]
#[doc = include_str!("postgres.md")]
pub mod postgres {}

#[cfg(any(doc, feature = "mysql"))]
#[doc = include_str!("mysql.md")]
pub mod mysql {}

#[cfg(any(doc, feature = "redis"))]
#[doc = include_str!("redis.md")]
pub mod redis {}

#[cfg(any(doc, feature = "nats"))]
#[doc = include_str!("consumers.md")]
pub mod consumers {}

#[cfg(any(doc, all(feature = "kafka", feature = "sqlite")))]
#[doc = include_str!("kafka.md")]
pub mod kafka {}

#[cfg(any(doc, feature = "rocketmq"))]
#[doc = include_str!("rocketmq.md")]
pub mod rocketmq {}

#[cfg(any(doc, all(feature = "axum", feature = "sqlite")))]
#[doc = include_str!("http.md")]
pub mod http {}

#[cfg(any(doc, all(feature = "sqlite", feature = "nats")))]
#[doc = include_str!("outbox.md")]
pub mod outbox {}

#[doc = include_str!("operations.md")]
pub mod operations {}

// The listings are the macro crate's snapshot files, which its test compares
// with the real expansion on every run: `ignore` here, checked there.
#[doc = concat!(
    include_str!("expansion.md"),
    "\n```rust,ignore\n",
    include_str!("../../../idem-macros/tests/expanded/deduct_stock.input.rs"),
    "```\n\n```rust,ignore\n",
    include_str!("../../../idem-macros/tests/expanded/deduct_stock.rs"),
    "```\n"
)]
pub mod expansion {}

#[doc = include_str!("benchmarks.md")]
pub mod benchmarks {}

#[doc = include_str!("design.md")]
pub mod design {}

#[doc = include_str!("glossary.md")]
pub mod glossary {}

#[doc = include_str!("contributing.md")]
pub mod contributing {}
