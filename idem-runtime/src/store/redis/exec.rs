//! The Redis store's connection ([`Conn`]: one server or a cluster), how
//! commands are sent on it, one at a time or many in as few round trips as
//! the connection allows, and how their replies read.
//!
//! A batch on one server is one pipeline. On Redis Cluster, a batch's
//! commands are sent each on its own, all at once over the cluster
//! connection, which multiplexes them on its node connections (so they
//! still travel together, one round trip for the lot). Not pipelines:
//! redis-rs routes a pipeline by its first key and, when a node answers
//! one of its commands with a redirection (`MOVED`, `ASK`), sends the
//! whole pipeline again to where that one command was sent. While a slot
//! moves, its old master runs the commands of the keys it still has and
//! answers `ASK` for the others; a pipeline of two keys of that slot was
//! then sent whole to the importing master, after one `ASKING`, which ran
//! the first command there, for a key the old master still had (a claim
//! written beside the record it should have read, which also made moving
//! that key fail with `BUSYKEY`), and answered `MOVED` for the second, so
//! the batch went back and forth until it failed. A command on its own
//! follows its own redirection, as a single call's does.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::{DEFAULT_TIMEOUT, RedisStore};
use crate::error::StoreError;

/// The store's connection: to one server (it reconnects by itself), or to
/// a Redis Cluster.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Single",
            Conn::Cluster(_) => "Cluster",
        })
    }
}

impl Conn {
    /// Connects to one server (`redis://host:port/db`), with
    /// [`DEFAULT_TIMEOUT`] to connect and for each reply.
    pub(super) async fn single(client: redis::Client) -> Result<Conn, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(backend)?;
        Ok(Conn::Single(conn))
    }

    /// Connects to a Redis Cluster through any of its nodes.
    pub(super) async fn cluster(
        builder: redis::cluster::ClusterClientBuilder,
    ) -> Result<Conn, StoreError> {
        let client = builder
            .connection_timeout(DEFAULT_TIMEOUT)
            .response_timeout(DEFAULT_TIMEOUT)
            .retries(3)
            .build()
            .map_err(backend)?;
        let conn = client.get_async_connection().await.map_err(backend)?;
        Ok(Conn::Cluster(conn))
    }
}

/// A Redis error as the store reports it: a timeout as
/// [`StoreError::Timeout`], anything else as a backend error.
pub(super) fn backend(e: redis::RedisError) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(DEFAULT_TIMEOUT);
    }
    StoreError::backend(e)
}

/// A command's reply, or the error the server answered it with.
pub(super) type Reply = Result<Value, RedisError>;

/// What a server answered a command that must succeed.
pub(super) fn answered(reply: Reply) -> Result<Value, StoreError> {
    reply.map_err(backend)
}

/// A reply that is not one of those `what` answers.
pub(super) fn reply_err(what: &str, v: &Value) -> StoreError {
    StoreError::Schema(format!("unexpected reply to {what}: {v:?}"))
}

/// A server's answer as a [`Reply`].
fn reply(value: Value) -> Reply {
    match value {
        Value::ServerError(e) => Err(e.into()),
        value => Ok(value),
    }
}

/// Whether the server answered `e`, rather than the connection failing.
fn server_answered(e: &RedisError) -> bool {
    e.code().is_some()
}

/// Whether the server lacks the store's library (it never had it, or lost
/// it: a restart without persistence, a new cluster node).
fn no_script(r: &Reply) -> bool {
    matches!(r, Err(e) if e.code() == Some("ERR")
        && e.detail().is_some_and(|d| d.starts_with("Function not found")))
}

/// Whether a cluster node sent the command elsewhere or asked for it
/// again later: it did not run, and the cluster connection, given the
/// command on its own, follows the redirect or waits and retries.
fn redirected(r: &Reply) -> bool {
    matches!(r, Err(e) if matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
        )
    ))
}

impl RedisStore {
    /// Sends one command. A reply is `Ok` whatever it says, server errors
    /// included; `Err` when the connection failed or timed out.
    pub(super) async fn send(&self, cmd: &Cmd) -> Result<Reply, StoreError> {
        let sent = match &self.conn {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await,
        };
        match sent {
            Ok(value) => Ok(reply(value)),
            Err(e) if server_answered(&e) => Ok(Err(e)),
            Err(e) => Err(backend(e)),
        }
    }

