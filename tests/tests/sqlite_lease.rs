//! Lease mode on SQLite (handlers without a transaction parameter): the claim
//! is a lease with a fencing token; the body's effect here is a `ledger` row
//! written through the pool, outside any idem transaction, as an external
//! effect would be.
//!
//! The suite is written once in `common/lease.rs` and runs on PostgreSQL too
//! (`pg_lease.rs`).

mod common;

common::lease::suite! {
    db: Db,
    mode: Mode::Sqlite,
    store: "sqlite",
    names: { job: "sl_job", heartbeat: "sl_heartbeat", notice: "sl_notice" },
}
