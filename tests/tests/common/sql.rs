//! What the SQL fixtures share (types with `store`, `inventory`, `ledger`,
//! `clock` and `kind` fields), in two macros:
//!
//! * [`business_tables!`]: the business tables `inventory` and `ledger` next
//!   to the dedup table, read and written in the `$n` dialect SQLite and
//!   PostgreSQL share, as inherent methods; a store of another dialect
//!   writes these methods itself (MySQL's `?` in `mysql.rs`);
//! * [`sql_suites!`]: the suites' fixtures over those methods, whatever the
//!   dialect. In the lease suite the body's effect is a `ledger` row written
//!   through the pool, outside any idem transaction; in the transaction
//!   suite the bodies write both tables through the handler's transaction.
//!
//! The fixture type itself provides `open_with(kind, how)` and
//! `second_store()`, and names the kind it runs the lease suite as (the
//! claim order only concerns transaction mode).

macro_rules! business_tables {
    ($Db:ident, conn: $Conn:ty $(,)?) => {
        impl $Db {
            /// Puts `stock` units of `sku` in the inventory.
            pub(crate) async fn stock_up(&self, sku: &str, stock: i64) {
                let sql = format!(
                    "INSERT INTO {} (sku, stock) VALUES ($1, $2)
                     ON CONFLICT (sku) DO UPDATE SET stock = excluded.stock",
                    self.inventory
                );
                self.write(sql, sku, stock).await.expect("stock up");
            }

            /// The stock of `sku`, read back from the database.
            pub(crate) async fn stock(&self, sku: &str) -> i64 {
                let sql = format!("SELECT stock FROM {} WHERE sku = $1", self.inventory);
                self.scalar(sql, Some(sku)).await
            }

            /// How many ledger rows the bodies wrote for `order_id`.
            pub(crate) async fn ledger_rows(&self, order_id: &str) -> i64 {
                let sql = format!("SELECT COUNT(*) FROM {} WHERE order_id = $1", self.ledger);
                self.scalar(sql, Some(order_id)).await
            }

            /// How many ledger rows there are in all.
            pub(crate) async fn ledger_len(&self) -> i64 {
                self.scalar(format!("SELECT COUNT(*) FROM {}", self.ledger), None)
                    .await
            }

            /// The one number `sql` (with at most one parameter) returns.
            async fn scalar(&self, sql: String, arg: Option<&str>) -> i64 {
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
                if let Some(arg) = arg {
                    query = query.bind(arg);
                }
                query
                    .fetch_one(self.store.pool())
                    .await
                    .expect("read a number")
            }

            /// Writes a ledger row through the pool, outside any idem
            /// transaction, as a lease-mode body's external effect would be.
            pub(crate) async fn add_ledger(
                &self,
                order_id: &str,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                let sql = format!(
                    "INSERT INTO {} (order_id, amount) VALUES ($1, $2)",
                    self.ledger
                );
                self.write(sql, order_id, amount).await
            }

            /// Runs `sql` with a text and a number parameter.
            async fn write(&self, sql: String, text: &str, number: i64) -> Result<(), sqlx::Error> {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(text)
                    .bind(number)
                    .execute(self.store.pool())
                    .await
                    .map(drop)
            }

            /// The database's clock (unshifted), ms since the epoch: the
            /// expression the store's statements read it with.
            pub(crate) async fn db_now_ms(&self) -> i64 {
                self.scalar(crate::common::now_sql(&self.store), None).await
            }

            /// How many dedup records the store's table holds.
            pub(crate) async fn record_count(&self) -> i64 {
                self.store.count().await.expect("count records")
            }

            /// Overwrites the recorded outcome of `handler`'s records, as if
            /// the return type had changed since; returns how many changed.
            pub(crate) async fn overwrite_outcome(&self, handler: &str, outcome: &str) -> u64 {
                let sql = format!(
                    "UPDATE {} SET outcome = $1 WHERE handler = $2",
                    self.store.table()
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(outcome)
                    .bind(handler)
                    .execute(self.store.pool())
                    .await
                    .expect("overwrite outcome")
                    .rows_affected()
            }

            /// The fencing token of `handler`'s record of `key`.
            pub(crate) async fn token_of(
                &self,
                handler: &str,
                key: &idem_runtime::Key,
            ) -> Option<String> {
                let sql = format!(
                    "SELECT token FROM {} WHERE handler = $1 AND key = $2",
                    self.store.table()
                );
                let token: Option<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(handler)
                    .bind(key.as_str())
                    .fetch_optional(self.store.pool())
                    .await
                    .expect("read the token");
                token.flatten()
            }

            /// In a body: takes `qty` of `sku` from the inventory through the
            /// transaction; returns what is left.
            pub(crate) async fn take_stock(
                &self,
                conn: &mut $Conn,
                sku: &str,
                qty: i64,
            ) -> Result<i64, sqlx::Error> {
                let sql = format!(
                    "UPDATE {} SET stock = stock - $1 WHERE sku = $2 RETURNING stock",
                    self.inventory
                );
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(qty)
                    .bind(sku)
                    .fetch_one(conn)
                    .await
            }

            /// In a body: writes a ledger row through the transaction.
            pub(crate) async fn add_ledger_in(
                &self,
                conn: &mut $Conn,
                order_id: &str,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                let sql = format!(
                    "INSERT INTO {} (order_id, amount) VALUES ($1, $2)",
                    self.ledger
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(order_id)
                    .bind(amount)
                    .execute(conn)
                    .await
                    .map(drop)
            }
        }
    };
}

macro_rules! sql_suites {
    ($Db:ident, store: $Store:ty, conn: $Conn:ty, lease_kind: $lease_kind:expr $(,)?) => {
        impl crate::common::lease::Effects for $Db {
            fn apply<'a>(
                &'a self,
                id: &'a str,
            ) -> crate::common::lease::BoxFuture<'a, Result<(), crate::common::AppError>> {
                Box::pin(async move { Ok(self.add_ledger(id, 1).await?) })
            }
        }

        impl crate::common::lease::LeaseFixture for $Db {
            type Store = $Store;
            const COUNTS_TAKEOVERS: bool = true;
            const DELETES_EXPIRED: bool = false;

            async fn open(time: crate::common::lease::Time) -> Option<Self> {
                use crate::common::lease::Time;
                use crate::common::tx::Open;
                let how = match time {
                    Time::Manual => Open::Shifted(idem_runtime::clock::TimeShift::new()),
                    Time::Real => Open::Plain,
                };
                Self::open_with($lease_kind, how).await
            }

            fn store(&self) -> &$Store {
                &self.store
            }

            fn time(&self) -> crate::common::lease::Moves<'_> {
                match &self.shift {
                    Some(shift) => crate::common::lease::Moves::Shift(shift),
                    None => crate::common::lease::Moves::Real,
                }
            }

            async fn server_now_ms(&self) -> i64 {
                self.db_now_ms().await
            }

            async fn record(
                &self,
                handler: &str,
                key: &idem_runtime::Key,
            ) -> Option<idem_runtime::store::Record> {
                self.store
                    .record(handler, key)
                    .await
                    .expect("read a record")
            }

            async fn records(&self) -> usize {
                usize::try_from(self.record_count().await).expect("a count")
            }

            async fn token(
                &self,
                handler: &str,
                key: &idem_runtime::Key,
            ) -> crate::common::lease::Token {
                crate::common::lease::Token::Shown(self.token_of(handler, key).await)
            }

            async fn effects(&self, id: &str) -> usize {
                usize::try_from(self.ledger_rows(id).await).expect("a count")
            }

            async fn lossy(&self) -> crate::common::lossy::Lossy<$Store> {
                $Db::lossy(self).await
            }
        }

        impl crate::common::tx::TxFixture for $Db {
            type Store = $Store;
            type Conn = $Conn;

            async fn open(
                kind: crate::common::tx::StoreKind,
                how: crate::common::tx::Open,
            ) -> Option<Self> {
                Self::open_with(kind, how).await
            }

            fn kind(&self) -> crate::common::tx::StoreKind {
                self.kind
            }

            fn store(&self) -> &$Store {
                &self.store
            }

            fn shift(&self) -> Option<&idem_runtime::clock::TimeShift> {
                self.shift.as_ref()
            }

            async fn db_now_ms(&self) -> i64 {
                $Db::db_now_ms(self).await
            }

            async fn second_consumer(&self) -> $Store {
                self.second_store().await
            }

            async fn record(
                &self,
                handler: &str,
                key: &idem_runtime::Key,
            ) -> Option<idem_runtime::store::Record> {
                self.store
                    .record(handler, key)
                    .await
                    .expect("read a record")
            }

            async fn records(&self) -> i64 {
                self.record_count().await
            }

            async fn set_outcome(&self, handler: &str, outcome: &str) -> u64 {
                self.overwrite_outcome(handler, outcome).await
            }

            async fn stock_up(&self, sku: &str, stock: i64) {
                $Db::stock_up(self, sku, stock).await
            }

            async fn stock(&self, sku: &str) -> i64 {
                $Db::stock(self, sku).await
            }

            async fn ledger_rows(&self, order_id: &str) -> i64 {
                $Db::ledger_rows(self, order_id).await
            }

            async fn ledger_len(&self) -> i64 {
                $Db::ledger_len(self).await
            }

            async fn take_stock(
                &self,
                conn: &mut $Conn,
                sku: &str,
                qty: i64,
            ) -> Result<i64, sqlx::Error> {
                $Db::take_stock(self, conn, sku, qty).await
            }

            async fn add_ledger_in(
                &self,
                conn: &mut $Conn,
                order_id: &str,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                $Db::add_ledger_in(self, conn, order_id, amount).await
            }
        }
    };
}
