//! The Redis key of a record, `<prefix>:{<len>:<handler>|<key>}` (the
//! braces are a hash tag: on Redis Cluster a record lives in one slot), how
//! it reads back, and finding the keys of records by `SCAN`, on the server
//! or on every master of a cluster.

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::RedisStore;
use super::exec::{Conn, backend, reply_err};
use super::record;
use crate::error::StoreError;
use crate::key::Key;

/// How many keys one `SCAN` call looks at.
pub(super) const SCAN_COUNT: usize = 1_000;

impl RedisStore {
    /// The Redis key of a record.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(store: idem_runtime::RedisStore) {
    /// let key = idem_runtime::Key::from_parts(&[&"m-1"]).unwrap();
    /// assert_eq!(store.redis_key("grant_points", &key), "idem:{12:grant_points|3:m-1}");
    /// # }
    /// ```
    pub fn redis_key(&self, handler: &str, key: &Key) -> String {
        self.redis_key_of(handler, key.as_str())
    }

    /// The Redis key of the record of stored key `key` under `handler`.
    pub(super) fn redis_key_of(&self, handler: &str, key: &str) -> String {
        // The handler name is length-prefixed like the key's parts, so no two
        // (handler, key) pairs share a Redis key whatever the name holds.
        let mut rkey = String::with_capacity(self.prefix.len() + handler.len() + key.len() + 8);
        rkey.push_str(&self.prefix);
        rkey.push_str(":{");
        record::push_int(&mut rkey, i64::try_from(handler.len()).unwrap_or(i64::MAX));
        rkey.push(':');
        rkey.push_str(handler);
        rkey.push('|');
        rkey.push_str(key);
        rkey.push('}');
        rkey
    }

    /// The handler and the stored key of a Redis key of this store's
    /// prefix; `None` for any other key.
    pub(super) fn parse_redis_key<'k>(&self, rkey: &'k str) -> Option<(&'k str, &'k str)> {
        let inner = rkey
            .strip_prefix(&*self.prefix)?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        let (len, rest) = inner.split_once(':')?;
        let len: usize = len.parse().ok()?;
        if !rest.is_char_boundary(len) {
            return None;
        }
        let (handler, rest) = rest.split_at_checked(len)?;
        Some((handler, rest.strip_prefix('|')?))
    }

    /// The `SCAN` pattern of the records of `handler`, or of every record:
    /// glob characters in the prefix and the name are escaped.
    pub(super) fn pattern(&self, handler: Option<&str>) -> String {
        match handler {
            Some(handler) => format!(
                "{}:{{{}:{}|*",
                glob_escape(&self.prefix),
                handler.len(),
                glob_escape(handler)
            ),
            None => format!("{}:{{*", glob_escape(&self.prefix)),
        }
    }

    /// Every key matching `pattern`: on the server, or on every master of
    /// the cluster. Keys that are not UTF-8 are not this store's.
    pub(super) async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        match &self.conn {
            Conn::Single(c) => {
                let mut c = c.clone();
                let mut cursor = 0u64;
                loop {
                    let (next, batch): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern)
                        .query_async(&mut c)
                        .await
                        .map_err(backend)?;
                    keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(c) => {
                let mut c = c.clone();
                for (host, port) in masters(&mut c).await? {
                    let node =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let mut cursor = 0u64;
                    loop {
                        let reply = c
                            .route_command(scan_cmd(cursor, pattern), node.clone())
                            .await
                            .map_err(backend)?;
                        let (next, batch): (u64, Vec<Vec<u8>>) =
                            redis::from_redis_value(reply).map_err(StoreError::backend)?;
                        keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// `SCAN cursor MATCH pattern COUNT n`.
fn scan_cmd(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    cmd
}

/// The addresses of the cluster's masters, from `CLUSTER SLOTS`.
async fn masters(c: &mut ClusterConnection) -> Result<Vec<(String, u16)>, StoreError> {
    let reply = c
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(backend)?;
    let unexpected = || reply_err("CLUSTER SLOTS", &reply);
    let Value::Array(ranges) = &reply else {
        return Err(unexpected());
    };
    let mut masters = Vec::new();
    for range in ranges {
        // [start, end, [host, port, id, ...], replicas...]
        let Value::Array(range) = range else {
            return Err(unexpected());
        };
        let Some(Value::Array(master)) = range.get(2) else {
            return Err(unexpected());
        };
        let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
            return Err(unexpected());
        };
        let host: String = redis::from_redis_value_ref(host).map_err(StoreError::backend)?;
        let port = u16::try_from(*port).map_err(|_| unexpected())?;
        masters.push((host, port));
    }
    masters.sort();
    masters.dedup();
    Ok(masters)
}

/// `text` with Redis's glob characters escaped, to match as itself in a
/// `SCAN ... MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("plain_name"), "plain_name");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
