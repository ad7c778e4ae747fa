//! Keys as the handlers derive them: what the body sees through `key: &Key`,
//! that `Key::from_parts` / `KeyBuilder` rebuild the same key for operator
//! look-ups, that the encoding keeps different parts apart, that long keys are
//! stored as a digest, and that handler names scope keys.

use crate::common;

use common::{AppError, Db, Probe};
use idem_runtime::store::Status;
use idem_runtime::{Key, KeyBuilder, MemoryStore, Outcome, SqliteTx, idempotent};

#[derive(Debug)]
struct OrderPlaced {
    order_id: String,
    sku: String,
    qty: i64,
}

/// Passes its own key on, as the idempotency key of a downstream call would
/// be: here into the ledger row it writes through the transaction.
#[idempotent(
    key = "msg.order_id + msg.sku",
    ttl = "1h",
    store = "sqlite",
    name = "keys_tx"
)]
async fn reserve(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
    key: &idem_runtime::Key,
    probe: &Probe,
) -> Result<String, AppError> {
    probe.hit();
    probe.see(key.as_str());
    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, ?)")
        .bind(key.as_str())
        .bind(msg.qty)
        .execute(&mut **tx)
        .await?;
    Ok(key.as_str().to_owned())
}

#[tokio::test]
async fn transaction_body_reads_its_own_key_and_from_parts_rebuilds_it() {
    let db = Db::new().await;
    let probe = Probe::new();
    let msg = OrderPlaced {
        order_id: "A-17".into(),
        sku: "apple".into(),
        qty: 2,
    };

    let out = reserve(&db.store, &msg, &probe).await.unwrap();
    let key = Key::from_parts(&[&msg.order_id, &msg.sku]).unwrap();
    assert_eq!(key.as_str(), "4:A-17|5:apple");
    assert_eq!(out, Outcome::Executed(key.as_str().to_owned()));
    assert_eq!(probe.seen(), [key.as_str()]);
    assert_eq!(db.ledger_rows(key.as_str()).await, 1);

    let rec = db.store.record("keys_tx", &key).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.key, key.as_str());
    assert_eq!(rec.attempts, 1);
    assert_eq!(
        rec.outcome.as_deref(),
        Some(serde_json::to_string(key.as_str()).unwrap().as_str())
    );
    // The same look-up under another handler name finds nothing.
    assert!(db.store.record("keys_other", &key).await.unwrap().is_none());

    assert_eq!(
        reserve(&db.store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(key.as_str().to_owned())
    );
    assert_eq!(probe.runs(), 1);
}

#[derive(Debug)]
struct Pair {
    a: String,
    b: String,
}

#[idempotent(
    key = "msg.a + msg.b",
    ttl = "1h",
    store = "memory",
    name = "keys_pair"
)]
async fn pair(msg: &Pair, key: &Key, probe: &Probe) -> Result<String, AppError> {
    probe.hit();
    Ok(format!("{}+{} -> {}", msg.a, msg.b, key.as_str()))
}

#[tokio::test]
async fn lease_body_reads_its_own_key() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Pair {
        a: "x".into(),
        b: "y".into(),
    };
    let out = pair(&store, &msg, &probe).await.unwrap();
    assert_eq!(out, Outcome::Executed("x+y -> 1:x|1:y".to_string()));
    let key = Key::from_parts(&[&"x", &"y"]).unwrap();
    let rec = store.record("keys_pair", &key).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempts, rec.outcome.as_deref()),
        (Status::Completed, 1, Some("\"x+y -> 1:x|1:y\""))
    );
}

