//! Transaction mode on SQLite: the claim, the body's writes (an `inventory`
//! update and a `ledger` insert in the same database file) and the recorded
//! outcome commit together or not at all.
//!
//! The suite is written once in `common/tx.rs` and runs on PostgreSQL too
//! (`pg_tx.rs`).

mod common;

common::tx::suite! {
    db: Db,
    mode: Mode::Sqlite,
    store: "sqlite",
    tx: SqliteTx,
    names: { deduct: "tx_deduct", unencodable: "tx_unencodable", refund: "tx_refund" },
}
