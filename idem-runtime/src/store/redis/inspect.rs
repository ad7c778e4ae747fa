//! [`Inspect`] for [`RedisStore`]: an operator's reads and deletions, on
//! records of either format.

use redis::{Cmd, Value};

use super::RedisStore;
use super::exec::{self, answered};
use super::keys::SCAN_COUNT;
use super::read::{read_cmds, read_replies};
use crate::error::StoreError;
use crate::store::Record;
use crate::store::ops::{Forgot, Inspect, Query, Schema, Stats, Swept};

impl RedisStore {
    /// The records of `handler` (or of every handler), in no order: the
    /// keys found by `SCAN`, read in pipelines of [`SCAN_COUNT`].
    async fn scan_records(&self, handler: Option<&str>) -> Result<Vec<Record>, StoreError> {
        let keys = self.scan(&self.pattern(handler)).await?;
        let found: Vec<(&str, &str)> = keys
            .iter()
            .filter_map(|rkey| self.parse_redis_key(rkey))
            .filter(|(h, _)| handler.is_none_or(|handler| *h == handler))
            .collect();
        let mut records = Vec::with_capacity(found.len());
        for batch in found.chunks(SCAN_COUNT) {
            let cmds: Vec<Cmd> = batch
                .iter()
                .flat_map(|(handler, key)| read_cmds(&self.redis_key_of(handler, key)))
                .collect();
            let mut replies = self.send_all(&cmds).await?.into_iter();
            let now = self.clock.now_millis();
            for (handler, key) in batch {
                let three: Vec<exec::Reply> = replies.by_ref().take(3).collect();
                match read_replies(handler, key, three, now)? {
                    Some(record) => records.extend(record),
                    // It changed type while the batch was read.
                    None => records.extend(self.read(handler, key).await?),
                }
            }
        }
        Ok(records)
    }
}

/// Redis expires its records by itself (key TTLs): [`Inspect::sweep`]
/// deletes nothing. Every operation reads records in this release's format
/// and in the hash format of earlier releases. Listing and counting `SCAN`
/// the keys of the store's prefix (on every master of a cluster) and read
/// the records in pipelines, so they take time in proportion to the
/// records; [`Inspect::list`] reads every record of the handler to sort
/// them.
impl Inspect for RedisStore {
    async fn lookup(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.read(handler, key).await
    }

    async fn list(&self, handler: &str, query: Query) -> Result<Vec<Record>, StoreError> {
        let records = self.scan_records(Some(handler)).await?;
        Ok(query.apply(records, self.clock.now_millis()))
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let records = self.scan_records(None).await?;
        let mut stats = Stats::new(self.clock.now_millis());
        for record in &records {
            stats.add(record);
        }
        Ok(stats)
    }

    async fn forget(&self, handler: &str, key: &str, force: bool) -> Result<Forgot, StoreError> {
        let Some(record) = self.read(handler, key).await? else {
            return Ok(Forgot::Absent);
        };
        let mut cmd = self.library.forget.on(&self.redis_key_of(handler, key));
        cmd.arg(if force { "1" } else { "0" })
            .arg(self.clock.now_millis());
        let done = answered(self.call(&cmd).await?)?;
        Ok(match done {
            Value::Int(1) => Forgot::Deleted(record),
            Value::Int(2) => Forgot::Refused(self.read(handler, key).await?.unwrap_or(record)),
            _ => Forgot::Absent,
        })
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        Ok(Swept::native())
    }

    async fn handlers(&self) -> Result<Vec<String>, StoreError> {
        let keys = self.scan(&self.pattern(None)).await?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|rkey| self.parse_redis_key(rkey))
            .map(|(handler, _)| handler.to_owned())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn schema(&self) -> Result<Schema, StoreError> {
        Ok(Schema::None)
    }
}