#[tokio::test]
async fn separator_characters_inside_parts_never_make_keys_collide() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let cases = [
        ("a:b", "c"),
        ("a", "b:c"),
        ("a|1:b", ""),
        ("a", "1:b"),
        ("", "a|1:b"),
        ("1:a", "b"),
    ];
    for (a, b) in cases {
        let msg = Pair {
            a: a.into(),
            b: b.into(),
        };
        let out = pair(&store, &msg, &probe).await.unwrap();
        assert!(out.is_executed(), "({a:?}, {b:?}) met another key: {out:?}");
    }
    assert_eq!(probe.runs(), cases.len());
    assert_eq!(store.len(), cases.len());
    for (a, b) in cases {
        let msg = Pair {
            a: a.into(),
            b: b.into(),
        };
        assert!(pair(&store, &msg, &probe).await.unwrap().is_duplicate());
    }
    assert_eq!(probe.runs(), cases.len());
}

#[derive(Debug)]
struct Blob {
    id: String,
}

#[idempotent(key = "msg.id", ttl = "1h", store = "sqlite", name = "keys_long")]
async fn store_blob(msg: &Blob, key: &Key, probe: &Probe) -> Result<String, AppError> {
    probe.hit();
    Ok(format!("{}:{}", msg.id.len(), key.as_str()))
}

#[tokio::test]
async fn long_keys_are_stored_as_a_fixed_size_digest_and_still_deduplicate() {
    let db = Db::new().await;
    let probe = Probe::new();
    let long = "x".repeat(500);
    let longer = "x".repeat(501);

    let key = Key::from_parts(&[&long]).unwrap();
    assert!(key.as_str().starts_with("#sha256:"), "{key:?}");
    assert_eq!(key.as_str().len(), "#sha256:".len() + 64);

    let out = store_blob(&db.store, &Blob { id: long.clone() }, &probe)
        .await
        .unwrap();
    assert_eq!(out, Outcome::Executed(format!("500:{}", key.as_str())));
    let stored: Vec<String> = sqlx::query_scalar("SELECT key FROM idem_keys")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, [key.as_str()]);

    assert!(
        store_blob(&db.store, &Blob { id: long.clone() }, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    // One more character: another digest, another key.
    assert!(
        store_blob(&db.store, &Blob { id: longer }, &probe)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(db.record_count().await, 2);
    let rec = db.store.record("keys_long", &key).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Completed);
}

#[derive(Debug)]
struct Order {
    id: u64,
}

#[derive(Debug)]
struct Shipment {
    order: Order,
    items: (String, u32),
    express: bool,
}

#[idempotent(
    key = "'ship' + order.id + items.0 + express",
    ttl = "1h",
    store = "memory",
    name = "keys_nested"
)]
async fn ship(msg: &Shipment, key: &Key) -> Result<String, AppError> {
    Ok(format!(
        "{}x{} as {}",
        msg.items.1,
        msg.items.0,
        key.as_str()
    ))
}

#[tokio::test]
async fn constants_nested_fields_and_tuple_indices_build_the_documented_key() {
    let store = MemoryStore::new();
    let msg = Shipment {
        order: Order { id: 42 },
        items: ("sku-9".into(), 3),
        express: true,
    };
    let mut b = KeyBuilder::new();
    b.constant("ship");
    b.part(&42u64).unwrap();
    b.part(&"sku-9").unwrap();
    b.part(&true).unwrap();
    let key = b.finish();
    assert_eq!(key.as_str(), "4:ship|2:42|5:sku-9|4:true");

    assert_eq!(
        ship(&store, &msg).await.unwrap(),
        Outcome::Executed(format!("3xsku-9 as {}", key.as_str()))
    );
    assert!(store.record("keys_nested", &key).await.unwrap().is_some());
    // Same business key, other quantity: a duplicate.
    let again = Shipment {
        items: ("sku-9".into(), 7),
        ..msg
    };
    assert_eq!(
        ship(&store, &again).await.unwrap(),
        Outcome::Duplicate(format!("3xsku-9 as {}", key.as_str()))
    );
}

#[derive(Debug)]
struct Event {
    id: uuid::Uuid,
    shard: i64,
    tag: char,
}

#[idempotent(
    key = "id + shard + tag",
    ttl = "1h",
    store = "memory",
    name = "keys_typed"
)]
async fn typed(msg: &Event, key: &Key) -> Result<String, AppError> {
    let _ = msg;
    Ok(key.as_str().to_owned())
}

