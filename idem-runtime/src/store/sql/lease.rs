//! `SqlStore`'s [`LeaseStore`] impl: lease mode.

use std::time::Duration;

use crate::clock::millis;
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::Status;
use crate::store::contract::{BatchItem, Claim, Failure, Held, LeaseStore, Standing};

use super::dialect::Fault;
use super::pool;
use super::template::Values;
use super::{CLAIM_RETRIES, Dialect, Race, SqlStore, fault};

impl<D: Dialect> LeaseStore for SqlStore<D> {
    fn store_name(&self) -> &'static str {
        D::STORE
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        for _ in 0..CLAIM_RETRIES {
            let token = uuid::Uuid::new_v4().simple().to_string();
            let values = Values {
                token: Some(&token),
                ..self.claim_values(spec, key, fingerprint, spec.lease)?
            };
            let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
            match self.take(&mut conn, &self.sql.claim, spec, &values).await {
                Ok(Race::Won) => return Ok(Claim::Fresh { token }),
                Ok(Race::Lost(found)) => {
                    if let Some(exhausted) = found
                        .as_ref()
                        .and_then(|f| Standing::of_ran_out(&f.record, spec, f.now))
                    {
                        // The stalled claim was the last failure allowed:
                        // count it, unless another claim did first.
                        let settle = Values {
                            hold: millis(spec.ttl),
                            ..values
                        };
                        match D::run(&mut conn, &self.sql.settle_ran_out, &settle).await {
                            Ok(done) if D::rows_affected(&done) == 1 => {
                                return Ok(Claim::Refused(exhausted));
                            }
                            Ok(_) => {}
                            Err(e) if fault::<D>(&e) == Fault::Deadlock => {}
                            Err(e) => return Err(self.err(e)),
                        }
                        continue;
                    }
                    if let Some(standing) = self.standing(found.map(|f| *f), spec, fingerprint) {
                        return Ok(Claim::Refused(standing));
                    }
                    // Gone, or changed, before it could be read: again.
                }
                Err(e) => match fault::<D>(&e) {
                    Fault::LockWait => {
                        return Ok(Claim::Refused(Standing::InProgress {
                            retry_after: self.lock_timeout(),
                        }));
                    }
                    Fault::Deadlock => {}
                    _ => return Err(self.err(e)),
                },
            }
        }
        Err(StoreError::Backend(Box::from(
            "the record kept changing while it was being claimed; retry the delivery",
        )))
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let trace = crate::store::settling_trace();
        let values = Values {
            token: Some(token),
            outcome: Some(outcome),
            trace: trace.as_deref(),
            ..self.stamped(spec.name, key, spec.ttl)?
        };
        if self.write(&self.sql.complete_lease, &values, None).await? == 1 {
            return Ok(true);
        }
        // The claim no longer holds the key: lost, or completed by this
        // very token (a completion whose reply was lost, tried again). The
        // completed row keeps its token, so the row says which.
        Ok(self.found(spec.name, key).await?.is_some_and(|found| {
            found.record.status == Status::Completed && found.record.token.as_deref() == Some(token)
        }))
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let trace = crate::store::settling_trace();
        let values = Values {
            token: Some(token),
            trace: trace.as_deref(),
            status: failure.status().as_str(),
            outcome: failure.recorded(),
            error: Some(failure.text()),
            ..self.stamped(spec.name, key, spec.ttl)?
        };
        Ok(self.write(&self.sql.fail_lease, &values, None).await? == 1)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        let values = Values {
            token: Some(token),
            ..self.stamped(spec.name, key, Duration::ZERO)?
        };
        self.write(&self.sql.release, &values, None).await?;
        Ok(())
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let values = Values {
            token: Some(token),
            ..self.stamped(spec.name, key, spec.lease)?
        };
        Ok(self.write(&self.sql.extend, &values, None).await? == 1)
    }

    async fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_rows(spec, items).await
    }

    async fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        self.complete_rows(spec, done).await
    }

    async fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        self.release_rows(spec, held).await
    }

    async fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.extend_rows(spec, held).await
    }
}
