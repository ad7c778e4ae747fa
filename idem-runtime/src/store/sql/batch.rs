//! Batches on the SQL stores: a whole batch's keys in one statement.
//!
//! A batch's rows (key, fingerprint, outcome, token), sorted by key, are
//! read by each database as a table ([`Dialect::BATCH_ROWS`]): PostgreSQL
//! takes them as one text array a column (`:keys`, `:fingerprints`,
//! `:outcomes`, `:tokens`, read with `unnest`), SQLite and MySQL as one
//! parameter, `:rows`, a JSON array of `{"k", "f", "o", "t"}` objects (read
//! with `json_each` and `JSON_TABLE`). A batch's inserts write one token,
//! bound once (`:token`). The statement text is fixed, whatever the batch
//! holds.
//!
//! * A lease-mode batch inserts every key as a claim in progress in one
//!   statement, in key order, leaving standing rows alone. When it inserted
//!   them all (every key fresh) that is the whole claim; otherwise one read
//!   of the batch's records says which claims are this batch's and what
//!   stands against the others. A record a claim may take over (expired,
//!   or a failure to retry) is taken one key at a time, by the single
//!   claim.
//! * A transaction-mode batch reads its records in one statement when it
//!   begins and writes its dedup rows, completed with their outcomes, in
//!   one statement at the commit (taking over expired rows one key at a
//!   time). If another delivery recorded one of its fresh keys meanwhile,
//!   the insert writes fewer rows than it should: everything rolls back
//!   and the runtime begins the batch again.
//! * Completion, extension and release are one statement each, fenced by
//!   each row's token. A batch's completion keeps the token in the
//!   completed row, so that a completion that wrote fewer rows than it was
//!   given can read back which ones.
//!
//! Rows are sent, and so inserted, in key order, so two batches that share keys lock
//! them in the same order instead of deadlocking; a deadlock that happens
//! anyway (the body's own writes) rolls the batch back and begins it again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::Transaction;

use super::exec::Found;
use super::pool;
use super::template::{Statement, Values};
use super::{Dialect, Fault, Race, SqlStore, fault};
use crate::clock::millis;
use crate::error::StoreError;
use crate::registry::HandlerSpec;
use crate::store::contract::{BatchItem, Claim, Held, LeaseStore, TxBatch, TxBatchCommit};
use crate::store::rules::may_take;

/// How many times a batch write that reached fewer rows than it was given
/// runs again at most, where rows are reached by their place (see
/// `SqlStore::write_again`).
const PLACE_RERUNS: usize = 3;

/// One batch row: key, fingerprint, outcome, token.
type Row<'a> = [Option<&'a str>; 4];

/// A batch row as it is sent as JSON: absent members read as NULL.
#[derive(serde::Serialize)]
struct Sent<'a> {
    k: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    f: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    o: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t: Option<&'a str>,
}

/// A batch's rows as they are bound, sorted by key: as one JSON document
/// (`:rows`), or, where the dialect binds arrays
/// ([`Dialect::ROWS_AS_ARRAYS`]), as one array a column, a column no row
/// has a value in left empty.
#[derive(Debug, Default)]
struct Bound<'a> {
    json: String,
    columns: [Vec<Option<&'a str>>; 4],
}