#[tokio::test]
async fn typed_parts_encode_canonically() {
    let store = MemoryStore::new();
    let id = uuid::Uuid::from_u128(0x1234);
    let msg = Event {
        id,
        shard: -3,
        tag: 'é',
    };
    let key = Key::from_parts(&[&id, &-3i64, &'é']).unwrap();
    assert_eq!(
        key.as_str(),
        "36:00000000-0000-0000-0000-000000001234|2:-3|2:é"
    );
    assert_eq!(
        typed(&store, &msg).await.unwrap(),
        Outcome::Executed(key.as_str().to_owned())
    );
}

/// The same key under two handler names: each handler runs once.
#[idempotent(
    key = "msg.a + msg.b",
    ttl = "1h",
    store = "memory",
    name = "keys_scope_one"
)]
async fn scope_one(msg: &Pair, probe: &Probe) -> Result<u8, AppError> {
    let _ = msg;
    probe.hit();
    Ok(1)
}

/// No `name`: the function's name is the namespace.
#[idempotent(key = "msg.a + msg.b", ttl = "1h", store = "memory")]
async fn keys_scope_default(msg: &Pair, probe: &Probe) -> Result<u8, AppError> {
    let _ = msg;
    probe.hit();
    Ok(2)
}

#[tokio::test]
async fn handler_names_scope_keys_and_default_to_the_function_name() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Pair {
        a: "p".into(),
        b: "q".into(),
    };
    assert_eq!(
        scope_one(&store, &msg, &probe).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(
        keys_scope_default(&store, &msg, &probe).await.unwrap(),
        Outcome::Executed(2)
    );
    assert_eq!(
        scope_one(&store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(1)
    );
    assert_eq!(
        keys_scope_default(&store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(2)
    );
    assert_eq!(probe.runs(), 2);
    let key = Key::from_parts(&[&"p", &"q"]).unwrap();
    assert!(
        store
            .record("keys_scope_one", &key)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .record("keys_scope_default", &key)
            .await
            .unwrap()
            .is_some()
    );

    let spec = idem_runtime::registry::find("keys_scope_default").expect("registered");
    assert_eq!(spec.function, "keys_scope_default");
    assert_eq!(spec.key, "msg.a + msg.b");
    assert_eq!(spec.store, "memory");
    assert_eq!(spec.mode, idem_runtime::registry::Mode::Lease);
    assert!(spec.file.ends_with("keys.rs"), "{}", spec.file);
    let tx = idem_runtime::registry::find("keys_tx").expect("registered");
    assert_eq!(tx.mode, idem_runtime::registry::Mode::Transaction);
    assert_eq!(tx.ttl, std::time::Duration::from_secs(3_600));
    assert!(idem_runtime::registry::check().is_ok());
}

/// A service per tenant; the key reads the receiver's tenant.
struct TenantService {
    tenant: String,
}

#[derive(Debug)]
struct TenantMsg {
    id: u64,
}

impl TenantService {
    #[idempotent(
        key = "self.tenant + msg.id",
        ttl = "1h",
        store = "memory",
        name = "keys_tenant"
    )]
    async fn handle(&self, msg: &TenantMsg, key: &Key) -> Result<String, AppError> {
        Ok(key.shown().to_owned())
    }
}

#[tokio::test]
async fn a_method_s_key_reads_the_receiver() {
    let store = MemoryStore::new();
    let msg = TenantMsg { id: 7 };
    let (acme, globex) = (
        TenantService {
            tenant: "acme".into(),
        },
        TenantService {
            tenant: "globex".into(),
        },
    );
    assert_eq!(
        acme.handle(&store, &msg).await.unwrap(),
        Outcome::Executed("acme + 7".to_owned())
    );
    // Another tenant's message with the same id is another key.
    assert!(globex.handle(&store, &msg).await.unwrap().is_executed());
    assert!(acme.handle(&store, &msg).await.unwrap().is_duplicate());
}
