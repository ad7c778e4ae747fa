//! Pieces shared by the examples: a throw-away database file, Redis clean-up,
//! and the benchmarks' medians and settings.

use std::path::PathBuf;

/// A fresh SQLite file under the system's temp directory, removed (with its
/// WAL files) when dropped.
#[derive(Debug)]
pub struct TempDb {
    path: PathBuf,
}

impl TempDb {
    /// A new, not yet existing, database path named after `name`.
    pub fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("idem-{name}-{}-{nanos}.db", std::process::id()));
        TempDb { path }
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Deletes every Redis key under `prefix:` (the examples' own keys).
pub async fn delete_redis_prefix(url: &str, prefix: &str) -> Result<u64, redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_manager().await?;
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            deleted += n;
        }
        cursor = next;
        if cursor == 0 {
            return Ok(deleted);
        }
    }
}

/// The median of benchmark samples (the upper middle one for an even count).
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A benchmark setting from the environment, or `default`.
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
