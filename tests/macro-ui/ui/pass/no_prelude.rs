// The expansion names everything by absolute paths: it compiles in a module
// without the prelude, next to a renamed runtime.
// `pub` items in private modules, as users write them.
#![allow(unreachable_pub)]
extern crate idem_runtime as my_idem;

#[no_implicit_prelude]
mod handlers {
    pub struct OrderPlaced {
        pub order_id: u64,
        pub sku: ::std::string::String,
    }

    #[::my_idem::idempotent(
        key = "order_id + sku",
        ttl = "24h",
        store = "memory",
        crate = "::my_idem"
    )]
    pub async fn deduct_stock(msg: &OrderPlaced) -> ::core::result::Result<u64, ::std::io::Error> {
        ::core::result::Result::Ok(msg.order_id)
    }

    #[::my_idem::idempotent(key = "order_id", ttl = "24h", store = "sqlite", crate = "::my_idem")]
    pub async fn deduct_stock_tx(
        tx: &mut ::my_idem::SqliteTx<'_>,
        msg: &OrderPlaced,
    ) -> ::core::result::Result<u64, ::sqlx::Error> {
        let _ = tx;
        ::core::result::Result::Ok(msg.order_id)
    }
}

async fn call(memory: &my_idem::MemoryStore, sqlite: &my_idem::SqliteStore) {
    let msg = handlers::OrderPlaced {
        order_id: 7,
        sku: "apple".into(),
    };
    let _: Result<my_idem::Outcome<u64>, my_idem::Error<std::io::Error>> =
        handlers::deduct_stock(memory, &msg).await;
    let _: Result<my_idem::Outcome<u64>, my_idem::Error<sqlx::Error>> =
        handlers::deduct_stock_tx(sqlite, &msg).await;
}

fn main() {
    let _ = call;
}
