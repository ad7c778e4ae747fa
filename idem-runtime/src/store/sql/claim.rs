//! `SqlStore`'s claim loop: the values a statement binds, taking a row,
//! reading the record that stands, beginning and ending a transaction,
//! and recording an outcome: what both modes share.

use std::time::Duration;

use sqlx::Transaction;

use crate::clock::millis;
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{Standing, TxClaim, TxCommit};
use crate::store::rules::{live_standing, may_take};

use super::dialect::Fault;
use super::exec::Found;
use super::pool;
use super::statements::Take;
use super::template::{Statement, Values};
use super::{ClaimOrder, DEADLOCK_RETRIES, Dialect, Race, SqlStore, fault};

impl<D: Dialect> SqlStore<D> {
    /// The values of a statement on `key` of `handler`, with `hold` how
    /// long a lease or record it writes lasts from the database's now
    /// (`{until}`).
    pub(super) fn stamped<'a>(
        &self,
        handler: &'a str,
        key: &'a Key,
        hold: Duration,
    ) -> Result<Values<'a>, StoreError> {
        self.check_handler(handler)?;
        Ok(Values {
            handler,
            key: key.as_str(),
            hold: millis(hold),
            ..self.values()
        })
    }

    /// Refuses a handler name longer than the table holds.
    pub(super) fn check_handler(&self, handler: &str) -> Result<(), StoreError> {
        if handler.len() > D::MAX_HANDLER_LEN {
            return Err(StoreError::Schema(format!(
                "handler name {handler:?} is {} bytes long; the {} store's table holds at most {}",
                handler.len(),
                D::STORE,
                D::MAX_HANDLER_LEN
            )));
        }
        Ok(())
    }

    /// Runs `take` on `conn`: inserts the claim row, or takes over one a
    /// claim may take (see [`rows::claimable`]); otherwise reads the
    /// record that stands.
    pub(super) async fn take(
        &self,
        conn: &mut D::Connection,
        take: &Take,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<Race, sqlx::Error> {
        if D::rows_affected(&D::run(conn, &take.insert, values).await?) > 0 {
            return Ok(Race::Won);
        }
        let standing = D::fetch(conn, &self.sql.select_latest, values).await?;
        match (&take.take_over, standing) {
            (Some(take_over), Some(standing))
                if may_take(&standing.record, standing.now, spec, values.fingerprint) =>
            {
                if D::rows_affected(&D::run(conn, take_over, values).await?) > 0 {
                    return Ok(Race::Won);
                }
                // Another claim took it over first: what stands now.
                Ok(Race::Lost(
                    D::fetch(conn, &self.sql.select_latest, values)
                        .await?
                        .map(Box::new),
                ))
            }
            (_, standing) => Ok(Race::Lost(standing.map(Box::new))),
        }
    }

    /// Runs `statement` on its own (or in a transaction opened with `begin`)
    /// and returns how many rows it wrote. A deadlock victim, which the
    /// database rolled back whole, runs again.
    pub(super) async fn write(
        &self,
        statement: &Statement,
        values: &Values<'_>,
        begin: Option<&'static str>,
    ) -> Result<u64, StoreError> {
        let mut tries = 0;
        loop {
            let done = match begin {
                None => match pool::acquire(&self.pool).await {
                    Ok(mut conn) => D::run(&mut conn, statement, values).await,
                    Err(e) => Err(e),
                },
                Some(begin) => match pool::begin(&self.pool, Some(begin)).await {
                    Ok(mut tx) => match D::run(&mut tx, statement, values).await {
                        Ok(done) => tx.commit().await.map(|()| done),
                        Err(e) => {
                            // Now, not when the connection is next used.
                            let _ = tx.rollback().await;
                            Err(e)
                        }
                    },
                    Err(e) => Err(e),
                },
            };
            match done {
                Ok(done) => return Ok(D::rows_affected(&done)),
                Err(e) if tries < DEADLOCK_RETRIES && fault::<D>(&e) == Fault::Deadlock => {
                    tries += 1;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// What a record that did not let a claim take the key says to a
    /// delivery with `fingerprint`, at the database's now when the record
    /// was read; `None` when the record has changed since (expired, or
    /// claimable after all): the claim may be tried again.
    pub(super) fn standing(
        &self,
        found: Option<Found>,
        spec: &HandlerSpec,
        fingerprint: Option<&str>,
    ) -> Option<Standing> {
        let Found { record, now } = found?;
        live_standing(Some(&record), spec, fingerprint, now)
    }

    /// The values of a claim of `key` for a delivery with `fingerprint`: as
    /// [`stamped`](Self::stamped) for `hold`, with the handler's
    /// `max_attempts` and the start of its window.
    pub(super) fn claim_values<'a>(
        &self,
        spec: &'a HandlerSpec,
        key: &'a Key,
        fingerprint: Option<&'a str>,
        hold: Duration,
    ) -> Result<Values<'a>, StoreError> {
        let stamped = self.stamped(spec.name, key, hold)?;
        Ok(Values {
            fingerprint,
            max: spec.max_attempts.map(i64::from),
            ttl: millis(spec.ttl),
            ..stamped
        })
    }

    /// When a transaction-mode call of `spec` writes its dedup row: first
    /// for a handler that counts failures, whose count must be read and
    /// held before its body runs; otherwise as the store says.
    pub(super) fn order_for(&self, spec: &HandlerSpec) -> ClaimOrder {
        if spec.max_attempts.is_some() {
            ClaimOrder::First
        } else {
            self.order
        }
    }

    /// Someone else holds the key: retry after the lock timeout.
    pub(super) fn busy(&self) -> TxClaim<Transaction<'static, D>> {
        TxClaim::Refused(Standing::InProgress {
            retry_after: self.lock_timeout(),
        })
    }

    /// Opens a transaction-mode call's transaction. It ends with
    /// [`commit_tx`](Self::commit_tx) or [`rollback_tx`](Self::rollback_tx),
    /// which set the session back where the dialect's `BEGIN` changed it.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, D>, StoreError> {
        let mut tx = self.begin_bare().await?;
        if let Some(session) = D::CALL_SESSION
            && let Err(e) = D::run_text(&mut tx, session).await
        {
            let _ = Self::rollback_tx(tx).await;
            return Err(self.err(e));
        }
        Ok(tx)
    }

    /// Opens a transaction with the dialect's `BEGIN`, without the call's
    /// session statement ([`Dialect::CALL_SESSION`]), which the caller
    /// sends next.
    pub(super) async fn begin_bare(&self) -> Result<Transaction<'static, D>, StoreError> {
        pool::begin(&self.pool, D::BEGIN)
            .await
            .map_err(|e| self.err(e))
    }

    /// Commits a transaction-mode call's transaction ([`Dialect::END`]).
    pub(super) async fn commit_tx(mut tx: Transaction<'static, D>) -> Result<(), sqlx::Error> {
        match D::END {
            // sqlx still counts the transaction open: dropped, it queues a
            // `ROLLBACK` of nothing, which leaves with the ping the pool
            // sends when the connection returns.
            Some(end) => D::run_text(&mut tx, end.commit).await.map(drop),
            None => tx.commit().await,
        }
    }

    /// Rolls a transaction-mode call's transaction back ([`Dialect::END`]).
    pub(super) async fn rollback_tx(mut tx: Transaction<'static, D>) -> Result<(), sqlx::Error> {
        match D::END {
            Some(end) => D::run_text(&mut tx, end.rollback).await.map(drop),
            None => tx.rollback().await,
        }
    }

    /// The store's error for a driver error.
    /// Records `outcome` in the transaction-mode call's transaction and
    /// commits it ([`TxStore::commit_outcome`](crate::store::TxStore::commit_outcome) without the rider).
    pub(super) async fn record_outcome(
        &self,
        mut tx: Transaction<'static, D>,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        let trace = crate::store::settling_trace();
        let values = Values {
            outcome: Some(outcome),
            trace: trace.as_deref(),
            ..self.claim_values(spec, key, fingerprint, spec.ttl)?
        };
        let taken = match self.order_for(spec) {
            // The claim row is this transaction's: record the outcome in it.
            ClaimOrder::First => {
                match self
                    .write_claimed(&mut tx, &self.sql.complete_tx, &values)
                    .await
                {
                    Ok(()) => Ok(Race::Won),
                    Err(e) => {
                        let _ = Self::rollback_tx(tx).await;
                        return Err(self.err(e));
                    }
                }
            }
            ClaimOrder::Last | ClaimOrder::Checked => {
                match self.merged(&self.sql.claim_with_commit) {
                    Some(message) => {
                        return self.commit_claim_merged(tx, message, spec, &values).await;
                    }
                    // Claim-last found a live row: this delivery is a duplicate.
                    // Its body's writes roll back with the transaction.
                    None => {
                        self.take(&mut tx, &self.sql.claim_with_outcome, spec, &values)
                            .await
                    }
                }
            }
        };
        self.lost(tx, spec, &values, taken).await
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Runs `statement`, which writes the claim row this transaction holds
    /// (claiming first), and fails the call if the row is gone: the
    /// database ended the transaction (InnoDB rolls a deadlock victim back
    /// whole and ends it, and what the body sent after that is in a
    /// transaction of its own, which the caller rolls back; a statement of
    /// the body may have committed implicitly), and nothing may be
    /// committed as if the claim held.
    pub(super) async fn write_claimed(
        &self,
        tx: &mut Transaction<'static, D>,
        statement: &Statement,
        values: &Values<'_>,
    ) -> Result<(), sqlx::Error> {
        let done = D::run(tx, statement, values).await?;
        if D::rows_affected(&done) == 1 {
            return Ok(());
        }
        Err(self.claim_row_gone())
    }

    /// Settles a claim-last (or claim-again) statement that lost: rolls the
    /// transaction back and says what stands.
    pub(super) async fn lost(
        &self,
        tx: Transaction<'static, D>,
        spec: &HandlerSpec,
        values: &Values<'_>,
        taken: Result<Race, sqlx::Error>,
    ) -> Result<TxCommit, StoreError> {
        let standing = match taken {
            Ok(Race::Won) => {
                Self::commit_tx(tx).await.map_err(|e| self.err(e))?;
                return Ok(TxCommit::Committed);
            }
            Ok(Race::Lost(found)) => self.standing(found.map(|f| *f), spec, values.fingerprint),
            Err(e) if matches!(fault::<D>(&e), Fault::LockWait | Fault::Deadlock) => None,
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        Ok(TxCommit::Refused(standing.unwrap_or(
            Standing::InProgress {
                retry_after: self.lock_timeout(),
            },
        )))
    }
}
