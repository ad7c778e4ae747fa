//! Lease mode on PostgreSQL: the suite SQLite passes (`common/lease.rs`),
//! against the server of `DATABASE_URL`. The claim is one `INSERT ... ON
//! CONFLICT ... RETURNING` with a fencing token; the body's effect is a
//! `ledger` row in Postgres written through the pool, outside any idem
//! transaction. The claim order only concerns transaction mode.

mod common;

common::lease::suite! {
    db: PgDb,
    mode: Mode::Pg(idem_runtime::ClaimOrder::Last),
    store: "postgres",
    names: { job: "pl_job", heartbeat: "pl_heartbeat", notice: "pl_notice" },
}
