//! Every `#[idempotent]` handler linked into the binary, described statically.
//!
//! The macro submits one [`HandlerSpec`] per handler with `inventory`. The
//! runtime reads them to refuse two handlers with the same name (their keys
//! would share a namespace in the store) and for tooling.
//!
//! A handler in a library crate that nothing in the binary references may be
//! left out by the linker, and then it is not listed either; that is harmless
//! because such a handler cannot be called.
//!
//! # Examples
//!
//! ```standalone_crate
//! for h in idem_runtime::registry::handlers() {
//!     println!("{} keyed by `{}` on {} ({}:{})", h.name, h.key, h.store, h.file, h.line);
//! }
//! idem_runtime::registry::check().expect("handler names are unique");
//! ```

use std::sync::OnceLock;
use std::time::Duration;

/// How a handler's body is protected.
///
/// # Examples
///
/// ```
/// use idem_runtime::registry::Mode;
/// assert_eq!(Mode::Transaction.as_str(), "transaction");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The claim, the body's writes and the outcome commit in one database
    /// transaction.
    Transaction,
    /// The claim is a lease; the outcome is recorded when the body returns.
    Lease,
}

impl Mode {
    /// `"transaction"` or `"lease"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::registry::Mode;
    /// assert_eq!(Mode::Lease.as_str(), "lease");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Transaction => "transaction",
            Mode::Lease => "lease",
        }
    }
}

/// The static description of one handler, built by the macro.
///
/// # Examples
///
/// ```
/// use idem_runtime::registry::{HandlerSpec, Mode};
/// use std::time::Duration;
///
/// const SPEC: HandlerSpec = HandlerSpec {
///     name: "deduct_stock",
///     function: "deduct_stock",
///     key: "order_id + sku",
///     ttl: Duration::from_secs(86_400),
///     lease: Duration::from_secs(30),
///     store: "sqlite",
///     mode: Mode::Transaction,
///     module: "shop::stock",
///     file: "src/stock.rs",
///     line: 12,
///     fingerprint: Some("qty + price"),
///     max_attempts: Some(5),
/// };
/// assert_eq!(SPEC.ttl, idem_grammar::parse_duration("24h").unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerSpec {
    /// The namespace of the handler's keys in the store (`name = "..."`, or
    /// the function's name).
    pub name: &'static str,
    /// The function's own name.
    pub function: &'static str,
    /// The key expression as written.
    pub key: &'static str,
    /// How long a completed record suppresses duplicates.
    pub ttl: Duration,
    /// Lease mode: how long a claim may stay in progress before another
    /// consumer may take it over. Unused in transaction mode.
    pub lease: Duration,
    /// The `store` argument as written: a built-in store's name (`sqlite`,
    /// `postgres`, `mysql`, `redis`, `memory`) or a store type's path
    /// (`crate::Ledger`). Where the handler's records live in production; a
    /// lease-mode handler may be called with another store (in tests).
    pub store: &'static str,
    /// Transaction or lease mode.
    pub mode: Mode,
    /// `module_path!()` of the handler.
    pub module: &'static str,
    /// Source file of the handler.
    pub file: &'static str,
    /// Source line of the attribute.
    pub line: u32,
    /// The `fingerprint` argument as written (`"qty + price"`, or `"*"` for
    /// the whole message): what must not change between deliveries of one
    /// key. `None`: deliveries are not compared.
    pub fingerprint: Option<&'static str>,
    /// The `max_attempts` argument: after this many failed deliveries of one
    /// key, the next one does not run the body and gets
    /// [`Error::Exhausted`](crate::Error::Exhausted). `None`: failures are
    /// not counted, and a failed delivery leaves nothing behind.
    pub max_attempts: Option<u32>,
}

inventory::collect!(HandlerSpec);

/// All handlers linked into this binary, in no particular order.
///
/// # Examples
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, registry};
///
/// #[derive(serde::Deserialize)]
/// struct PointsEarned { message_id: String }
///
/// #[idempotent(key = "message_id", ttl = "7d", store = "memory", name = "points")]
/// async fn grant_points(msg: &PointsEarned) -> Result<(), std::io::Error> {
///     Ok(())
/// }
///
/// let spec = registry::handlers().find(|h| h.function == "grant_points").unwrap();
/// assert_eq!(spec.name, "points");
/// assert_eq!(spec.key, "message_id");
/// assert_eq!(spec.mode, registry::Mode::Lease);
/// ```
pub fn handlers() -> impl Iterator<Item = &'static HandlerSpec> {
    inventory::iter::<HandlerSpec>.into_iter()
}

