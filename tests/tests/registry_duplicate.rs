//! Two handlers registered under one name. This file is its own test binary
//! on purpose: the clash poisons every store and every handler call in it.

use idem_runtime::registry::{self, RegistryError};
use idem_runtime::{Error, MemoryStore, SqliteStore, SqliteTx, StoreError, idempotent};

#[derive(Debug)]
struct Msg {
    id: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

mod billing {
    use super::{Msg, Never};
    use idem_runtime::idempotent;

    #[idempotent(key = "id", ttl = "1h", store = "memory", name = "notify")]
    pub(super) async fn notify(msg: &Msg) -> Result<u64, Never> {
        Ok(msg.id)
    }
}

mod shipping {
    use super::{Msg, Never};
    use idem_runtime::{SqliteTx, idempotent};

    #[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "notify")]
    pub(super) async fn notify(tx: &mut SqliteTx<'_>, msg: &Msg) -> Result<u64, Never> {
        let _ = tx;
        Ok(msg.id)
    }
}

/// A third handler with a name of its own: refused too, because the check
/// is for the whole binary.
#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "innocent")]
async fn innocent(tx: &mut SqliteTx<'_>, msg: &Msg) -> Result<u64, Never> {
    let _ = tx;
    Ok(msg.id)
}

#[test]
fn check_refuses_the_shared_name_and_names_both_places() {
    let err = registry::check().unwrap_err();
    let RegistryError::DuplicateName {
        name,
        first,
        second,
    } = &err
    else {
        panic!("unexpected {err:?}");
    };
    assert_eq!(*name, "notify");
    // Each place is `file:line` of one of the two attributes above.
    let source = include_str!("registry_duplicate.rs");
    let mut lines = Vec::new();
    for place in [first, second] {
        let (file, line) = place.rsplit_once(':').expect("file:line");
        assert_eq!(file, file!(), "{place}");
        let line: usize = line.parse().expect("a line number");
        let text = source.lines().nth(line - 1).expect("line in this file");
        assert!(
            text.contains("#[idempotent(") && text.contains("name = \"notify\""),
            "{place} is not one of the clashing attributes: {text:?}"
        );
        lines.push(line);
    }
    assert_ne!(lines[0], lines[1], "both places are the same: {err}");
    let expected = [first.clone(), second.clone()];
    let text = err.to_string();
    assert!(text.contains("notify"), "{text}");
    assert!(
        text.contains(&expected[0]) && text.contains(&expected[1]),
        "{text}"
    );
    assert!(text.contains("name = \"...\""), "{text}");

    let both: Vec<_> = registry::handlers()
        .filter(|h| h.name == "notify")
        .collect();
    assert_eq!(both.len(), 2);
}

#[tokio::test]
async fn opening_a_sqlite_store_fails() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::Registry(RegistryError::DuplicateName { name: "notify", .. })
        ),
        "{err:?}"
    );
    // Refused before it touched the file system.
    assert!(!dir.path().join("idem.db").exists());
}

#[tokio::test]
async fn every_handler_call_is_a_store_error_and_no_body_runs() {
    let store = MemoryStore::new();
    let err = billing::notify(&store, &Msg { id: 1 }).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Store {
                handler: "notify",
                source: StoreError::Registry(_),
                key: Some(_),
            }
        ),
        "{err:?}"
    );
    assert!(store.is_empty(), "a record was written despite the clash");

    // A store built from a pool skips the start-up check; the call still
    // refuses, in transaction mode as in lease mode.
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let sqlite = SqliteStore::from_pool(pool);
    sqlite.migrate().await.unwrap();
    for err in [
        shipping::notify(&sqlite, &Msg { id: 2 }).await.unwrap_err(),
        innocent(&sqlite, &Msg { id: 3 }).await.unwrap_err(),
    ] {
        assert!(
            matches!(
                &err,
                Error::Store {
                    source: StoreError::Registry(RegistryError::DuplicateName { .. }),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("notify"), "{err}");
    }
    assert_eq!(sqlite.count().await.unwrap(), 0);
}
