// A store of the application's own fixes the transaction type too: a first
// parameter of another store's transaction is one error, on that
// parameter, naming the store's transaction.
use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{Failure, Standing, StoreTransaction, TxClaim, TxCommit, TxStore};
use idem_runtime::{Key, SqliteTx, StoreError, idempotent};

struct Ledger;

struct LedgerTx<'a> {
    journal: &'a str,
}

impl StoreTransaction for LedgerTx<'_> {}

impl TxStore for Ledger {
    type Tx = LedgerTx<'static>;

    fn store_name(&self) -> &'static str {
        "ledger"
    }

    async fn begin_claim(
        &self,
        _: &'static HandlerSpec,
        _: &Key,
        _: Option<&str>,
    ) -> Result<TxClaim<LedgerTx<'static>>, StoreError> {
        Ok(TxClaim::Fresh(LedgerTx { journal: "main" }))
    }

    async fn commit_outcome(
        &self,
        tx: LedgerTx<'static>,
        _: &'static HandlerSpec,
        _: &Key,
        _: Option<&str>,
        _: &str,
    ) -> Result<TxCommit, StoreError> {
        let _ = tx.journal;
        Ok(TxCommit::Committed)
    }

    async fn commit_failure(
        &self,
        _: LedgerTx<'static>,
        _: &'static HandlerSpec,
        _: &Key,
        _: Option<&str>,
        _: Failure<'_>,
    ) -> Result<TxCommit, StoreError> {
        Ok(TxCommit::Committed)
    }

    async fn rollback(
        &self,
        _: LedgerTx<'static>,
        _: &'static HandlerSpec,
        _: &Key,
        _: Option<&str>,
    ) -> Result<Option<Standing>, StoreError> {
        Ok(None)
    }
}

struct PaymentCaptured {
    payment_id: u64,
}

#[idempotent(key = "payment_id", ttl = "24h", store = "crate::Ledger")]
async fn credit(tx: &mut SqliteTx<'_>, msg: &PaymentCaptured) -> Result<u64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.payment_id)
}

fn main() {}
