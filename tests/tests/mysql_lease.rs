//! Lease mode on MySQL/MariaDB: the lease suite (`common/lease.rs`) against
//! the server of `MYSQL_URL`, each test on a dedup table of its own. The
//! claim is an `INSERT IGNORE` with a fencing token (then, on a conflict, a
//! read and a conditional takeover); the body's effect is a `ledger` row in
//! MariaDB written through the pool, outside any idem transaction.

use crate::common;

common::lease::suite!(common::MySqlDb);
common::lease::clock_suite!(common::MySqlDb);
