//! `SqlStore`'s [`TxStore`] impl: transaction mode, claiming first or
//! last, with the dedup row sent apart or merged into the `COMMIT`.

use std::time::Duration;

use sqlx::Transaction;

use crate::error::{Contention, StoreError};
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{
    BatchItem, Failure, Standing, TxBatch, TxBatchCommit, TxClaim, TxCommit, TxStore,
};
use crate::store::rules::may_take;

use super::dialect::Fault;
use super::rider;
use super::statements;
use super::template::Values;
use super::{
    ClaimOrder, Dialect, ROLLBACK_TO_SAVEPOINT, Race, RoundTrips, SAVEPOINT, SqlStore, fault,
    template,
};

impl<D: Dialect> SqlStore<D> {
    /// The message of `statement` (in [`RoundTrips::Merged`]) when the
    /// store sends it so.
    pub(super) fn merged<'s>(
        &self,
        statement: &'s Option<template::Inline>,
    ) -> Option<&'s template::Inline> {
        statement
            .as_ref()
            .filter(|_| self.trips == RoundTrips::Merged)
    }

    /// Claims last with the outcome and commits, in one message
    /// ([`RoundTrips::Merged`]). When a record of the key stands, the
    /// message's insert fails: back before it (the body's writes kept),
    /// the claim goes on as claiming last on its own does, reading the
    /// record first: a duplicate costs one round trip more than claiming
    /// on its own does (the rollback to the savepoint; none on MySQL), a
    /// record the claim may take over (expired, or a failure to retry) at
    /// most three.
    pub(super) async fn commit_claim_merged(
        &self,
        mut tx: Transaction<'static, D>,
        message: &template::Inline,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<TxCommit, StoreError> {
        let Err(e) = D::run_message(&mut tx, message.text(values)).await else {
            // The message ends the transaction as the dialect does (a
            // `COMMIT` and a `BEGIN`, which leaves the connection where sqlx
            // believes it is; or the dialect's own end): dropping `tx`
            // queues its `ROLLBACK` of nothing, which leaves with the ping
            // the pool sends when the connection returns, in the background.
            return Ok(TxCommit::Committed);
        };
        let taken = match fault::<D>(&e) {
            Fault::Unique => {
                let savepoint = D::WITH_COMMIT.is_some_and(|with| with.savepoint);
                if savepoint
                    && let Err(back) = D::run_text(&mut tx, statements::BACK_BEFORE_DEDUP_ROW).await
                {
                    let _ = Self::rollback_tx(tx).await;
                    // No transaction to go back into: the unique key the
                    // error names is a deferred one of the body's tables,
                    // checked by the `COMMIT`, which rolled back. Anything
                    // else (the connection dropped) is the rollback's own.
                    return Err(self.err(if fault::<D>(&back) == Fault::NoTransaction {
                        e
                    } else {
                        back
                    }));
                }
                self.take_standing(&mut tx, spec, values).await
            }
            // Another transaction holds the key, or this one was a
            // deadlock victim: settled as claiming last settles them.
            Fault::LockWait | Fault::Deadlock => Err(e),
            _ => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        self.lost(tx, spec, values, taken).await
    }

    /// Claims last with the outcome, in `tx`, a key whose record stands:
    /// reads the record, and takes it over only where a claim may.
    pub(super) async fn take_standing(
        &self,
        tx: &mut D::Connection,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<Race, sqlx::Error> {
        match D::fetch(tx, &self.sql.select_latest, values).await? {
            Some(found) if !may_take(&found.record, found.now, spec, values.fingerprint) => {
                Ok(Race::Lost(Some(Box::new(found))))
            }
            _ => {
                self.take(tx, &self.sql.claim_with_outcome, spec, values)
                    .await
            }
        }
    }

    /// Claiming last with a read first ([`ClaimOrder::Checked`]): reads the
    /// key's record in `tx` and turns the delivery away when the record
    /// settles the key; otherwise hands `tx` to the body, and the insert
    /// after it decides as claiming last does.
    pub(super) async fn check_before_body(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<TxClaim<Transaction<'static, D>>, StoreError> {
        let values = self.stamped(spec.name, key, Duration::ZERO)?;
        // Sending values written in ([`RoundTrips::Merged`]), the read
        // rides with the call's session statement where the dialect has one
        // (MySQL): no round trip more than claiming last.
        let (tx, read) = match self.merged(&self.sql.session_select) {
            Some(message) => {
                let mut tx = self.begin_bare().await?;
                let read = D::fetch_message(&mut tx, message.text(&values), &values).await;
                (tx, read)
            }
            None => {
                let mut tx = self.begin().await?;
                let read = D::fetch(&mut tx, &self.sql.select, &values).await;
                (tx, read)
            }
        };
        let found = match read {
            Ok(found) => found,
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        match self.standing(found, spec, fingerprint) {
            // A live claim (a lease-mode handler's of the same name, in a
            // table shared with it) is left to the insert after the body,
            // as claiming last leaves it.
            None | Some(Standing::InProgress { .. }) => Ok(TxClaim::Fresh(tx)),
            Some(settled) => {
                Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
                Ok(TxClaim::Refused(settled))
            }
        }
    }

    /// The error of a claim row gone before its commit (see
    /// [`write_claimed`](Self::write_claimed)).
    pub(super) fn claim_row_gone(&self) -> sqlx::Error {
        sqlx::Error::Protocol(format!(
            "the claim row of this transaction is gone before its commit (on {}): the transaction ended while the body ran (a deadlock victim, an implicit commit, a COMMIT or ROLLBACK the body sent); nothing was recorded",
            self.sql.table
        ))
    }
}

impl<D: Dialect> TxStore for SqlStore<D> {
    type Tx = Transaction<'static, D>;

    fn store_name(&self) -> &'static str {
        D::STORE
    }

    async fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<TxClaim<Self::Tx>, StoreError> {
        match self.order_for(spec) {
            ClaimOrder::Last => return Ok(TxClaim::Fresh(self.begin().await?)),
            ClaimOrder::Checked => return self.check_before_body(spec, key, fingerprint).await,
            ClaimOrder::First => {}
        }
        let values = self.claim_values(spec, key, fingerprint, spec.ttl)?;
        let mut tx = self.begin().await?;
        let standing = match self.take(&mut tx, &self.sql.claim, spec, &values).await {
            Ok(Race::Won) => {
                // A failure is to be counted in the claim row: the body's
                // writes must be undoable without it.
                if spec.max_attempts.is_some()
                    && let Err(e) = D::run_text(&mut tx, SAVEPOINT).await
                {
                    let _ = Self::rollback_tx(tx).await;
                    return Err(self.err(e));
                }
                return Ok(TxClaim::Fresh(tx));
            }
            Ok(Race::Lost(found)) => self.standing(found.map(|f| *f), spec, fingerprint),
            // Another transaction holds the key past the lock timeout, or
            // this one was a deadlock victim: either way nothing of it
            // remains once it is rolled back.
            Err(e) if matches!(fault::<D>(&e), Fault::LockWait | Fault::Deadlock) => {
                Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
                return Ok(self.busy());
            }
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        // Changed between our conflict and our read: let the redelivery retry.
        Ok(standing.map_or_else(|| self.busy(), TxClaim::Refused))
    }

    async fn commit_outcome(
        &self,
        mut tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        // A consumer's write (its offset) that commits with the outcome.
        let rode = match rider::take(&self.pool) {
            Some(rider) => {
                if let Err(e) = rider.write(&mut tx).await {
                    let _ = Self::rollback_tx(tx).await;
                    return Err(self.err(e));
                }
                true
            }
            None => false,
        };
        let committed = self
            .record_outcome(tx, spec, key, fingerprint, outcome)
            .await;
        if rode && matches!(committed, Ok(TxCommit::Committed)) {
            rider::committed();
        }
        committed
    }

    async fn commit_failure(
        &self,
        mut tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        failure: Failure<'_>,
    ) -> Result<TxCommit, StoreError> {
        let trace = crate::store::settling_trace();
        let values = Values {
            trace: trace.as_deref(),
            status: failure.status().as_str(),
            outcome: failure.recorded(),
            error: Some(failure.text()),
            ..self.claim_values(spec, key, fingerprint, spec.ttl)?
        };
        if self.order_for(spec) == ClaimOrder::First && spec.max_attempts.is_some() {
            // The claim row holds the key throughout: undo the body's
            // writes, record the failure in the row, commit. No other
            // delivery runs between the failure and its count.
            let recorded = async {
                D::run_text(&mut tx, ROLLBACK_TO_SAVEPOINT).await?;
                self.write_claimed(&mut tx, &self.sql.fail_tx, &values)
                    .await
            }
            .await;
            if let Err(e) = recorded {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
            Self::commit_tx(tx).await.map_err(|e| self.err(e))?;
            return Ok(TxCommit::Committed);
        }
        // No claim row to keep (claiming last, or a final error of a handler
        // that does not count failures): roll everything back, then claim
        // the key anew with the failure.
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        let mut tx = self.begin().await?;
        let taken = self
            .take(&mut tx, &self.sql.claim_with_failure, spec, &values)
            .await;
        self.lost(tx, spec, &values, taken).await
    }

    async fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Option<Standing>, StoreError> {
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        if self.order_for(spec) == ClaimOrder::First {
            // The claim came first: a failing body was never a duplicate's.
            return Ok(None);
        }
        // Claiming last, a duplicate's body ran before the claim could turn
        // it away, and it may have failed for that very reason (the first
        // delivery took the stock). A live record that settles the key is
        // the answer: its outcome, its final error, or the other payload.
        // The rollback went through: the transaction's connection was fine.
        // A failure to read the record now is no reason to call the body's
        // failure a store failure; the body's error stands.
        self.check_handler(spec.name)?;
        match self.found(spec.name, key).await {
            Ok(found) => Ok(self.standing(found, spec, fingerprint).filter(|s| {
                matches!(
                    s,
                    Standing::Completed { .. }
                        | Standing::Failed { .. }
                        | Standing::Mismatch { .. }
                )
            })),
            Err(e) => {
                tracing::warn!(error = %e, "could not look the key up after the body failed; its own error stands");
                Ok(None)
            }
        }
    }

    async fn begin_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<TxBatch<Self::Tx>, StoreError> {
        self.begin_rows(spec, items).await
    }

    async fn commit_batch(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> Result<TxBatchCommit, StoreError> {
        self.commit_rows(tx, spec, items, outcomes).await
    }

    async fn rollback_batch(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))
    }

    fn contention(&self, error: &(dyn std::error::Error + 'static)) -> Option<Contention> {
        // A `sqlx::Error`, or the database error one holds: its `source`,
        // which a wrapper that is `#[error(transparent)]` over a
        // `sqlx::Error` hands on in its place.
        let db = match error.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(db)) => db,
            Some(_) => return None,
            None => error.downcast_ref::<Box<dyn sqlx::error::DatabaseError>>()?,
        };
        D::contention(db.as_ref())
    }
}
