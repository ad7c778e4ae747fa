//! Lease mode on PostgreSQL: the lease suite (`common/lease.rs`) against the
//! server of `DATABASE_URL`, each test on a dedup table of its own. The
//! claim is one `INSERT ... ON CONFLICT ... RETURNING` with a fencing token;
//! the body's effect is a `ledger` row in Postgres written through the pool,
//! outside any idem transaction.

use crate::common;

common::lease::suite!(common::PgDb);
common::lease::clock_suite!(common::PgDb);
