//! What `store = "..."` names, decided here rather than in the macro.
//!
//! The macro turns `store = "postgres"` into calls of the function of that
//! name in [`names`]: `postgres::<LeaseMode>()`, spanned on the name, checks
//! the name (an unknown one is rustc's "no `...` in `names`", with the
//! nearest name suggested; another name of a store or a feature that is off
//! fails the function's bound, whose `on_unimplemented` message says so); in
//! transaction mode `postgres::<TxMode<T>>()`, spanned on the transaction's
//! type `T`, checks that `T` is this store's transaction (a transaction of
//! another store, a type that is no transaction, or a store without
//! transactions fails there, with what to write). Names that fail the first
//! check pass the second, so each mistake is one error.
//!
//! A store outside this crate is named by its path (`store =
//! "crate::MyStore"`) and checked by [`store_type`], spanned on the name;
//! in transaction mode [`StoreProbe`], spanned on `T`, checks that `T` is
//! the store's `Tx`, and names it when it is not.
//!
//! Adding a store to idem is adding its function to [`names`] and its bound to
//! [`bounds`] (with the bound's feature-off twin when a feature gates the
//! store); the macro does not change.
//!
//! The rewritten handler itself takes any store of its mode (`&impl
//! LeaseStore`, `&impl TxStore<Tx = T>`): the name fixes the transaction type
//! and says where the records live in production; it does not pin a type.

#![allow(missing_docs)]

use core::marker::PhantomData;

use crate::store::contract::{LeaseStore, StoreTransaction, TxStore};

/// The name check, and the whole check of a lease-mode handler: every store
/// runs lease mode.
pub struct LeaseMode;

/// The mode of a handler whose first parameter is `&mut T`, whatever `T`
/// is: a store's bound accepts its own transaction only, so a `T` that is
/// no transaction at all is the same one error as another store's.
pub struct TxMode<T: ?Sized>(PhantomData<T>);

/// The store names: a function each, and nothing else, so that no other item
/// of this module is taken for a store.
pub mod names {
    use super::bounds;

    /// `store = "sqlite"`: [`SqliteStore`](crate::SqliteStore).
    pub fn sqlite<M: bounds::Sqlite + ?Sized>() {}
    /// `store = "postgres"`: [`PgStore`](crate::PgStore).
    pub fn postgres<M: bounds::Postgres + ?Sized>() {}
    /// `store = "mysql"`: [`MySqlStore`](crate::MySqlStore), for MySQL and MariaDB.
    pub fn mysql<M: bounds::Mysql + ?Sized>() {}
    /// `store = "redis"`: [`RedisStore`](crate::RedisStore).
    pub fn redis<M: bounds::Redis + ?Sized>() {}
    /// `store = "memory"`: [`MemoryStore`](crate::MemoryStore).
    pub fn memory<M: bounds::Memory + ?Sized>() {}
    /// `store = "pg"`: an error, the store is called "postgres".
    pub fn pg<M: bounds::Pg + ?Sized>() {}
    /// `store = "postgresql"`: an error, the store is called "postgres".
    pub fn postgresql<M: bounds::Postgresql + ?Sized>() {}
    /// `store = "psql"`: an error, the store is called "postgres".
    pub fn psql<M: bounds::Psql + ?Sized>() {}
    /// `store = "sqlite3"`: an error, the store is called "sqlite".
    pub fn sqlite3<M: bounds::Sqlite3 + ?Sized>() {}
    /// `store = "mariadb"`: an error, the store is called "mysql".
    pub fn mariadb<M: bounds::Mariadb + ?Sized>() {}
    /// `store = "mem"`: an error, the store is called "memory".
    pub fn mem<M: bounds::Mem + ?Sized>() {}
    /// `store = "inmemory"`: an error, the store is called "memory".
    pub fn inmemory<M: bounds::Inmemory + ?Sized>() {}
}

/// The bound of each name's function: its `on_unimplemented` message is what
/// the user reads when the store does not fit the handler.
pub mod bounds {
    use super::{LeaseMode, TxMode};

