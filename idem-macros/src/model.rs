//! The model of a handler: what `valid` builds from the attribute and the
//! function, and `expand` generates from.

use std::time::Duration;

use proc_macro2::Span;
use syn::{Ident, ItemFn, Type};

/// Where the records live, as `store = "..."` names it. The macro knows no
/// store: a name is looked up by rustc among the runtime's
/// `__private::stores` functions, whose bounds decide (and explain) what the
/// store allows; a path names a store type of the application's own.
#[derive(Clone)]
pub(crate) enum StoreRef {
    /// A built-in store's name, spanned on the literal.
    Name(Ident),
    /// The path of a store type, spanned on the literal.
    Type(syn::Path),
}

/// The `store` argument.
#[derive(Clone)]
pub(crate) struct StoreArg {
    pub(crate) store: StoreRef,
    /// As written, for the handler's registry entry.
    pub(crate) text: String,
    /// The literal's span: where the store's own errors are reported.
    pub(crate) span: Span,
}

/// A parameter that stays in the rewritten signature.
pub(crate) struct Param {
    pub(crate) arg: syn::PatType,
    /// The parameter's name, when its pattern is a plain identifier.
    pub(crate) ident: Option<Ident>,
}

/// One term of the key expression (`a + 'b' + c`), ready to generate.
pub(crate) enum KeyTerm {
    /// `root.seg.seg`: `root` is a parameter, segments carry the literal's span.
    Path {
        root: Ident,
        fields: Vec<syn::Member>,
        text: String,
    },
    Const(String),
}

/// The `fingerprint` argument, ready to generate.
pub(crate) struct Fingerprint {
    /// As written, for the handler's registry entry.
    pub(crate) text: String,
    /// The literal's span: where a part that serde cannot write is reported.
    pub(crate) span: Span,
    /// `*`: the message itself, not a tuple of parts.
    pub(crate) whole: bool,
    pub(crate) parts: Vec<FingerprintTerm>,
}

/// One part of a fingerprint: `root.seg.seg`, or a parameter itself.
pub(crate) struct FingerprintTerm {
    pub(crate) root: Ident,
    /// Spanned on the literal.
    pub(crate) fields: Vec<syn::Member>,
    /// A parameter itself, taken by reference: fingerprinted through the
    /// reference, so that an error names the message's type.
    pub(crate) deref: bool,
}

/// The whole model of one handler.
pub(crate) struct Handler {
    pub(crate) func: ItemFn,
    pub(crate) krate: syn::Path,
    pub(crate) name: String,
    pub(crate) key_text: String,
    pub(crate) key: Vec<KeyTerm>,
    pub(crate) key_span: Span,
    pub(crate) ttl: Duration,
    pub(crate) store: StoreArg,
    /// What must not change between deliveries of one key.
    pub(crate) fingerprint: Option<Fingerprint>,
    /// What holds the claim while the body runs.
    pub(crate) mode: Mode,
    /// How many messages one call handles.
    pub(crate) shape: Shape,
    pub(crate) receiver: Option<syn::Receiver>,
    pub(crate) params: Vec<Param>,
    /// `Ok` and `Err` types of the handler's result; `None` where the
    /// signature does not name them (`AppResult<T>`, `io::Result<T>`'s `Err`),
    /// and the runtime's `HandlerResult` does.
    pub(crate) ok_ty: Option<Type>,
    pub(crate) err_ty: Option<Type>,
    /// The written return type, for spans and the body's type check.
    pub(crate) ret_ty: Type,
}

/// Default lease of lease-mode handlers.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// What holds a handler's claim while its body runs.
pub(crate) enum Mode {
    /// The first parameter is `&mut T`, a store's transaction: the body runs
    /// in it, and it holds the claim until it commits or rolls back.
    Tx {
        /// The transaction parameter, bound inside the body.
        param: syn::PatType,
    },
    /// No transaction parameter: a lease holds the claim, renewed while the
    /// body runs.
    Lease {
        /// How long a claim may stay in progress unrenewed: the `lease`
        /// argument, or [`DEFAULT_LEASE`].
        lease: Duration,
    },
}

impl Mode {
    /// The lease the handler's spec carries: [`DEFAULT_LEASE`] in
    /// transaction mode, where the runtime does not read it.
    pub(crate) fn lease(&self) -> Duration {
        match self {
            Mode::Tx { .. } => DEFAULT_LEASE,
            Mode::Lease { lease } => *lease,
        }
    }
}

/// How many messages one call of a handler handles.
pub(crate) enum Shape {
    /// One: the key reads the message parameters.
    Single {
        /// The `&Key` parameter, if the body reads its key.
        key_param: Option<syn::PatType>,
        /// The `&mut Outbox` parameter, if the body stages messages
        /// (transaction mode only).
        outbox_param: Option<syn::PatType>,
        /// How many failed deliveries of one key are allowed.
        max_attempts: Option<u32>,
    },
    /// A slice of messages, `msgs: &[M]`, each with its own key.
    Batch(Box<Batch>),
}

/// The batch parameter of a batch handler, `msgs: &[M]`: the key (and
/// the fingerprint) read each of its elements.
#[derive(Clone)]
pub(crate) struct Batch {
    /// The parameter's name, where key and fingerprint paths start.
    pub(crate) ident: Ident,
    /// The parameter as written.
    pub(crate) param: syn::PatType,
    /// `M`, as written.
    pub(crate) elem: Type,
}

/// What is known of a handler the macro refuses: enough to emit a stub with
/// the rewritten signature, so that its callers see no second error.
pub(crate) struct Stub {
    pub(crate) func: ItemFn,
    pub(crate) krate: syn::Path,
    /// The store, when its argument could be read.
    pub(crate) store: Option<StoreArg>,
    /// The transaction parameter, in transaction mode.
    pub(crate) tx_param: Option<syn::PatType>,
    pub(crate) receiver: Option<syn::Receiver>,
    /// The parameters that stay in the rewritten signature.
    pub(crate) params: Vec<syn::PatType>,
    /// `None` when the return type itself was refused.
    pub(crate) result: Option<ResultTypes>,
    /// The written return type of a `fn` (not `async`) that returns a
    /// future of its result: `result` then holds the future's `Output`.
    pub(crate) future: Option<Type>,
    /// Whether the handler takes a batch, as far as could be told.
    pub(crate) batch: bool,
}

/// The handler's result: its `Ok` and `Err` types where the signature
/// names them, and the written type.
#[derive(Clone)]
pub(crate) struct ResultTypes {
    /// `None` where only the runtime's `HandlerResult` can name it.
    pub(crate) ok: Option<Type>,
    pub(crate) err: Option<Type>,
    pub(crate) written: Type,
}
