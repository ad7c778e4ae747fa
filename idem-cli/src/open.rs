//! Stores by URL: what a URL names is read (and refused with one clear
//! line) before anything connects; then the store is opened within the
//! `--timeout`.

use std::str::FromStr as _;
use std::time::Duration;

use idem_runtime::tls::Tls;
use idem_runtime::{MySqlStore, PgStore, RedisStore, SqliteStore, StoreError};
use redis::IntoConnectionInfo as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;

use crate::Failure;
use crate::tls::explained;

/// The URL forms, for messages.
const FORMS: &str =
    "sqlite:PATH, postgres://..., mysql://..., mariadb://..., redis://... or rediss://...";

/// The kinds of store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    MySql,
    Redis,
}

impl Kind {
    /// The store's name, as `store = "..."` writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::MySql => "mysql",
            Kind::Redis => "redis",
        }
    }
}

/// What a URL was read as.
#[derive(Debug)]
enum Options {
    Sqlite(Box<SqliteConnectOptions>),
    Postgres(Box<PgConnectOptions>),
    MySql(Box<MySqlConnectOptions>),
    Redis { nodes: Vec<String>, cluster: bool },
}

/// A store named by a URL and the options, read but not connected.
#[derive(Debug)]
pub(crate) struct Target {
    options: Options,
    /// The URL with its password hidden, for messages.
    shown: String,
    table: String,
    prefix: String,
}

/// An open store.
#[derive(Debug)]
pub(crate) enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
    MySql(MySqlStore),
    Redis(RedisStore),
}

impl Target {
    /// Reads `url` and the options that go with it.
    pub(crate) fn parse(
        url: &str,
        table: Option<&str>,
        prefix: Option<&str>,
        cluster: bool,
    ) -> Result<Target, Failure> {
        let url = url.trim();
        let shown = redact(url);
        let scheme = url
            .split_once(':')
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default();
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            Failure::Usage(format!("bad {what} URL `{shown}`: {e}"))
        };
        let options = match scheme.as_str() {
            "sqlite" => {
                if url.contains(":memory:") || url.contains("mode=memory") {
                    return Err(Failure::Usage(format!(
                        "`{shown}` is an in-memory SQLite database, which holds no other process's records: name the database file (sqlite:PATH)"
                    )));
                }
                let options = SqliteConnectOptions::from_str(url).map_err(|e| bad("SQLite", &e))?;
                if options.get_filename().as_os_str().is_empty() {
                    return Err(Failure::Usage(format!(
                        "bad SQLite URL `{shown}`: it names no file (sqlite:PATH)"
                    )));
                }
                Options::Sqlite(Box::new(options))
            }
            "postgres" | "postgresql" => Options::Postgres(Box::new(
                PgConnectOptions::from_str(url).map_err(|e| bad("PostgreSQL", &e))?,
            )),
            "mysql" | "mariadb" => {
                let url = format!("mysql{}", &url[scheme.len()..]);
                Options::MySql(Box::new(
                    MySqlConnectOptions::from_str(&url).map_err(|e| bad("MySQL", &e))?,
                ))
            }
            "redis" | "rediss" => {
                let nodes: Vec<String> = if cluster {
                    url.split(',').map(|n| n.trim().to_owned()).collect()
                } else {
                    vec![url.to_owned()]
                };
                for node in &nodes {
                    if let Err(e) = node.as_str().into_connection_info() {
                        return Err(bad("Redis", &e));
                    }
                }
                Options::Redis { nodes, cluster }
            }
            _ => {
                return Err(Failure::Usage(format!(
                    "unsupported store URL `{shown}`: use {FORMS}"
                )));
            }
        };
        if cluster && !matches!(options, Options::Redis { .. }) {
            return Err(Failure::Usage(
                "--cluster is for Redis URLs (redis://node1,redis://node2)".into(),
            ));
        }
        let redis = matches!(options, Options::Redis { .. });
        if redis && table.is_some() {
            return Err(Failure::Usage(
                "--table is for SQL stores; a Redis store takes --prefix".into(),
            ));
        }
        if !redis && prefix.is_some() {
            return Err(Failure::Usage(
                "--prefix is for Redis stores; a SQL store takes --table".into(),
            ));
        }
        let table = table.unwrap_or("idem_keys");
        if !redis {
            SqliteStore::validate_table_name(table).map_err(|e| Failure::Usage(e.to_string()))?;
        }
        let prefix = prefix.unwrap_or(idem_runtime::store::redis::DEFAULT_PREFIX);
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(Failure::Usage(
                StoreError::InvalidPrefix {
                    prefix: prefix.to_owned(),
                }
                .to_string(),
            ));
        }
        Ok(Target {
            options,
            shown,
            table: table.to_owned(),
            prefix: prefix.to_owned(),
        })
    }

    /// The kind of store the URL names.
    pub(crate) fn kind(&self) -> Kind {
        match self.options {
            Options::Sqlite(_) => Kind::Sqlite,
            Options::Postgres(_) => Kind::Postgres,
            Options::MySql(_) => Kind::MySql,
            Options::Redis { .. } => Kind::Redis,
        }
    }

    /// The SQL table (or Redis prefix) the records are in.
    pub(crate) fn table(&self) -> String {
        match self.options {
            Options::Redis { .. } => self.prefix.clone(),
            _ => self.table.clone(),
        }
    }

    /// Connects, waiting at most `timeout` for the store to answer; over
    /// TLS with `tls` when given (a URL can ask for TLS by itself:
    /// `sslmode=`, `ssl-mode=`, `rediss://`).
    pub(crate) async fn open(
        &self,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<Store, Failure> {
        let shown = &self.shown;
        if tls.is_some() && matches!(self.options, Options::Sqlite(_)) {
            return Err(Failure::Usage(
                "the --tls-* flags (and IDEM_TLS_* variables) are for a store across the network: SQLite is a file".into(),
            ));
        }
        if let Options::Sqlite(options) = &self.options {
            let path = options.get_filename();
            if !path.is_file() {
                return Err(Failure::Store(format!(
                    "no SQLite database at `{}`",
                    path.display()
                )));
            }
        }
        let opened = async {
            Ok::<_, StoreError>(match &self.options {
                Options::Sqlite(options) => {
                    let options = (**options)
                        .clone()
                        .busy_timeout(idem_runtime::store::sql::sqlite::DEFAULT_BUSY_TIMEOUT);
                    Store::Sqlite(
                        SqliteStore::connect_with(options)
                            .await?
                            .with_table(&self.table)?,
                    )
                }
                Options::Postgres(options) => {
                    let pool = PgPoolOptions::new()
                        .max_connections(2)
                        .acquire_timeout(timeout);
                    let options = (**options).clone();
                    let options = match tls {
                        Some(tls) => tls.postgres(options).map_err(StoreError::from)?,
                        None => options,
                    };
                    Store::Postgres(
                        PgStore::connect_with(options, pool)
                            .await?
                            .with_table(&self.table)?,
                    )
                }
                Options::MySql(options) => {
                    let pool = MySqlPoolOptions::new()
                        .max_connections(2)
                        .acquire_timeout(timeout);
                    let options = (**options).clone();
                    let options = match tls {
                        Some(tls) => tls.mysql(options)?,
                        None => options,
                    };
                    Store::MySql(
                        MySqlStore::connect_with(options, pool)
                            .await?
                            .with_table(&self.table)?,
                    )
                }
                Options::Redis { nodes, cluster } => {
                    let store = match (tls, *cluster) {
                        (None, true) => RedisStore::connect_cluster(nodes).await?,
                        (None, false) => RedisStore::connect(&nodes[0]).await?,
                        (Some(tls), true) => RedisStore::connect_cluster_tls(nodes, tls).await?,
                        (Some(tls), false) => RedisStore::connect_tls(&nodes[0], tls).await?,
                    };
                    Store::Redis(store.with_prefix(&self.prefix)?)
                }
            })
        };
        match tokio::time::timeout(timeout, opened).await {
            Ok(Ok(store)) => Ok(store),
            Ok(Err(e)) => {
                let mut why = explained(&e);
                if let Options::Redis { nodes, .. } = &self.options
                    && tls.is_none()
                    && nodes
                        .iter()
                        .any(|n| n.to_ascii_lowercase().starts_with("redis://"))
                    && [
                        "reset by peer",
                        "broken pipe",
                        "unexpected end",
                        "connection closed",
                    ]
                    .iter()
                    .any(|sign| why.to_ascii_lowercase().contains(sign))
                {
                    why.push_str(" (the server dropped a plain-text client at once: if it takes TLS only, use rediss://)");
                }
                Err(Failure::Store(format!(
                    "cannot reach the store at `{shown}`: {why}"
                )))
            }
            Err(_) => Err(Failure::Store(format!(
                "the store at `{shown}` did not answer within {}s",
                timeout.as_secs()
            ))),
        }
    }
}

