//! Transaction mode on PostgreSQL: the transaction suite (`common/tx.rs`)
//! against the server of `DATABASE_URL`, once for each `ClaimOrder` and
//! each way of sending the dedup row (`RoundTrips`), and on a dedup table
//! partitioned by time claiming last and first. The business tables
//! live in Postgres and the bodies write them through the handler's
//! transaction; each test has its own tables and drops them.

use crate::common;

use common::tx::StoreKind;
use idem_runtime::{ClaimOrder, RoundTrips};

/// `ClaimOrder::Last`: the dedup row is inserted with the outcome after the
/// body, as a statement of its own; a duplicate's body runs and is rolled
/// back.
mod claim_last {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::Pg(ClaimOrder::Last, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Last` with `RoundTrips::Merged`: the dedup row and outcome
/// travel in the `COMMIT`'s message, whose insert fails, before the
/// `COMMIT`, when a record of the key stands; the claim then goes on as a
/// statement of its own.
mod claim_last_merged {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::Pg(ClaimOrder::Last, RoundTrips::Merged)
    );
}

/// `ClaimOrder::First`: the claim is inserted before the body; a duplicate
/// is turned away before its body runs.
mod claim_first {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::Pg(ClaimOrder::First, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Checked`: claiming last, with a read of the key's record
/// before the body; a duplicate of a settled key is turned away before its
/// body runs, one racing the first delivery runs it and is rolled back.
mod claim_checked {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::Pg(ClaimOrder::Checked, RoundTrips::Separate)
    );
}

/// `ClaimOrder::Checked` with `RoundTrips::Merged`: the read before the
/// body, and the dedup row in the `COMMIT`'s message.
mod claim_checked_merged {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::Pg(ClaimOrder::Checked, RoundTrips::Merged)
    );
}

/// `ClaimOrder::Last` on a dedup table partitioned by time
/// (`PgStore::with_partitions`): the insert's trigger and the claim in two
/// statements answer as a plain table does.
mod partitioned_claim_last {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::PgPartitioned(ClaimOrder::Last, RoundTrips::Merged)
    );
}

/// `ClaimOrder::First` on a partitioned table.
mod partitioned_claim_first {
    use super::{ClaimOrder, RoundTrips, StoreKind};
    crate::common::tx::suite!(
        crate::common::PgDb,
        StoreKind::PgPartitioned(ClaimOrder::First, RoundTrips::Separate)
    );
}
