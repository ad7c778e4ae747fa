//! Transaction mode on PostgreSQL: the suite SQLite passes (`common/tx.rs`),
//! against the server of `DATABASE_URL`, once for each `ClaimOrder`. The
//! business tables live in Postgres and the bodies write them through the
//! handler's transaction; each test has its own tables and drops them.

mod common;

/// `ClaimOrder::Last` (the default): the dedup row is inserted with the
/// outcome after the body; a duplicate's body runs and is rolled back.
mod claim_last {
    crate::common::tx::suite! {
        db: PgDb,
        mode: Mode::Pg(idem_runtime::ClaimOrder::Last),
        store: "postgres",
        tx: PgTx,
        names: { deduct: "pg_last_deduct", unencodable: "pg_last_unencodable", refund: "pg_last_refund" },
    }
}

/// `ClaimOrder::First`: the claim is inserted before the body; a duplicate
/// is turned away before its body runs.
mod claim_first {
    crate::common::tx::suite! {
        db: PgDb,
        mode: Mode::Pg(idem_runtime::ClaimOrder::First),
        store: "postgres",
        tx: PgTx,
        names: { deduct: "pg_first_deduct", unencodable: "pg_first_unencodable", refund: "pg_first_refund" },
    }
}