/// `url` with the password of every node (`user:password@`) replaced by
/// `***`.
pub(crate) fn redact(url: &str) -> String {
    url.split(',')
        .map(|node| {
            let Some((scheme, rest)) = node.split_once("://") else {
                return node.to_owned();
            };
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
                    let hidden = if userinfo.contains(':') { ":***" } else { "" };
                    format!("{scheme}://{user}{hidden}@{host}{path}")
                }
                None => node.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::{Kind, Target, redact};
    use crate::Failure;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/shop"),
            "postgres://app:***@db:5432/shop"
        );
        assert_eq!(redact("redis://:pw@cache/2"), "redis://:***@cache/2");
        assert_eq!(
            redact("redis://a:1@n1,redis://b:2@n2"),
            "redis://a:***@n1,redis://b:***@n2"
        );
        assert_eq!(redact("mysql://root@db/test"), "mysql://root@db/test");
        assert_eq!(redact("sqlite:data/idem.db"), "sqlite:data/idem.db");
    }

    #[test]
    fn urls_name_their_store() {
        let kind = |url: &str| Target::parse(url, None, None, false).map(|t| t.kind());
        assert_eq!(kind("sqlite:x.db").ok(), Some(Kind::Sqlite));
        assert_eq!(kind("sqlite://x.db").ok(), Some(Kind::Sqlite));
        assert_eq!(kind("postgresql://u@h/db").ok(), Some(Kind::Postgres));
        assert_eq!(kind("mariadb://root@h/test").ok(), Some(Kind::MySql));
        assert_eq!(kind("redis://127.0.0.1:6379").ok(), Some(Kind::Redis));
        for bad in [
            "http://x",
            "x.db",
            "",
            "postgres://h:99999999/db",
            "redis://[::1",
            "sqlite::memory:",
        ] {
            assert!(
                matches!(kind(bad), Err(Failure::Usage(_))),
                "{bad} was taken"
            );
        }
    }

    #[test]
    fn options_fit_their_store() {
        let parse = |url, table, prefix, cluster| Target::parse(url, table, prefix, cluster);
        assert!(matches!(
            parse("redis://h", Some("t"), None, false),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            parse("sqlite:x.db", None, Some("p"), false),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            parse("sqlite:x.db", None, None, true),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            parse("sqlite:x.db", Some("x; drop"), None, false),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            parse("redis://h", None, Some("{a}"), false),
            Err(Failure::Usage(_))
        ));
        let target = parse("redis://h", None, Some("billing"), false).ok();
        assert_eq!(target.map(|t| t.table()).as_deref(), Some("billing"));
    }
}
