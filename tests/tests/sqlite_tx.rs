//! Transaction mode on SQLite: the transaction suite (`common/tx.rs`), each
//! test on a database file of its own. The claim, the body's writes (an
//! `inventory` update and a `ledger` insert in the same file) and the
//! recorded outcome commit together or not at all.

use crate::common;

use common::tx::StoreKind;

common::tx::suite!(common::Db, StoreKind::Sqlite);
