//! Handlers registered under one name. This file is its own test binary on
//! purpose: the clashes poison every store and every handler call in it.
//!
//! Two clashes: `notify`, given explicitly to two handlers, and `send`, the
//! default name of two functions in different modules.

use idem_runtime::registry::{self, Clash, RegistryError};
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

mod marketing {
    use super::{Msg, Never};
    use idem_runtime::idempotent;

    #[idempotent(key = "id", ttl = "1h", store = "memory")]
    pub(super) async fn send(msg: &Msg) -> Result<u64, Never> {
        Ok(msg.id)
    }
}

mod sales {
    use super::{Msg, Never};
    use idem_runtime::idempotent;

    #[idempotent(key = "id", ttl = "1h", store = "memory")]
    pub(super) async fn send(msg: &Msg) -> Result<u64, Never> {
        Ok(msg.id)
    }
}

/// Three types in one module with a method of one name: their default names
/// clash, and so would `<module>::<function>`; the suggestions are numbered.
mod handlers {
    use super::{Msg, Never};
    use idem_runtime::idempotent;

    pub(super) struct Orders;
    pub(super) struct Refunds;
    pub(super) struct Returns;

    impl Orders {
        #[idempotent(key = "id", ttl = "1h", store = "memory")]
        pub(super) async fn handle(&self, msg: &Msg) -> Result<u64, Never> {
            Ok(msg.id)
        }
    }

    impl Refunds {
        #[idempotent(key = "id", ttl = "1h", store = "memory")]
        pub(super) async fn handle(&self, msg: &Msg) -> Result<u64, Never> {
            Ok(msg.id)
        }
    }

    impl Returns {
        #[idempotent(key = "id", ttl = "1h", store = "memory")]
        pub(super) async fn handle(&self, msg: &Msg) -> Result<u64, Never> {
            Ok(msg.id)
        }
    }
}

/// A handler with a name of its own: refused too, because the check is for
/// the whole binary.
#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "innocent")]
async fn innocent(tx: &mut SqliteTx<'_>, msg: &Msg) -> Result<u64, Never> {
    let _ = tx;
    Ok(msg.id)
}

/// `file:line` of the attribute of a handler in this file, checked against
/// the source: it must be one of the clashing attributes.
fn assert_place(spec: &registry::HandlerSpec, name_in_attribute: Option<&str>) {
    assert_eq!(spec.file, file!());
    let source = include_str!("registry_duplicate.rs");
    let text = source.lines().nth(spec.line as usize - 1).expect("a line");
    assert!(text.contains("#[idempotent("), "{text:?}");
    if let Some(name) = name_in_attribute {
        assert!(text.contains(&format!("name = \"{name}\"")), "{text:?}");
    }
}

#[test]
fn check_reports_every_clash_with_every_handler_and_the_names_to_add() {
    let err = registry::check().unwrap_err();
    let RegistryError::DuplicateNames { clashes } = &err else {
        panic!("unexpected {err:?}");
    };
    let names: Vec<&str> = clashes.iter().map(|c| c.name).collect();
    assert_eq!(names, ["handle", "notify", "send"]);
    for Clash { name, handlers } in clashes {
        let expected = if *name == "handle" { 3 } else { 2 };
        assert_eq!(handlers.len(), expected, "{name}");
        for h in handlers {
            assert_eq!(h.name, *name);
            assert_place(h, (*name == "notify").then_some("notify"));
        }
        assert_ne!(handlers[0].line, handlers[1].line);
    }

    let text = err.to_string();
    assert!(text.contains("cannot be retried away"), "{text}");
    for place in clashes.iter().flat_map(|c| &c.handlers) {
        assert!(
            text.contains(&format!(
                "{}::{} ({}:{})",
                place.module, place.function, place.file, place.line
            )),
            "{text}"
        );
    }
    // Same function name in two modules: the advice names the module.
    // Three methods in one module: distinct suggestions.
    assert!(text.contains("name = \"handlers::handle\" at"), "{text}");
    assert!(text.contains("name = \"handlers::handle_2\" at"), "{text}");
    let sales = &clashes[2].handlers[1];
    assert!(
        text.contains(&format!(
            "name = \"sales::send\" at {}:{}",
            sales.file, sales.line
        )),
        "{text}"
    );
    assert!(
        text.contains("keep `send` on the handler whose records already exist"),
        "{text}"
    );
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
            StoreError::Registry(RegistryError::DuplicateNames { clashes }) if clashes.len() == 3
        ),
        "{err:?}"
    );
    // Refused before it touched the file system.
    assert!(!dir.path().join("idem.db").exists());
}

#[tokio::test]
async fn every_handler_call_is_a_config_error_and_no_body_runs() {
    let store = MemoryStore::new();
    let err = billing::notify(&store, &Msg { id: 1 }).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Config {
                handler: "notify",
                source: RegistryError::DuplicateNames { .. },
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), "config");
    assert!(marketing::send(&store, &Msg { id: 1 }).await.is_err());
    assert!(sales::send(&store, &Msg { id: 1 }).await.is_err());
    for err in [
        handlers::Orders
            .handle(&store, &Msg { id: 1 })
            .await
            .unwrap_err(),
        handlers::Refunds
            .handle(&store, &Msg { id: 1 })
            .await
            .unwrap_err(),
        handlers::Returns
            .handle(&store, &Msg { id: 1 })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.kind(), "config", "{err:?}");
    }
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
                Error::Config {
                    source: RegistryError::DuplicateNames { .. },
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("notify"), "{err}");
    }
    assert_eq!(sqlite.count().await.unwrap(), 0);
}
