// A store of the application's own whose transaction has a lifetime: the
// first parameter may name it with `'_` or `'static`, or as the store's
// `Tx`, and the rewritten function takes the store (or an `Arc` of it).
use std::sync::Arc;

use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{Failure, Standing, StoreTransaction, TxClaim, TxCommit, TxStore};
use idem_runtime::{Error, Key, Outcome, StoreError, idempotent};

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
        _: LedgerTx<'static>,
        _: &'static HandlerSpec,
        _: &Key,
        _: Option<&str>,
        _: &str,
    ) -> Result<TxCommit, StoreError> {
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
async fn credit(tx: &mut LedgerTx<'_>, msg: &PaymentCaptured) -> Result<usize, std::io::Error> {
    Ok(tx.journal.len() + msg.payment_id as usize)
}

#[idempotent(key = "payment_id", ttl = "24h", store = "crate::Ledger")]
async fn debit(tx: &mut LedgerTx<'static>, msg: &PaymentCaptured) -> Result<u64, std::io::Error> {
    let _ = tx.journal;
    Ok(msg.payment_id)
}

#[idempotent(key = "payment_id", ttl = "24h", store = "crate::Ledger")]
async fn refund(
    tx: &mut <Ledger as TxStore>::Tx,
    msg: &PaymentCaptured,
) -> Result<u64, std::io::Error> {
    let _ = tx.journal;
    Ok(msg.payment_id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error<std::io::Error>> {
    let msg = PaymentCaptured { payment_id: 3 };
    assert_eq!(credit(&Ledger, &msg).await?, Outcome::Executed(7));
    assert_eq!(debit(&Arc::new(Ledger), &msg).await?, Outcome::Executed(3));
    assert_eq!(refund(&Ledger, &msg).await?, Outcome::Executed(3));
    Ok(())
}
