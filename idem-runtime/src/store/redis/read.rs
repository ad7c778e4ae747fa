//! Reading a record: `GET`, `HMGET` and `PTTL` in one round trip, plain
//! commands (no function to load), so a user allowed only to read, or a
//! replica, can be inspected; the one that meets the other type says which
//! format the key holds.

use redis::{Cmd, Value};

use super::RedisStore;
use super::exec::{self, backend, reply_err};
use super::record::{self, read_hash};
use crate::error::StoreError;
use crate::key::Key;
use crate::store::Record;

impl RedisStore {
    /// The record of `key` under handler `handler`, if any, in this
    /// release's format or an earlier one's. `expires_at_ms` is the end the
    /// record was written with: its lease's end for a claim in progress (by
    /// the consumer's clock), and otherwise the moment Redis expires the
    /// key (by the server's clock: the ttl after it was completed, failed
    /// or counted), so two reads of an untouched record are equal. A settled
    /// record written by an earlier release, which does not keep its end,
    /// has it computed from the key's TTL at the read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// if let Some(r) = store.record("grant_points", &key).await? {
    ///     println!("{:?}, expires at {}: {:?}", r.status, r.expires_at_ms, r.outcome);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        self.read(handler, key.as_str()).await
    }

    /// The record of the stored key `key` under `handler`, if any: read
    /// with plain commands (no function to load), so a user allowed only
    /// to read, or a replica, can be inspected.
    pub(super) async fn read(
        &self,
        handler: &str,
        key: &str,
    ) -> Result<Option<Record>, StoreError> {
        let rkey = self.redis_key_of(handler, key);
        // A hash turned into a string between two commands reads again.
        for _ in 0..3 {
            let replies = self.send_all(&read_cmds(&rkey)).await?;
            if let Some(record) = read_replies(handler, key, replies, self.clock.now_millis())? {
                return Ok(record);
            }
        }
        Err(StoreError::Schema(format!(
            "{rkey} kept changing while it was read"
        )))
    }
}

/// The commands that read a record in either format: `GET` (a string
/// record), `HMGET` (a hash of an earlier release; the fields
/// [`read_hash`] takes, in its order) and `PTTL`. The one that meets the
/// other type answers `WRONGTYPE`.
pub(super) fn read_cmds(rkey: &str) -> [Cmd; 3] {
    let mut get = redis::cmd("GET");
    get.arg(rkey);
    let mut hmget = redis::cmd("HMGET");
    hmget
        .arg(rkey)
        .arg(&["s", "o", "c", "u", "l", "a", "f", "e", "p", "t"]);
    let mut pttl = redis::cmd("PTTL");
    pttl.arg(rkey);
    [get, hmget, pttl]
}

/// The record the replies to [`read_cmds`] read at `now`: `Some(None)`
/// for no record, `None` when the key changed type between the commands.
pub(super) fn read_replies(
    handler: &str,
    key: &str,
    replies: Vec<exec::Reply>,
    now: i64,
) -> Result<Option<Option<Record>>, StoreError> {
    let wrong_type = |r: &exec::Reply| matches!(r, Err(e) if e.code() == Some("WRONGTYPE"));
    let [get, hmget, pttl]: [exec::Reply; 3] = replies
        .try_into()
        .map_err(|_| StoreError::Schema("a read lost a reply".into()))?;
    let pttl = match pttl.map_err(backend)? {
        Value::Int(ms) => ms,
        other => return Err(reply_err("a read", &other)),
    };
    match (get, hmget) {
        (Ok(Value::BulkString(value)), _) => {
            // For a record that does not say when it ends.
            let by_ttl = now.saturating_add(pttl.max(0));
            record::decode(handler, key, &value, by_ttl).map(|r| Some(Some(r)))
        }
        (Ok(Value::Nil), Ok(fields)) => {
            let fields: Vec<Option<String>> =
                redis::from_redis_value(fields).map_err(StoreError::backend)?;
            if fields.iter().all(Option::is_none) {
                Ok(Some(None))
            } else {
                // Nil to GET, fields to HMGET: a hash that appeared between.
                Ok(None)
            }
        }
        (get, Ok(fields)) if wrong_type(&get) => {
            let fields: Vec<Option<String>> =
                redis::from_redis_value(fields).map_err(StoreError::backend)?;
            read_hash(handler, key, fields, pttl, now).map(Some)
        }
        // Nil to GET and a string to HMGET, or a type neither expected:
        // it changed between the commands.
        (Ok(Value::Nil), hmget) if wrong_type(&hmget) => Ok(None),
        (get, hmget) if wrong_type(&get) && wrong_type(&hmget) => Ok(None),
        (Ok(Value::Nil), Err(e)) | (Err(e), _) => Err(backend(e)),
        (Ok(other), _) => Err(reply_err("a read", &other)),
    }
}