    #[cfg(feature = "sqlite")]
    #[diagnostic::on_unimplemented(
        message = "this is not a SQLite transaction, but the handler uses store = \"sqlite\": write `&mut SqliteTx<'_>`",
        label = "a `&mut` first parameter is the handler's transaction",
        note = "`SqliteTx` is `idem_runtime::SqliteTx`, an alias of `sqlx::Transaction<'_, sqlx::Sqlite>`",
        note = "state of the body that is no transaction goes after the message (or is taken by `&`): a handler without a transaction runs in lease mode"
    )]
    pub trait Sqlite {}
    #[cfg(feature = "sqlite")]
    impl Sqlite for LeaseMode {}
    #[cfg(feature = "sqlite")]
    impl Sqlite for TxMode<crate::SqliteTx<'static>> {}

    #[cfg(not(feature = "sqlite"))]
    #[diagnostic::on_unimplemented(
        message = "store \"sqlite\" needs the `sqlite` feature of idem-runtime: idem-runtime = {{ version = \"...\", features = [\"sqlite\"] }}",
        label = "the `sqlite` feature of idem-runtime is off"
    )]
    pub trait Sqlite {}
    #[cfg(not(feature = "sqlite"))]
    impl<T: ?Sized> Sqlite for TxMode<T> {}

    #[cfg(feature = "postgres")]
    #[diagnostic::on_unimplemented(
        message = "this is not a Postgres transaction, but the handler uses store = \"postgres\": write `&mut PgTx<'_>`",
        label = "a `&mut` first parameter is the handler's transaction",
        note = "`PgTx` is `idem_runtime::PgTx`, an alias of `sqlx::Transaction<'_, sqlx::Postgres>`",
        note = "state of the body that is no transaction goes after the message (or is taken by `&`): a handler without a transaction runs in lease mode"
    )]
    pub trait Postgres {}
    #[cfg(feature = "postgres")]
    impl Postgres for LeaseMode {}
    #[cfg(feature = "postgres")]
    impl Postgres for TxMode<crate::PgTx<'static>> {}

    #[cfg(not(feature = "postgres"))]
    #[diagnostic::on_unimplemented(
        message = "store \"postgres\" needs the `postgres` feature of idem-runtime: idem-runtime = {{ version = \"...\", features = [\"postgres\"] }}",
        label = "the `postgres` feature of idem-runtime is off"
    )]
    pub trait Postgres {}
    #[cfg(not(feature = "postgres"))]
    impl<T: ?Sized> Postgres for TxMode<T> {}

    #[cfg(feature = "mysql")]
    #[diagnostic::on_unimplemented(
        message = "this is not a MySQL transaction, but the handler uses store = \"mysql\": write `&mut MySqlTx<'_>`",
        label = "a `&mut` first parameter is the handler's transaction",
        note = "`MySqlTx` is `idem_runtime::MySqlTx`, an alias of `sqlx::Transaction<'_, sqlx::MySql>`",
        note = "state of the body that is no transaction goes after the message (or is taken by `&`): a handler without a transaction runs in lease mode"
    )]
    pub trait Mysql {}
    #[cfg(feature = "mysql")]
    impl Mysql for LeaseMode {}
    #[cfg(feature = "mysql")]
    impl Mysql for TxMode<crate::MySqlTx<'static>> {}

    #[cfg(not(feature = "mysql"))]
    #[diagnostic::on_unimplemented(
        message = "store \"mysql\" needs the `mysql` feature of idem-runtime: idem-runtime = {{ version = \"...\", features = [\"mysql\"] }}",
        label = "the `mysql` feature of idem-runtime is off"
    )]
    pub trait Mysql {}
    #[cfg(not(feature = "mysql"))]
    impl<T: ?Sized> Mysql for TxMode<T> {}

    #[cfg(feature = "redis")]
    #[diagnostic::on_unimplemented(
        message = "store \"redis\" has no transactions: remove this parameter to run the handler in lease mode, or use a SQL store",
        label = "a `&mut` first parameter is the handler's transaction",
        note = "the SQL stores (\"sqlite\", \"postgres\", \"mysql\") run transaction mode; \"redis\" and \"memory\" run lease mode only",
        note = "state of the body goes after the message (or is taken by `&`)"
    )]
    pub trait Redis {}
    #[cfg(feature = "redis")]
    impl Redis for LeaseMode {}

    #[cfg(not(feature = "redis"))]
    #[diagnostic::on_unimplemented(
        message = "store \"redis\" needs the `redis` feature of idem-runtime: idem-runtime = {{ version = \"...\", features = [\"redis\"] }}",
        label = "the `redis` feature of idem-runtime is off"
    )]
    pub trait Redis {}
    #[cfg(not(feature = "redis"))]
    impl<T: ?Sized> Redis for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "store \"memory\" has no transactions: remove this parameter to run the handler in lease mode, or use a SQL store",
        label = "a `&mut` first parameter is the handler's transaction",
        note = "the SQL stores (\"sqlite\", \"postgres\", \"mysql\") run transaction mode; \"redis\" and \"memory\" run lease mode only",
        note = "state of the body goes after the message (or is taken by `&`)"
    )]
    pub trait Memory {}
    impl Memory for LeaseMode {}

    // Other names of the stores: each is an error saying which name to
    // write, so the registry and the docs know every store by one name.

    #[diagnostic::on_unimplemented(
        message = "unknown store \"pg\": did you mean \"postgres\"?",
        label = "not a store's name"
    )]
    pub trait Pg {}
    impl<T: ?Sized> Pg for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"postgresql\": did you mean \"postgres\"?",
        label = "not a store's name"
    )]
    pub trait Postgresql {}
    impl<T: ?Sized> Postgresql for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"psql\": did you mean \"postgres\"?",
        label = "not a store's name"
    )]
    pub trait Psql {}
    impl<T: ?Sized> Psql for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"sqlite3\": did you mean \"sqlite\"?",
        label = "not a store's name"
    )]
    pub trait Sqlite3 {}
    impl<T: ?Sized> Sqlite3 for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"mariadb\": did you mean \"mysql\"? It serves MariaDB too.",
        label = "not a store's name"
    )]
    pub trait Mariadb {}
    impl<T: ?Sized> Mariadb for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"mem\": did you mean \"memory\"?",
        label = "not a store's name"
    )]
    pub trait Mem {}
    impl<T: ?Sized> Mem for TxMode<T> {}

    #[diagnostic::on_unimplemented(
        message = "unknown store \"inmemory\": did you mean \"memory\"?",
        label = "not a store's name"
    )]
    pub trait Inmemory {}
    impl<T: ?Sized> Inmemory for TxMode<T> {}
}

