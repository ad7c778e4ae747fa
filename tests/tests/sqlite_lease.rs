//! Lease mode on SQLite: the lease suite (`common/lease.rs`) on a database
//! file of each test's own. The claim is a lease with a fencing token; the
//! body's effect is a `ledger` row written through the pool, outside any
//! idem transaction, as an external effect would be.

use crate::common;

common::lease::suite!(common::Db);
common::lease::clock_suite!(common::Db);