/// Handlers that share a registered name: their keys would share one
/// namespace in the store, so a message of one would be taken for a
/// duplicate of the other's.
///
/// It lists every clash in the binary, each with every handler in it, and
/// its message says which `name = "..."` to add.
///
/// # Examples
///
/// ```
/// use idem_runtime::registry::{Clash, RegistryError};
///
/// fn report(err: &RegistryError) {
///     let RegistryError::DuplicateNames { clashes } = err else { return };
///     for Clash { name, handlers } in clashes {
///         eprintln!("`{name}` is used by {} handlers", handlers.len());
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Some registered names are used by more than one handler.
    #[error("{}", describe(clashes))]
    DuplicateNames {
        /// Every shared name, in name order.
        clashes: Vec<Clash>,
    },
}

/// One registered name and the handlers that share it.
///
/// # Examples
///
/// ```
/// use idem_runtime::registry::Clash;
///
/// let clash = Clash { name: "notify", handlers: Vec::new() };
/// assert!(clash.handlers.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clash {
    /// The shared name.
    pub name: &'static str,
    /// The handlers registered under it (two or more), by source place.
    pub handlers: Vec<&'static HandlerSpec>,
}

fn describe(clashes: &[Clash]) -> String {
    let mut out = match clashes {
        [one] => format!(
            "{} idempotent handlers share the name `{}`, so their keys would share one namespace in the store",
            one.handlers.len(),
            one.name
        ),
        _ => format!(
            "{} names are each shared by several idempotent handlers, so their keys would share one namespace in the store",
            clashes.len()
        ),
    };
    out.push_str("; this cannot be retried away: fix the build");
    // Suggestions must not meet a name in use, nor each other.
    let mut taken: Vec<String> = handlers().map(|h| h.name.to_owned()).collect();
    for clash in clashes {
        out.push_str(&format!("\n  `{}`:", clash.name));
        for h in &clash.handlers {
            out.push_str(&format!(
                " {}::{} ({}:{});",
                h.module, h.function, h.file, h.line
            ));
        }
        out.pop();
        // Whichever handler already has records keeps the name; the others
        // get one made of their module and function.
        let renames: Vec<String> = clash.handlers[1..]
            .iter()
            .map(|h| {
                let name = suggested_name(h, &taken);
                taken.push(name.clone());
                format!("name = \"{name}\" at {}:{}", h.file, h.line)
            })
            .collect();
        out.push_str(&format!(
            "\n    keep `{}` on the handler whose records already exist and rename the others, e.g. {}",
            clash.name,
            renames.join(", ")
        ));
    }
    out
}

/// A name no handler uses yet: the module path (without the crate's own
/// name) and the function, numbered when that is taken too (methods of two
/// types in one module, a function at the crate's root).
fn suggested_name(h: &HandlerSpec, taken: &[String]) -> String {
    let base = match h.module.split_once("::") {
        Some((_, inner)) => format!("{inner}::{}", h.function),
        None => h.function.to_owned(),
    };
    let free = |n: &String| !taken.contains(n);
    std::iter::once(base.clone())
        .chain((2..).map(|i| format!("{base}_{i}")))
        .find(free)
        .unwrap_or(base)
}

/// Checks that no two handlers in this binary share a name.
///
/// Stores call it when they are built, and every handler call consults its
/// cached result, so a clash stops the consumer before it touches a record.
///
/// # Examples
///
/// Checking at start-up, before any store is built, to fail fast:
///
/// ```
/// if let Err(clash) = idem_runtime::registry::check() {
///     panic!("refusing to start: {clash}");
/// }
/// ```
pub fn check() -> Result<(), RegistryError> {
    static RESULT: OnceLock<Result<(), RegistryError>> = OnceLock::new();
    RESULT.get_or_init(scan).clone()
}

fn scan() -> Result<(), RegistryError> {
    let mut all: Vec<&'static HandlerSpec> = handlers().collect();
    all.sort_by_key(|h| (h.name, h.file, h.line));
    let mut clashes: Vec<Clash> = Vec::new();
    for group in all.chunk_by(|a, b| a.name == b.name) {
        if group.len() > 1 {
            clashes.push(Clash {
                name: group[0].name,
                handlers: group.to_vec(),
            });
        }
    }
    if clashes.is_empty() {
        Ok(())
    } else {
        Err(RegistryError::DuplicateNames { clashes })
    }
}

/// Looks a handler up by its registered name.
///
/// # Examples
///
/// ```
/// assert!(idem_runtime::registry::find("no_such_handler").is_none());
/// ```
pub fn find(name: &str) -> Option<&'static HandlerSpec> {
    handlers().find(|h| h.name == name)
}