// ---------------------------------------------------------------------------
// A store named by its path

/// The mode check of a transaction-mode handler whose store is named by
/// its path: whether the store has transactions at all. Whether the first
/// parameter is its transaction is [`StoreProbe`]'s check, on that
/// parameter.
pub struct AnyTxMode;

/// Implemented by a store that can run a handler of mode `M`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run this handler: it is not a store of the handler's mode",
    label = "named by `store = \"...\"`",
    note = "a lease-mode handler needs a store implementing `idem_runtime::store::LeaseStore`; a transaction-mode handler one implementing `idem_runtime::store::TxStore` whose `Tx` is the type of its first parameter"
)]
pub trait StoreFor<M: ?Sized> {}
impl<S: LeaseStore> StoreFor<LeaseMode> for S {}
impl<S: TxStore> StoreFor<AnyTxMode> for S {}

/// `store = "path::to::Store"`: a store type of the application's own.
pub fn store_type<S: StoreFor<M> + ?Sized, M: ?Sized>() {}

/// Wraps a store type named by its path, `S`, and the type of the
/// handler's first parameter, `&mut T`, for the method lookup below:
/// [`StoreTx`] when `S` is a [`TxStore`], whose `Tx` `T` must then be,
/// [`NoStoreTx`] otherwise (nothing: [`store_type`] reports that store, on
/// its name).
pub struct StoreProbe<S: ?Sized, T: ?Sized>(PhantomData<S>, PhantomData<T>);

impl<S: ?Sized, T: ?Sized> StoreProbe<S, T> {
    /// The probe.
    pub fn new() -> Self {
        StoreProbe(PhantomData, PhantomData)
    }
}

