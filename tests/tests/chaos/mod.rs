//! What the chaos tests on the brokers (`broker_chaos.rs`, `kafka_chaos.rs`)
//! share: the message they publish and the transaction-mode handler that
//! applies it, whose effect counts in a business table of the run's own, so
//! that an effect applied twice shows as 2.

use idem_runtime::{PgTx, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;

/// A message of a chaos run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub(crate) message_id: i64,
    /// The business table (one per run).
    pub(crate) table: String,
}

/// Adds one to the message's row: an effect applied twice shows as 2.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "chaos_apply"
)]
pub(crate) async fn apply(tx: &mut PgTx<'_>, msg: &Applied) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES ($1, 1)
         ON CONFLICT (message_id) DO UPDATE SET applied = {0}.applied + 1 RETURNING applied",
        msg.table
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .fetch_one(&mut **tx)
        .await
}