    /// Sends one function call (`Lua::on` and its arguments), loading the
    /// store's library first if the server lacks it.
    pub(super) async fn call(&self, cmd: &Cmd) -> Result<Reply, StoreError> {
        let first = self.send(cmd).await?;
        if !no_script(&first) {
            return Ok(first);
        }
        self.load().await?;
        self.send(cmd).await
    }

    /// Loads the store's library (on every master of a cluster). Loading it
    /// again where it is replaces it with itself.
    async fn load(&self) -> Result<(), StoreError> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.library.source);
        match self.send(&load).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }

    /// The indexes of `rkeys` in groups that one command may name
    /// together, each of at most `most` keys: in order, on one server; by
    /// slot, on a cluster.
    pub(super) fn groups(&self, rkeys: &[String], most: usize) -> Vec<Vec<usize>> {
        let most = most.max(1);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        match &self.conn {
            Conn::Single(_) => {
                for i in 0..rkeys.len() {
                    match groups.last_mut() {
                        Some(group) if group.len() < most => group.push(i),
                        _ => groups.push(vec![i]),
                    }
                }
            }
            Conn::Cluster(_) => {
                let mut slots: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
                for (i, rkey) in rkeys.iter().enumerate() {
                    slots.entry(slot(rkey.as_bytes())).or_default().push(i);
                }
                for members in slots.into_values() {
                    groups.extend(members.chunks(most).map(<[usize]>::to_vec));
                }
            }
        }
        groups
    }

    /// Sends `cmds`, each on one key (or on keys of one slot, the first
    /// named first), and answers each one's reply in order, in one
    /// pipelined round trip (on a cluster, each command on its own, all
    /// sent at once). A function call the server could not run because it
    /// lacks the library runs again once the library is loaded; on a
    /// cluster, a command whose redirection the connection gave up
    /// following runs again on its own.
    pub(super) async fn send_all(&self, cmds: &[Cmd]) -> Result<Vec<Reply>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = match &self.conn {
            Conn::Single(c) => pipeline(&mut c.clone(), cmds.iter()).await?,
            Conn::Cluster(c) => each_alone(c, cmds).await?,
        };
        if replies.iter().any(no_script) {
            self.load().await?;
        }
        let again: Vec<usize> = (0..replies.len())
            .filter(|&i| no_script(&replies[i]) || redirected(&replies[i]))
            .collect();
        for i in again {
            replies[i] = self.send(&cmds[i]).await?;
        }
        Ok(replies)
    }
}

/// `cmds` in one pipeline on `conn`, each one's reply in order.
async fn pipeline<'c, C: ConnectionLike>(
    conn: &mut C,
    cmds: impl Iterator<Item = &'c Cmd>,
) -> Result<Vec<Reply>, StoreError> {
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    let n = pipe.len();
    let values = conn
        .req_packed_commands(&pipe, 0, n)
        .await
        .map_err(backend)?;
    if values.len() != n {
        return Err(StoreError::Schema(format!(
            "a pipeline of {n} commands answered {} replies",
            values.len()
        )));
    }
    Ok(values.into_iter().map(reply).collect())
}

/// `cmds` each on its own, all sent at once on the cluster connection,
/// each one's reply in order; `Err` when a connection failed or timed out.
async fn each_alone(conn: &ClusterConnection, cmds: &[Cmd]) -> Result<Vec<Reply>, StoreError> {
    let sent = cmds.iter().map(|cmd| {
        let mut conn = conn.clone();
        async move { conn.req_packed_command(cmd).await }
    });
    futures_util::future::join_all(sent)
        .await
        .into_iter()
        .map(|sent| match sent {
            Ok(value) => Ok(reply(value)),
            Err(e) if server_answered(&e) => Ok(Err(e)),
            Err(e) => Err(backend(e)),
        })
        .collect()
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// text between the first `{` and the first `}` after it, when not
/// empty), or of the whole key, modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) & 0x3fff
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in data {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_are_those_redis_computes() {
        // Values from `CLUSTER KEYSLOT` (Redis's own examples and records'
        // keys, tags with braces inside included).
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"123456789"), 0x31c3 & 0x3fff);
    }
}
