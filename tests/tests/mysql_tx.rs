//! Transaction mode on MySQL/MariaDB: the transaction suite (`common/tx.rs`)
//! against the server of `MYSQL_URL`, once for each `ClaimOrder` and each
//! way of sending the dedup row (`RoundTrips`). The
//! business tables are InnoDB tables in the same database and the bodies
//! write them through the handler's transaction; each test has its own
//! tables and drops them.
//!
//! A concurrent duplicate waits on a row lock until the first delivery
//! commits: claiming first, on the key's row its `INSERT IGNORE` finds;
//! claiming last, on the inventory row its body updates first (that locking
//! `UPDATE` is the body's first statement, so the transaction's
//! REPEATABLE READ snapshot is taken after the wait). Either way it then
//! reads the committed record and is a duplicate, as on the other stores:
//! the waits stay well under the 5 s lock timeout, and no two deliveries
//! lock rows in opposite orders, so none ends as `InProgress` or as a
//! deadlock victim. Only the scenario built on the lock timeout differs: 1 s
//! (MySQL counts whole seconds) and, claiming last, MySQL's error 1205.

use crate::common;

use common::tx::StoreKind;
use idem_runtime::{ClaimOrder, RoundTrips};

/// `ClaimOrder::Last`, the dedup row with the outcome after
/// the body, as a statement of its own; a duplicate's body runs and is
/// rolled back.
mod claim_last {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::MySqlDb,
        StoreKind::MySql(ClaimOrder::Last, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Last` with `RoundTrips::Merged` (a choice): the dedup
/// row travels in the `COMMIT`'s message, whose insert fails on a duplicate
/// key, before the `COMMIT`, when a record stands (undoing only itself);
/// the claim then goes on as a statement of its own.
mod claim_last_merged {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::MySqlDb,
        StoreKind::MySql(ClaimOrder::Last, RoundTrips::Merged)
    );
}

/// `ClaimOrder::First`: the claim is inserted before the body; a duplicate
/// waits on the key's row lock until the first delivery commits, and is
/// turned away before its body runs.
mod claim_first {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::MySqlDb,
        StoreKind::MySql(ClaimOrder::First, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Checked` (the default): claiming last, with a read of the
/// key's record before the body; a duplicate of a settled key is turned
/// away before its body runs, one racing the first delivery runs it and is
/// rolled back.
mod claim_checked {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::MySqlDb,
        StoreKind::MySql(ClaimOrder::Checked, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Checked` with `RoundTrips::Merged`: the read rides in the
/// message of the store's session statement (`SET autocommit = 0, ...;
/// SELECT ...`, read through the text protocol), the dedup row in the
/// `COMMIT`'s.
mod claim_checked_merged {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::MySqlDb,
        StoreKind::MySql(ClaimOrder::Checked, RoundTrips::Merged)
    );
}