impl<S: ?Sized, T: ?Sized> Default for StoreProbe<S, T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The lookup for stores with transactions.
pub trait StoreTx<S: ?Sized, T: ?Sized> {
    /// The check of `T` against the store's transaction type.
    fn store_tx(&self) -> ExpectTx<S, T>;
}
impl<S: TxStore + ?Sized, T: ?Sized> StoreTx<S, T> for StoreProbe<S, T> {
    fn store_tx(&self) -> ExpectTx<S, T> {
        ExpectTx(PhantomData, PhantomData)
    }
}

/// The lookup for every other store type.
pub trait NoStoreTx {
    /// Nothing to check.
    fn store_tx(&self) -> Fine {
        Fine
    }
}
impl<S: ?Sized, T: ?Sized> NoStoreTx for &StoreProbe<S, T> {}

/// A store with transactions, `S`, and the handler's `&mut T`.
pub struct ExpectTx<S: ?Sized, T: ?Sized>(PhantomData<S>, PhantomData<T>);
impl<S: TxStore + ?Sized, T: ?Sized> ExpectTx<S, T> {
    /// Requires `T` to be `S`'s transaction: [`TxOfStore`], whose message
    /// names `S::Tx` as rustc prints it (the macro sees only the store's
    /// path).
    pub fn first_param(self)
    where
        T: TxOfStore<S, S::Tx>,
    {
    }
}

/// `Self` is `S`'s transaction, `Tx`.
#[diagnostic::on_unimplemented(
    message = "this is not the transaction of `{S}`, the handler's store: write `&mut {Tx}`",
    label = "a `&mut` first parameter is the handler's transaction",
    note = "`{Tx}` is `<{S} as idem_runtime::store::TxStore>::Tx`; its lifetimes, if any, may be written `'_`",
    note = "state of the body that is no transaction goes after the message (or is taken by `&`): a handler without a transaction runs in lease mode"
)]
pub trait TxOfStore<S: ?Sized, Tx: ?Sized> {}
impl<S: ?Sized, T: ?Sized> TxOfStore<S, T> for T {}

// ---------------------------------------------------------------------------
// Where the transaction parameter is

/// Wraps the type of a `&mut T` parameter that is not the first, for the
/// method lookup below: [`MisplacedTx`] when `T` is a store's transaction
/// (an error), [`NotTx`] otherwise (nothing).
pub struct TxProbe<T: ?Sized>(PhantomData<T>);

impl<T: ?Sized> TxProbe<T> {
    /// The probe.
    pub fn new() -> Self {
        TxProbe(PhantomData)
    }
}

impl<T: ?Sized> Default for TxProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Never implemented: required of a transaction found after the first
/// parameter, so that its error says where it goes.
#[diagnostic::on_unimplemented(
    message = "a transaction parameter must come first (after `self`), and a handler has one: `{Self}` is a store's transaction",
    label = "a transaction after the first parameter",
    note = "the rewritten function takes the store in the transaction's place; a handler whose first parameter is not its transaction runs in lease mode"
)]
pub trait TxComesFirst {}

/// The lookup for transaction types.
pub trait MisplacedTx {
    /// Fails to compile, with the message of [`TxComesFirst`].
    fn tx_after_first(&self) -> Misplaced<Self>;
}
impl<T: StoreTransaction + ?Sized> MisplacedTx for TxProbe<T> {
    fn tx_after_first(&self) -> Misplaced<Self> {
        Misplaced(PhantomData)
    }
}

/// A transaction type found after the first parameter.
pub struct Misplaced<P: ?Sized>(PhantomData<P>);
impl<T: ?Sized> Misplaced<TxProbe<T>> {
    /// Requires [`TxComesFirst`], which nothing implements.
    pub fn check(self)
    where
        T: TxComesFirst,
    {
    }
}

/// The lookup for every other type.
pub trait NotTx {
    /// Nothing to report.
    fn tx_after_first(&self) -> Fine {
        Fine
    }
}
impl<T: ?Sized> NotTx for &TxProbe<T> {}

/// Nothing to report: a parameter after the first that is no
/// transaction, or a store named by its path that has none.
pub struct Fine;
impl Fine {
    /// Nothing.
    pub fn check(self) {}
    /// Nothing: [`store_type`] reports a store without transactions.
    pub fn first_param(self) {}
}