impl<'a> Bound<'a> {
    /// `rows` (those with a key), sorted by key, as dialect `D` binds them.
    fn new<D: Dialect>(rows: &[Row<'a>]) -> Result<Bound<'a>, StoreError> {
        let mut sorted: Vec<&Row<'a>> = rows.iter().filter(|r| r[0].is_some()).collect();
        sorted.sort_unstable_by(|a, b| a[0].cmp(&b[0]));
        if !D::ROWS_AS_ARRAYS {
            let sent: Vec<Sent<'_>> = sorted
                .iter()
                .filter_map(|&&[k, f, o, t]| Some(Sent { k: k?, f, o, t }))
                .collect();
            let json = serde_json::to_string(&sent).map_err(StoreError::backend)?;
            return Ok(Bound {
                json,
                ..Bound::default()
            });
        }
        let columns = [0, 1, 2, 3].map(|c| {
            if sorted.iter().any(|r| r[c].is_some()) {
                sorted.iter().map(|r| r[c]).collect()
            } else {
                Vec::new()
            }
        });
        Ok(Bound {
            json: String::new(),
            columns,
        })
    }

    /// `values` with these rows.
    fn values<'v>(&'v self, values: Values<'v>) -> Values<'v> {
        let [keys, fingerprints, outcomes, tokens] = &self.columns;
        Values {
            rows: &self.json,
            keys,
            fingerprints,
            outcomes,
            tokens,
            ..values
        }
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The values of a batch statement of `spec`, with rows `rows` and
    /// `hold` how long what it writes lasts from the database's now.
    fn batch_values<'a>(
        &self,
        spec: &'a HandlerSpec,
        rows: &'a Bound<'a>,
        hold: Duration,
    ) -> Result<Values<'a>, StoreError> {
        self.check_handler(spec.name)?;
        Ok(rows.values(Values {
            handler: spec.name,
            hold: millis(hold),
            max: spec.max_attempts.map(i64::from),
            ttl: millis(spec.ttl),
            ..self.values()
        }))
    }

    /// The records of `items`' keys, by key, each with the database's now.
    async fn batch_records(
        &self,
        conn: &mut D::Connection,
        spec: &HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<HashMap<String, Found>, sqlx::Error> {
        self.batch_records_with(conn, &self.sql.batch.select, spec, items)
            .await
    }

    /// The records `select` reads of `items`' keys, by key, each with the
    /// database's now.
    async fn batch_records_with(
        &self,
        conn: &mut D::Connection,
        select: &Statement,
        spec: &HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<HashMap<String, Found>, sqlx::Error> {
        let rows: Vec<Row<'_>> = items
            .iter()
            .map(|i| [Some(i.key.as_str()), None, None, None])
            .collect();
        let bound = Bound::new::<D>(&rows).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let values = bound.values(Values {
            handler: spec.name,
            ..self.values()
        });
        let records = D::records(conn, select, &values).await?;
        Ok(records
            .into_iter()
            .map(|f| (f.record.key.clone(), f))
            .collect())
    }

    /// The keys among `rows` whose row their token holds with `status`.
    async fn batch_held(
        &self,
        spec: &HandlerSpec,
        rows: &Bound<'_>,
        status: &'static str,
    ) -> Result<HashSet<String>, StoreError> {
        let values = rows.values(Values {
            handler: spec.name,
            status,
            ..self.values()
        });
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        let cells = D::cells(&mut conn, &self.sql.batch.held, &values, 1)
            .await
            .map_err(|e| self.err(e))?;
        Ok(cells
            .into_iter()
            .filter_map(|c| c.texts.into_iter().next())
            .collect())
    }

    /// Runs again a batch write that changed fewer rows (`wrote`) than it
    /// was given, where the dialect reaches rows by their place
    /// ([`Dialect::REACHES_BY_PLACE`]): a row another statement (the lease
    /// keeper extending the same claim) changed while the write waited for
    /// it has moved, and a server that rechecks the place against the new
    /// version passes it over. A run finds it where it is now; a row whose
    /// token changed stays untouched. Runs go on while they change rows
    /// and change another number of them than the run before (an
    /// extension changes its held rows again each run), at most
    /// [`PLACE_RERUNS`].
    async fn write_again(
        &self,
        statement: &Statement,
        values: &Values<'_>,
        wrote: u64,
    ) -> Result<(), StoreError> {
        if !D::REACHES_BY_PLACE {
            return Ok(());
        }
        let mut last = wrote;
        for _ in 0..PLACE_RERUNS {
            let now = self.write(statement, values, None).await?;
            if now == 0 || now == last {
                break;
            }
            last = now;
        }
        Ok(())
    }

    /// Runs a fenced batch update and answers per row whether it took:
    /// all of them when it wrote as many rows as it was given, otherwise
    /// the rows their tokens still hold with `status`.
    async fn fenced(
        &self,
        spec: &HandlerSpec,
        statement: &Statement,
        rows: &[Row<'_>],
        hold: Duration,
        status: &'static str,
        trace: Option<&str>,
    ) -> Result<Vec<bool>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let bound = Bound::new::<D>(rows)?;
        let values = Values {
            trace,
            ..self.batch_values(spec, &bound, hold)?
        };
        let wrote = self.write(statement, &values, None).await?;
        if wrote == rows.len() as u64 {
            return Ok(vec![true; rows.len()]);
        }
        self.write_again(statement, &values, wrote).await?;
        let held = self.batch_held(spec, &bound, status).await?;
        Ok(rows
            .iter()
            .map(|[key, ..]| key.is_some_and(|k| held.contains(k)))
            .collect())
    }

    pub(crate) async fn claim_rows(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if spec.max_attempts.is_some() {
            // A stalled claim's count is settled key by key (see `claim`).
            let mut claims = Vec::with_capacity(items.len());
            for item in items {
                claims.push(self.claim(spec, item.key, item.fingerprint).await?);
            }
            return Ok(claims);
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let rows: Vec<Row<'_>> = items
            .iter()
            .map(|i| [Some(i.key.as_str()), i.fingerprint, None, None])
            .collect();
        let bound = Bound::new::<D>(&rows)?;
        let values = Values {
            token: Some(&token),
            ..self.batch_values(spec, &bound, spec.lease)?
        };
        let inserted = self
            .write(&self.sql.batch.insert_claims, &values, None)
            .await?;
        if inserted == items.len() as u64 {
            return Ok(vec![Claim::Fresh { token }; items.len()]);
        }
        let mut claims = Vec::with_capacity(items.len());
        let sorted = self.sort_out(spec, items, &token, &mut claims).await;
        match sorted {
            Ok(()) => Ok(claims),
            Err(e) => {
                // Free what this batch took before the failure: its own
                // rows (the token fences them) and the single claims.
                let mut held: Vec<Held<'_>> = items
                    .iter()
                    .map(|item| Held {
                        key: item.key,
                        token: &token,
                    })
                    .collect();
                held.extend(super::super::contract::held(items, &claims));
                if let Err(e) = self.release_rows(spec, &held).await {
                    tracing::warn!(error = %e, "could not release a batch's claims; they free themselves when their leases run out");
                }
                Err(e)
            }
        }
    }

    /// After a batch's insert took fewer keys than it holds: reads which
    /// claims are the batch's (token `token`) and what stands against the
    /// others, taking over one by one what a claim may take.
    async fn sort_out(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        token: &str,
        claims: &mut Vec<Claim>,
    ) -> Result<(), StoreError> {
        let records = {
            let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
            self.batch_records(&mut conn, spec, items)
                .await
                .map_err(|e| self.err(e))?
        };
        for item in items {
            let found = records.get(item.key.as_str());
            let ours = found.is_some_and(|f| {
                f.record.token.as_deref() == Some(token)
                    && f.record.status == crate::store::Status::InProgress
            });
            if ours {
                claims.push(Claim::Fresh {
                    token: token.to_owned(),
                });
                continue;
            }
            match self.standing(found.cloned(), spec, item.fingerprint) {
                Some(standing) => claims.push(Claim::Refused(standing)),
                // Absent after all, expired, or a failure to retry: the
                // single claim takes it over by the rules.
                None => claims.push(self.claim(spec, item.key, item.fingerprint).await?),
            }
        }
        Ok(())
    }

    pub(crate) async fn complete_rows(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let rows: Vec<Row<'_>> = done
            .iter()
            .map(|(h, outcome)| [Some(h.key.as_str()), None, Some(*outcome), Some(h.token)])
            .collect();
        let trace = crate::store::settling_trace();
        self.fenced(
            spec,
            &self.sql.batch.complete,
            &rows,
            spec.ttl,
            "completed",
            trace.as_deref(),
        )
        .await
    }

    pub(crate) async fn extend_rows(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let rows: Vec<Row<'_>> = held
            .iter()
            .map(|h| [Some(h.key.as_str()), None, None, Some(h.token)])
            .collect();
        self.fenced(
            spec,
            &self.sql.batch.extend,
            &rows,
            spec.lease,
            "in_progress",
            None,
        )
        .await
    }

    pub(crate) async fn release_rows(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        if held.is_empty() {
            return Ok(());
        }
        let rows: Vec<Row<'_>> = held
            .iter()
            .map(|h| [Some(h.key.as_str()), None, None, Some(h.token)])
            .collect();
        let bound = Bound::new::<D>(&rows)?;
        let values = self.batch_values(spec, &bound, Duration::ZERO)?;
        let released = self.write(&self.sql.batch.release, &values, None).await?;
        if released < rows.len() as u64 {
            self.write_again(&self.sql.batch.release, &values, released)
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn begin_rows(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<TxBatch<Transaction<'static, D>>, StoreError> {
        if spec.max_attempts.is_some() {
            return Err(StoreError::Unsupported {
                store: D::STORE,
                what: "run a batch of a handler with max_attempts",
            });
        }
        let mut tx = self.begin().await?;
        let records = match self.batch_records(&mut tx, spec, items).await {
            Ok(records) => records,
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        let standings = items
            .iter()
            .map(|item| {
                let found = records.get(item.key.as_str()).cloned();
                self.standing(found, spec, item.fingerprint)
            })
            .collect();
        Ok(TxBatch { tx, standings })
    }

    pub(crate) async fn commit_rows(
        &self,
        mut tx: Transaction<'static, D>,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> Result<TxBatchCommit, StoreError> {
        let written = self.write_rows(&mut tx, spec, items, outcomes).await;
        match written {
            Ok(true) => {
                Self::commit_tx(tx).await.map_err(|e| self.err(e))?;
                Ok(TxBatchCommit::Committed)
            }
            Ok(false) => {
                Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
                Ok(TxBatchCommit::Lost)
            }
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                match fault::<D>(&e) {
                    // The database rolled the transaction back: begin again.
                    Fault::Deadlock => Ok(TxBatchCommit::Lost),
                    _ => Err(self.err(e)),
                }
            }
        }
    }

    /// Writes the dedup rows of the fresh keys (those with an outcome) in
    /// `tx`, marked with one token; `false` when one of them was taken
    /// meanwhile.
    async fn write_rows(
        &self,
        tx: &mut Transaction<'static, D>,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> Result<bool, sqlx::Error> {
        let protocol = |e: StoreError| sqlx::Error::Protocol(e.to_string());
        let token = uuid::Uuid::new_v4().simple().to_string();
        let fresh: Vec<(&BatchItem<'_>, &str)> = items
            .iter()
            .zip(outcomes)
            .filter_map(|(item, outcome)| Some((item, (*outcome)?)))
            .collect();
        if fresh.is_empty() {
            return Ok(true);
        }
        let rows: Vec<Row<'_>> = fresh
            .iter()
            .map(|(item, outcome)| {
                [
                    Some(item.key.as_str()),
                    item.fingerprint,
                    Some(*outcome),
                    None,
                ]
            })
            .collect();
        let bound = Bound::new::<D>(&rows).map_err(protocol)?;
        let trace = crate::store::settling_trace();
        let values = Values {
            token: Some(&token),
            trace: trace.as_deref(),
            ..self
                .batch_values(spec, &bound, spec.ttl)
                .map_err(protocol)?
        };
        let done = D::run(tx, &self.sql.batch.insert_completed, &values).await?;
        if D::rows_affected(&done) == fresh.len() as u64 {
            return Ok(true);
        }
        // Some keys have a row: this batch's own (a key it holds twice
        // cannot be, the runtime sends distinct keys), one that expired or
        // failed and may be taken over, or one another delivery recorded.
        let fresh_items: Vec<BatchItem<'_>> = fresh.iter().map(|(item, _)| **item).collect();
        let records = self
            .batch_records_with(tx, &self.sql.batch.select_latest, spec, &fresh_items)
            .await?;
        for (item, outcome) in fresh {
            let found = records.get(item.key.as_str());
            if found.is_some_and(|f| f.record.token.as_deref() == Some(token.as_str())) {
                continue;
            }
            let values = Values {
                outcome: Some(outcome),
                trace: trace.as_deref(),
                ..self
                    .claim_values(spec, item.key, item.fingerprint, spec.ttl)
                    .map_err(protocol)?
            };
            if found.is_some_and(|f| !may_take(&f.record, f.now, spec, item.fingerprint)) {
                return Ok(false);
            }
            if !matches!(
                self.take(tx, &self.sql.claim_with_outcome, spec, &values)
                    .await?,
                Race::Won
            ) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
