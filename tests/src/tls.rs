//! TLS servers of the tests' own, on free loopback ports, with
//! certificates the tests make ([`Certs`]): a PostgreSQL cluster
//! (`initdb`), a MariaDB, `redis-server`s, `nats-server`s and a RabbitMQ
//! node, each TLS only, each killed (and its directory removed) when its
//! value drops. The shared servers stay as they are.
//!
//! A server whose program is missing is [`unavailable`](crate::unavailable):
//! the test skips with a message, or fails under `IDEM_REQUIRE_SERVICES=1`;
//! one that is there and does not start fails the test
//! ([`ServerError`], [`started`]).

/// The server `server` started, or: a skip (a failure under
/// `IDEM_REQUIRE_SERVICES=1`) when a program it needs is not installed,
/// and a failure when it did not start.
pub fn started<T>(what: &str, server: Result<T, ServerError>) -> Option<T> {
    match server {
        Ok(s) => Some(s),
        Err(ServerError::Missing(why)) => {
            crate::unavailable(what, "127.0.0.1 (a server of the test's own)", why)
        }
        Err(e @ ServerError::Failed(_)) => panic!("{what}: {e}"),
    }
}

mod certs;
mod daemon;
mod mariadb;
mod nats;
mod postgres;
mod rabbitmq;
mod redis;

pub use certs::{Certs, MTLS_USER, Pair, SERVER_NAME};
pub use daemon::ServerError;
pub use mariadb::TlsMariaDb;
pub use nats::TlsNats;
pub use postgres::TlsPostgres;
pub use rabbitmq::TlsRabbitMq;
pub use redis::TlsRedis;
