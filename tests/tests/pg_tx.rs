//! Transaction mode on PostgreSQL: the transaction suite (`common/tx.rs`)
//! against the server of `DATABASE_URL`, once for each `ClaimOrder`. The
//! business tables live in Postgres and the bodies write them through the
//! handler's transaction; each test has its own tables and drops them.

mod common;

use common::tx::StoreKind;
use idem_runtime::ClaimOrder;

/// `ClaimOrder::Last` (the default): the dedup row is inserted with the
/// outcome after the body; a duplicate's body runs and is rolled back.
mod claim_last {
    use super::{ClaimOrder, StoreKind};
    crate::common::tx::suite!(crate::common::PgDb, StoreKind::Pg(ClaimOrder::Last));
}

/// `ClaimOrder::First`: the claim is inserted before the body; a duplicate
/// is turned away before its body runs.
mod claim_first {
    use super::{ClaimOrder, StoreKind};
    crate::common::tx::suite!(crate::common::PgDb, StoreKind::Pg(ClaimOrder::First));
}
