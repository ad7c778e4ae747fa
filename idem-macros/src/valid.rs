//! Checks the arguments against the function and builds the model that
//! `expand` generates from. Pure checks: nothing here emits code.

use std::time::Duration;

use idem_grammar::{FingerprintExpr, KeyExpr, Part, Segment};
use proc_macro2::Span;
use syn::{FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments, ReturnType, Type};

use crate::attr::Args;
use crate::ctxt::Ctxt;
use crate::model::{
    Batch, DEFAULT_LEASE, Fingerprint, FingerprintTerm, Handler, KeyTerm, Mode, Param, ResultTypes,
    Shape, StoreArg, StoreRef, Stub,
};
use crate::types::{mut_referent, unparenthesized};

/// The model when nothing was wrong enough to stop generation, and the stub
/// to emit otherwise (errors are in `cx` either way).
pub(crate) struct Checked {
    pub(crate) handler: Option<Handler>,
    pub(crate) stub: Stub,
}

/// Checks everything.
pub(crate) fn check(cx: &mut Ctxt, args: &Args, func: &ItemFn) -> Checked {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            "#[idempotent] needs an `async fn`: the claim and the record are awaited around the body",
        );
    }
    if let Some(c) = &sig.constness {
        cx.error_spanned_by(c, "an idempotent handler cannot be `const`");
    }
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(v, "an idempotent handler cannot be variadic");
    }

    missing_arguments(cx, args);
    let store = args.store.as_ref().and_then(|lit| store(cx, lit));
    let ttl = args.ttl.as_ref().and_then(|lit| duration(cx, lit, "ttl"));
    let lease = match &args.lease {
        Some(lit) => duration(cx, lit, "lease"),
        None => Some(DEFAULT_LEASE),
    };
    let name = match &args.name {
        Some(lit) => handler_name(cx, lit),
        None => Some(sig.ident.to_string().trim_start_matches("r#").to_owned()),
    };
    let krate = match &args.krate {
        Some(lit) => {
            match lit.parse::<syn::Path>() {
                Ok(p) => Some(p),
                Err(_) => {
                    cx.error_spanned_by(lit, "`crate` takes a path, e.g. crate = \"my_idem\" or crate = \"::idem_runtime\"");
                    None
                }
            }
        }
        None => Some(syn::parse_quote!(::idem_runtime)),
    };

    let result_types = return_types(cx, &sig.output, &sig.ident);
    let max_attempts = args.max_attempts.as_ref().and_then(|e| max_attempts(cx, e));

    // The names the key's and the fingerprint's paths start with: a
    // parameter they read from is a message, whatever its type is called.
    let key_roots: Vec<String> = args
        .key
        .as_ref()
        .and_then(|lit| idem_grammar::parse_key(&lit.value()).ok())
        .into_iter()
        .chain(args.fingerprint.as_ref().and_then(|lit| {
            match idem_grammar::parse_fingerprint(&lit.value()) {
                Ok(FingerprintExpr::Parts(expr)) => Some(expr),
                _ => None,
            }
        }))
        .flat_map(|expr| roots(&expr))
        .collect();
    let sig_parts = params(
        cx,
        func,
        krate.as_ref().unwrap_or(&syn::parse_quote!(::idem_runtime)),
        &key_roots,
    );

    if let (Some(_), Some(lit)) = (&sig_parts.tx_param, &args.lease) {
        cx.error_spanned_by(
            lit,
            "`lease` has no meaning in transaction mode: the open transaction holds the claim until it commits or rolls back; remove `lease`, or remove the transaction parameter to run in lease mode",
        );
    }

    // A key reads messages, which a handler takes by value or by shared
    // reference; a `&mut` parameter is state of the body (or a transaction
    // out of place, which the runtime reports), unless all its parameters
    // are `&mut`.
    let all_mut = sig_parts
        .params
        .iter()
        .all(|p| mut_referent(&p.arg.ty).is_some());
    let messages: Vec<Param> = sig_parts
        .params
        .iter()
        .filter(|p| all_mut || mut_referent(&p.arg.ty).is_none())
        .map(|p| Param {
            arg: p.arg.clone(),
            ident: p.ident.clone(),
        })
        .collect();
    let key = args
        .key
        .as_ref()
        .and_then(|lit| key(cx, lit, &messages, sig_parts.receiver.is_some()));
    let fingerprint = args
        .fingerprint
        .as_ref()
        .map(|lit| fingerprint(cx, lit, &messages, sig_parts.receiver.is_some()));

    let batch = batch(
        cx,
        &messages,
        key.as_deref(),
        args.key.is_some(),
        sig_parts.key_param.as_ref(),
        args.max_attempts.as_ref(),
    );

    let stub = Stub {
        func: func.clone(),
        krate: krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::idem_runtime)),
        store: store.clone(),
        tx_param: sig_parts.tx_param.clone(),
        receiver: sig_parts.receiver.clone(),
        params: sig_parts.params.iter().map(|p| p.arg.clone()).collect(),
        result: result_types.clone(),
        batch: matches!(batch, Ok(Some(_)) | Err(true)),
    };
    let handler = (|| {
        let result = result_types?;
        Some(Handler {
            func: func.clone(),
            krate: krate?,
            name: name?,
            key_text: args.key.as_ref()?.value(),
            key: key?,
            key_span: args.key.as_ref()?.span(),
            ttl: ttl?,
            store: store?,
            fingerprint: match fingerprint {
                Some(checked) => Some(checked?),
                None => None,
            },
            mode: match sig_parts.tx_param {
                Some(param) => Mode::Tx { param },
                None => Mode::Lease { lease: lease? },
            },
            shape: match batch.ok()? {
                Some(batch) => Shape::Batch(Box::new(batch)),
                None => Shape::Single {
                    key_param: sig_parts.key_param,
                    max_attempts: match &args.max_attempts {
                        Some(_) => Some(max_attempts?),
                        None => None,
                    },
                },
            },
            receiver: sig_parts.receiver,
            params: sig_parts.params,
            ok_ty: result.ok,
            err_ty: result.err,
            ret_ty: result.written,
        })
    })();
    Checked { handler, stub }
}

/// Reports the required arguments that are absent, in one error when several
/// are, on the attribute (there is no token of theirs to point at).
fn missing_arguments(cx: &mut Ctxt, args: &Args) {
    // (argument, what it says, an example)
    let required: [(&str, &str, &str); 3] = [
        (
            "key",
            "the message fields that identify a message",
            "key = \"order_id\"",
        ),
        (
            "ttl",
            "how long a completed message suppresses duplicates",
            "ttl = \"24h\"",
        ),
        (
            "store",
            "where the records live: the name of one of idem_runtime's stores, or the path of a store type of your own",
            "store = \"sqlite\"",
        ),
    ];
    let missing: Vec<_> = required
        .iter()
        .filter(|(label, _, _)| args.is_missing(label))
        .collect();
    let message = match missing.as_slice() {
        [] => return,
        [(label, what, example)] => format!("missing `{label}`: {what}, e.g. {example}"),
        [first @ .., last] => {
            let names: Vec<String> = first.iter().map(|(l, _, _)| format!("`{l}`")).collect();
            let whats: Vec<&str> = first.iter().map(|(_, w, _)| *w).collect();
            let examples: Vec<&str> = missing.iter().map(|(_, _, e)| *e).collect();
            format!(
                "missing {} and `{}`: {}, and {}; e.g. {}",
                names.join(", "),
                last.0,
                whats.join(", "),
                last.1,
                examples.join(", ")
            )
        }
    };
    cx.error_at(Span::call_site(), message);
}

fn store(cx: &mut Ctxt, lit: &LitStr) -> Option<StoreArg> {
    let value = lit.value();
    let arg = |store| {
        Some(StoreArg {
            store,
            text: value.clone(),
            span: lit.span(),
        })
    };
    let ident = syn::parse_str::<Ident>(&value)
        .ok()
        .filter(|i| *i == value && !value.starts_with("r#"));
    if let Some(mut name) = ident {
        if value.chars().all(|c| !c.is_ascii_uppercase()) {
            name.set_span(lit.span());
            return arg(StoreRef::Name(name));
        }
        cx.error_spanned_by(
            lit,
            format!(
                "unknown store \"{value}\": built-in stores have lowercase names (did you mean \"{}\"?), and a store type of your own is named by its path, e.g. store = \"crate::{value}\"",
                value.to_ascii_lowercase()
            ),
        );
        return None;
    }
    if value.contains("::")
        && let Ok(path) = syn::parse_str::<syn::Path>(&value)
    {
        return arg(StoreRef::Type(path));
    }
    // A slip of case or spacing (`"redis "`, `"Sqlite 3"`): suggest the
    // name it looks like; rustc then says whether that store exists.
    let meant: String = value
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let suggestion = syn::parse_str::<Ident>(&meant)
        .ok()
        .map(|_| format!(": did you mean \"{meant}\"?"))
        .unwrap_or_default();
    cx.error_spanned_by(
        lit,
        format!(
            "invalid store \"{value}\"{suggestion} A built-in store is named by a lowercase identifier, e.g. store = \"sqlite\", and a store type of your own by its path, e.g. store = \"crate::MyStore\""
        ),
    );
    None
}

/// `a`, `a and b`, `a, b and c` (with `word` in place of `and`).
fn list(items: &[String], word: &str) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [first @ .., last] => format!("{} {word} {last}", first.join(", ")),
    }
}

fn duration(cx: &mut Ctxt, lit: &LitStr, what: &str) -> Option<Duration> {
    match idem_grammar::parse_duration(&lit.value()) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `{what}`: {}", e.message));
            None
        }
    }
}

fn handler_name(cx: &mut Ctxt, lit: &LitStr) -> Option<String> {
    let value = lit.value();
    if value.is_empty()
        || value.len() > 128
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        cx.error_spanned_by(
            lit,
            "`name` must be 1 to 128 characters without spaces, e.g. name = \"deduct_stock\"; it scopes the handler's keys in the store, so keep it stable",
        );
        return None;
    }
    Some(value)
}

/// Splits the return type. `Result<T, E>` names both parts; `X::Result<T>`
/// (`io::Result<T>`, `anyhow::Result<T>`, a `Result<T>` alias) names `Ok`.
/// Any other path type (`AppResult<T>`, a zero-argument alias) is taken as a
/// `Result` whose parts the runtime's `HandlerResult` names; that trait is
/// implemented for `Result` only, so `Option<u64>` or `u64` is reported by
/// rustc on the type itself. Only what is surely not a `Result` (a tuple, a
/// reference, `impl Trait`, no return type) is refused here.
fn return_types(cx: &mut Ctxt, output: &ReturnType, ident: &Ident) -> Option<ResultTypes> {
    const ADVICE: &str = "an idempotent handler returns `Result<T, E>` (or an alias of it): `Ok(T)` is recorded and handed to duplicates, `Err(E)` records nothing so a redelivery runs again";
    let ty = match output {
        ReturnType::Default => {
            cx.error_spanned_by(ident, format!("`{ident}` returns nothing: {ADVICE}"));
            return None;
        }
        ReturnType::Type(_, ty) => &**ty,
    };
    let path = match ty {
        Type::Path(p) => p,
        Type::Group(syn::TypeGroup { elem, .. }) | Type::Paren(syn::TypeParen { elem, .. }) => {
            return return_types(
                cx,
                &ReturnType::Type(Default::default(), elem.clone()),
                ident,
            );
        }
        _ => {
            cx.error_spanned_by(ty, format!("this return type is not a `Result`: {ADVICE}"));
            return None;
        }
    };
    let mut types = ResultTypes {
        ok: None,
        err: None,
        written: ty.clone(),
    };
    if path.qself.is_some() {
        return Some(types);
    }
    let Some(last) = path.path.segments.last() else {
        return Some(types);
    };
    let args: Vec<&Type> = match &last.arguments {
        PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    // Only the standard `Result<T, E>` is read by position; any other path
    // (`io::Result<T>`, `x::Result<T, C>`, `AppResult<T>`) may give its
    // parameters other meanings, so its parts are named by `HandlerResult`.
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let standard = match segments.as_slice() {
        [r] => r == "Result",
        [root, m, r] => (root == "std" || root == "core") && m == "result" && r == "Result",
        _ => false,
    };
    if let ([ok, err], true) = (args.as_slice(), standard) {
        types.ok = Some((*ok).clone());
        types.err = Some((*err).clone());
    }
    Some(types)
}

struct SigParts {
    tx_param: Option<syn::PatType>,
    key_param: Option<syn::PatType>,
    receiver: Option<syn::Receiver>,
    params: Vec<Param>,
}

/// How a parameter's type names a `Key`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyName {
    /// `&idem_runtime::Key` or `&<crate>::Key`: surely idem's key.
    Idem,
    /// `&Key`: idem's key if imported, or the user's own type named `Key`.
    Bare,
    /// Anything else, including `&some::other::Key`.
    No,
}

/// Whether `ty` names idem's key type. The macro cannot resolve types, so
/// the path decides: see [`params`] for how a bare `&Key` is read.
fn key_name(ty: &Type, krate: &syn::Path) -> KeyName {
    let Type::Reference(r) = ty else {
        return KeyName::No;
    };
    let Type::Path(p) = &*r.elem else {
        return KeyName::No;
    };
    if r.mutability.is_some() || p.qself.is_some() {
        return KeyName::No;
    }
    let segments: Vec<String> = p
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let no_arguments = p.path.segments.iter().all(|s| s.arguments.is_empty());
    if !no_arguments || segments.last().is_none_or(|l| l != "Key") {
        return KeyName::No;
    }
    let prefix = &segments[..segments.len() - 1];
    let krate: Vec<String> = krate.segments.iter().map(|s| s.ident.to_string()).collect();
    match prefix {
        [] if p.path.leading_colon.is_none() => KeyName::Bare,
        [only] if only == "idem_runtime" => KeyName::Idem,
        _ if prefix == krate.as_slice() => KeyName::Idem,
        _ => KeyName::No,
    }
}

/// Sorts the parameters: the receiver, the transaction, the key, and the
/// rest (the message parameters, which stay in the rewritten signature).
///
/// The first parameter after `self`, when it is `&mut T`, is the
/// transaction: the handler runs in transaction mode. The runtime checks that
/// `T` is a store's transaction, and that no `&mut` parameter after it is one.
///
/// `&idem_runtime::Key` (or `&<crate>::Key`) is always the key parameter. A
/// bare `&Key` is the key parameter only when there is no such explicit one,
/// another parameter can be the message, and no key path starts with its
/// name; otherwise it is a message (an application's own type named `Key`).
/// Any other path ending in `Key` (`&crate::Key`) is a message. A bare
/// `&Key` taken for the key but
/// naming the user's type is reported by rustc through the runtime's
/// `IdemKey` check, on that type.
fn params(cx: &mut Ctxt, func: &ItemFn, krate: &syn::Path, key_roots: &[String]) -> SigParts {
    let mut parts = SigParts {
        tx_param: None,
        key_param: None,
        receiver: None,
        params: Vec::new(),
    };
    // The parameters that are neither the receiver nor the transaction,
    // with how their type names `Key`.
    let mut rest: Vec<(&syn::PatType, KeyName)> = Vec::new();
    let mut index = 0;
    for arg in &func.sig.inputs {
        let pt = match arg {
            FnArg::Receiver(r) => {
                parts.receiver = Some(r.clone());
                continue;
            }
            FnArg::Typed(pt) => pt,
        };
        let position = index;
        index += 1;
        // The first parameter is the transaction when it is `&mut` and a
        // message follows: a handler whose only parameters are `&mut` takes
        // its message that way.
        let message_follows = func
            .sig
            .inputs
            .iter()
            .skip_while(|a| matches!(a, FnArg::Receiver(_)))
            .skip(1)
            .any(|a| matches!(a, FnArg::Typed(other) if mut_referent(&other.ty).is_none()));
        if position == 0 && mut_referent(&pt.ty).is_some() && message_follows {
            parts.tx_param = Some(pt.clone());
            continue;
        }
        let mut name = key_name(&pt.ty, krate);
        let read_by_key = match &*pt.pat {
            Pat::Ident(pi) => key_roots.iter().any(|r| pi.ident == r),
            _ => false,
        };
        if name == KeyName::Bare && read_by_key {
            name = KeyName::No;
        }
        rest.push((pt, name));
    }
    let explicit = rest.iter().any(|(_, k)| *k == KeyName::Idem);
    let bare = rest.iter().filter(|(_, k)| *k == KeyName::Bare).count();
    let bare_is_key = !explicit && bare > 0 && rest.len() > bare;
    for (pt, name) in rest {
        let is_key = match name {
            KeyName::Idem => true,
            KeyName::Bare => bare_is_key,
            KeyName::No => false,
        };
        if is_key {
            if parts.key_param.is_some() {
                cx.error_spanned_by(&pt.ty, "only one `&Key` parameter is allowed");
            }
            parts.key_param = Some(pt.clone());
            continue;
        }
        let ident = match &*pt.pat {
            Pat::Ident(pi) if pi.subpat.is_none() => Some(pi.ident.clone()),
            _ => None,
        };
        parts.params.push(Param {
            arg: pt.clone(),
            ident,
        });
    }
    parts
}

/// `M` of a parameter type `&[M]` (or `&'a [M]`): the one form of a batch.
fn slice_elem(ty: &Type) -> Option<&Type> {
    match unparenthesized(ty) {
        Type::Reference(r) if r.mutability.is_none() => match unparenthesized(&r.elem) {
            Type::Slice(s) => Some(&s.elem),
            _ => None,
        },
        _ => None,
    }
}

/// What a type that holds several messages but is no `&[M]` is: `&mut
/// [M]`, an array, a `Vec` or a boxed slice, by value or by reference.
/// `None` for anything else.
fn batch_like(ty: &Type) -> Option<&'static str> {
    match unparenthesized(ty) {
        Type::Reference(r) => match unparenthesized(&r.elem) {
            Type::Slice(_) if r.mutability.is_some() => Some("a `&mut` slice"),
            inner => batch_like(inner).map(|what| match what {
                "an array" => "a reference to an array",
                "a `Vec`" => "a reference to a `Vec`",
                other => other,
            }),
        },
        Type::Array(_) => Some("an array"),
        Type::Slice(_) => Some("a slice by value"),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            let one_type = matches!(&last.arguments, PathArguments::AngleBracketed(a)
                if a.args.len() == 1 && matches!(a.args.first(), Some(GenericArgument::Type(_))));
            match &last.arguments {
                PathArguments::AngleBracketed(a) if last.ident == "Box" => match a.args.first() {
                    Some(GenericArgument::Type(Type::Slice(_))) => Some("a boxed slice"),
                    _ => None,
                },
                _ if last.ident == "Vec" && one_type => Some("a `Vec`"),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The batch parameter, when the key reads a parameter taken as `&[M]`;
/// and the refusals of what a batch handler cannot have. `Err(batch)`
/// once an error is recorded, `batch` telling whether the handler still
/// reads as one (for the stub's signature).
fn batch(
    cx: &mut Ctxt,
    messages: &[Param],
    key: Option<&[KeyTerm]>,
    key_given: bool,
    key_param: Option<&syn::PatType>,
    max_attempts: Option<&syn::Expr>,
) -> Result<Option<Batch>, bool> {
    // The parameters the key reads, and whether it reads their fields. A
    // key that could not be resolved (an error is reported) is taken to read
    // the one slice among the messages, if there is one, so that the stub's
    // signature is the batch's.
    let read: Vec<(&Param, bool)> = match key {
        Some(terms) => messages
            .iter()
            .filter_map(|m| {
                let ident = m.ident.as_ref()?;
                let mut fields = terms.iter().filter_map(|t| match t {
                    KeyTerm::Path { root, fields, .. } if root == ident => Some(!fields.is_empty()),
                    _ => None,
                });
                let first = fields.next()?;
                Some((m, first || fields.any(|f| f)))
            })
            .collect(),
        None if key_given => {
            let mut slices = messages.iter().filter(|m| slice_elem(&m.arg.ty).is_some());
            match (slices.next(), slices.next()) {
                (Some(only), None) => vec![(only, true)],
                _ => Vec::new(),
            }
        }
        None => Vec::new(),
    };
    let mut ok = true;
    let mut batches: Vec<(&Param, &Type)> = Vec::new();
    for (param, with_fields) in read {
        if let Some(elem) = slice_elem(&param.arg.ty) {
            batches.push((param, elem));
        } else if let (Some(what), true) = (batch_like(&param.arg.ty), with_fields) {
            let name = param
                .ident
                .as_ref()
                .map_or("msgs".to_owned(), ToString::to_string);
            cx.error_spanned_by(
                &param.arg.ty,
                format!(
                    "`{name}` is {what}: a batch handler takes its messages as a shared slice, `{name}: &[M]`, whose elements the key reads one by one{}",
                    if what.ends_with("`Vec`") {
                        " (callers pass `&vec`)"
                    } else {
                        ""
                    }
                ),
            );
            ok = false;
        }
    }
    let (param, elem) = match batches.as_slice() {
        [] => return if ok { Ok(None) } else { Err(false) },
        [only] => *only,
        [_, .., last] => {
            let names: Vec<String> = batches
                .iter()
                .filter_map(|(p, _)| p.ident.as_ref().map(|i| format!("`{i}`")))
                .collect();
            cx.error_spanned_by(
                &last.0.arg.ty,
                format!(
                    "the key reads {}, and each is a batch (`&[M]`): a batch handler takes one batch, whose messages the key reads one by one; take the other parameters as single values",
                    list(&names, "and")
                ),
            );
            return Err(true);
        }
    };
    let Some(ident) = param.ident.clone() else {
        return Err(true);
    };
    if batch_like(elem).is_some() || slice_elem(elem).is_some() {
        cx.error_spanned_by(
            elem,
            format!(
                "`{ident}` is a batch of batches: the elements of `&[M]` are the handler's messages, whose fields the key reads one by one; take `&[M]` with `M` the message type, and call the handler once per batch"
            ),
        );
        ok = false;
    }
    if let Some(expr) = max_attempts {
        cx.error_spanned_by(
            expr,
            "`max_attempts` cannot count the failures of a batch handler: its body runs once for all the fresh messages of a batch and fails for all of them, so a failure belongs to no one message; remove `max_attempts` (a failed batch records nothing, and its messages run again when redelivered)",
        );
        ok = false;
    }
    if let Some(key_param) = key_param {
        cx.error_spanned_by(
            &key_param.ty,
            format!(
                "a batch handler has no single key to give its body: each message of `{ident}` has its own; remove this parameter"
            ),
        );
        ok = false;
    }
    if !ok {
        return Err(true);
    }
    Ok(Some(Batch {
        ident,
        param: param.arg.clone(),
        elem: elem.clone(),
    }))
}

/// The first segments of the expression's paths.
fn roots(expr: &KeyExpr) -> Vec<String> {
    expr.parts
        .iter()
        .filter_map(|p| match p {
            Part::Path { segments, .. } => match segments.first() {
                Some(Segment::Field(f)) => Some(f.clone()),
                _ => None,
            },
            Part::Const { .. } => None,
        })
        .collect()
}

fn key(cx: &mut Ctxt, lit: &LitStr, params: &[Param], method: bool) -> Option<Vec<KeyTerm>> {
    let text = lit.value();
    let expr = match idem_grammar::parse_key(&text) {
        Ok(e) => e,
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `key`: {}", e.message));
            return None;
        }
    };
    if expr.parts.iter().all(|p| matches!(p, Part::Const { .. })) {
        cx.error_spanned_by(
            lit,
            "this key has only constants, so every message would share one key: add a field of the message, e.g. key = \"'deduct' + order_id\"",
        );
        return None;
    }
    terms(cx, lit, "key", &expr, params, method)
}

/// The `fingerprint` argument: `*` (the one message parameter), or paths
/// read as the key's are. `None` once an error is recorded.
fn fingerprint(cx: &mut Ctxt, lit: &LitStr, params: &[Param], method: bool) -> Option<Fingerprint> {
    let text = lit.value();
    let expr = match idem_grammar::parse_fingerprint(&text) {
        Ok(e) => e,
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `fingerprint`: {}", e.message));
            return None;
        }
    };
    let by_reference = |param: &Param| matches!(unparenthesized(&param.arg.ty), Type::Reference(_));
    let expr = match expr {
        FingerprintExpr::Message => {
            let term = match params {
                [] => {
                    cx.error_spanned_by(
                        lit,
                        "fingerprint = \"*\" fingerprints the message, but the handler has no message parameter",
                    );
                    return None;
                }
                [only] => match &only.ident {
                    Some(ident) => FingerprintTerm {
                        root: ident.clone(),
                        fields: Vec::new(),
                        deref: by_reference(only),
                    },
                    None => {
                        cx.error_spanned_by(
                            &only.arg.pat,
                            "the message parameter needs a plain name (e.g. `msg: &OrderPlaced`) for fingerprint = \"*\" to read it",
                        );
                        return None;
                    }
                },
                several => {
                    let names: Vec<String> = several
                        .iter()
                        .filter_map(|p| p.ident.as_ref().map(ToString::to_string))
                        .collect();
                    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                    let example = match names.as_slice() {
                        [a, b, ..] => format!(
                            ": each message whole (fingerprint = \"{a} + {b}\") or the fields that matter (fingerprint = \"{a}.<field> + {b}.<field>\")"
                        ),
                        _ => String::new(),
                    };
                    cx.error_spanned_by(
                        lit,
                        format!(
                            "fingerprint = \"*\" is ambiguous: `*` is the message, and this handler takes {} ({}); name the parts to fingerprint{example}",
                            several.len(),
                            list(&quoted, "and")
                        ),
                    );
                    return None;
                }
            };
            return Some(Fingerprint {
                text,
                span: lit.span(),
                whole: true,
                parts: vec![term],
            });
        }
        FingerprintExpr::Parts(expr) => expr,
    };
    // A constant is the same in every delivery: it would compare nothing.
    let constants: Vec<String> = expr
        .parts
        .iter()
        .filter(|p| matches!(p, Part::Const { .. }))
        .map(ToString::to_string)
        .collect();
    if !constants.is_empty() {
        cx.error_spanned_by(
            lit,
            format!(
                "a fingerprint compares deliveries of one key, and a constant ({}) is the same in every delivery: remove it and name message fields, e.g. fingerprint = \"qty + price\"",
                list(&constants, "and")
            ),
        );
        return None;
    }
    let terms = terms(cx, lit, "fingerprint", &expr, params, method)?;
    let parts = terms
        .into_iter()
        .filter_map(|term| match term {
            KeyTerm::Path { root, fields, .. } => {
                let deref = fields.is_empty()
                    && params
                        .iter()
                        .any(|p| p.ident.as_ref() == Some(&root) && by_reference(p));
                Some(FingerprintTerm {
                    root,
                    fields,
                    deref,
                })
            }
            KeyTerm::Const(_) => None,
        })
        .collect();
    Some(Fingerprint {
        text,
        span: lit.span(),
        whole: false,
        parts,
    })
}

/// The terms of a key (`what` = "key") or fingerprint expression: each path
/// resolved to a parameter and its fields, spanned on the literal. `None`
/// once an error is recorded.
fn terms(
    cx: &mut Ctxt,
    lit: &LitStr,
    what: &str,
    expr: &KeyExpr,
    params: &[Param],
    method: bool,
) -> Option<Vec<KeyTerm>> {
    let names: Vec<String> = params
        .iter()
        .filter_map(|p| p.ident.as_ref().map(|i| i.to_string()))
        .collect();
    // The parameters that some key part already starts with.
    let used_roots: Vec<&str> = expr
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Path { segments, .. } => match segments.first() {
                Some(Segment::Field(f)) if segments.len() > 1 => Some(f.as_str()),
                _ => None,
            },
            Part::Const { .. } => None,
        })
        .filter(|f| names.iter().any(|n| n == f))
        .collect();
    // A method's key that reads the receiver (`self.tenant`) has two roots,
    // so the message's paths may name theirs too (`msg.id`).
    let reads_self = method
        && expr.parts.iter().any(|p| {
            matches!(p, Part::Path { segments, .. }
                if segments.len() > 1 && matches!(&segments[0], Segment::Field(f) if f == "self"))
        });
    let mut out = Vec::new();
    let mut ok = true;
    for part in &expr.parts {
        let (segments, part_text) = match part {
            Part::Const { value, .. } => {
                out.push(KeyTerm::Const(value.clone()));
                continue;
            }
            Part::Path { segments, .. } => (segments, part.to_string()),
        };
        // `self`, `super`, `crate` and `Self` are never field names; `self`
        // may start a path in a method.
        let keyword = segments.iter().enumerate().find_map(|(i, s)| match s {
            Segment::Field(f) if matches!(f.as_str(), "self" | "super" | "crate" | "Self") => {
                Some((i, f.as_str()))
            }
            _ => None,
        });
        let from_self = match keyword {
            None => false,
            Some((0, "self")) if method && segments.len() > 1 => true,
            Some((0, "self")) if method => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` is the receiver itself: name one of its fields, e.g. `self.tenant`"),
                );
                ok = false;
                continue;
            }
            Some((0, "self")) => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` reads `self`, but this handler is not a method: start the path with a parameter's name"),
                );
                ok = false;
                continue;
            }
            Some((_, word)) => {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "{what} part `{part_text}`: `{word}` is a keyword and cannot be a field name"
                    ),
                );
                ok = false;
                continue;
            }
        };
        let (root, rest): (Ident, &[Segment]) = match params {
            _ if from_self => (Ident::new("self", lit.span()), &segments[1..]),
            [] => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` names a field, but the handler has no message parameter to read it from"),
                );
                ok = false;
                continue;
            }
            [only] => match &only.ident {
                Some(ident)
                    if reads_self
                        && segments.len() > 1
                        && matches!(&segments[0], Segment::Field(f) if ident == f) =>
                {
                    (ident.clone(), &segments[1..])
                }
                Some(ident) => (ident.clone(), &segments[..]),
                None => {
                    cx.error_spanned_by(
                        &only.arg.pat,
                        format!("the message parameter needs a plain name (e.g. `msg: &OrderPlaced`) for the {what} to read its fields"),
                    );
                    ok = false;
                    continue;
                }
            },
            _ => {
                let first = match &segments[0] {
                    Segment::Field(f) => f.as_str(),
                    Segment::Index(_) => "",
                };
                let root = params
                    .iter()
                    .filter_map(|p| p.ident.as_ref())
                    .find(|i| *i == first);
                match root {
                    Some(r) => (r.clone(), &segments[1..]),
                    None => {
                        let message = if segments.len() == 1 {
                            let suggestions: Vec<String> =
                                names.iter().map(|n| format!("`{n}.{part_text}`")).collect();
                            format!(
                                "{what} part `{part_text}` is ambiguous: with several message parameters a {what} path starts with the parameter's name, e.g. {}",
                                suggestions.join(" or ")
                            )
                        } else {
                            not_a_parameter(what, &part_text, segments, &names, &used_roots)
                        };
                        cx.error_spanned_by(lit, message);
                        ok = false;
                        continue;
                    }
                }
            }
        };
        let fields = rest.iter().map(|s| member(s, lit.span())).collect();
        out.push(KeyTerm::Path {
            root,
            fields,
            text: part_text,
        });
    }
    ok.then_some(out)
}

/// The message for a path whose first segment is no parameter: names
/// the parameters, and suggests the path with the nearest parameter's name
/// in place of the first segment (by edit distance; of equally near ones,
/// one that no other key part starts with yet).
fn not_a_parameter(
    what: &str,
    part_text: &str,
    segments: &[Segment],
    names: &[String],
    used_roots: &[&str],
) -> String {
    let first = segments[0].to_string();
    let rest: Vec<String> = segments[1..].iter().map(ToString::to_string).collect();
    let rest = rest.join(".");
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    let nearest = names.iter().min_by_key(|n| {
        (
            crate::attr::distance(&first, n),
            used_roots.contains(&n.as_str()),
        )
    });
    let mut message = format!(
        "{what} part `{part_text}` starts with `{first}`, but the handler has no parameter `{first}`: its parameters are {}",
        list(&quoted, "and")
    );
    if let Some(n) = nearest {
        message.push_str(&format!("; did you mean `{n}.{rest}`?"));
        let slip = crate::attr::similar(&first, &[n.as_str()]).is_some()
            || first.chars().next() == n.chars().next();
        if !slip {
            // Neither a misspelling nor an abbreviation of the name: `first`
            // may be a field of a parameter.
            message.push_str(&format!(
                " (if `{first}` is a field, start with the parameter's name: `{n}.{part_text}`)"
            ));
        }
    }
    message
}

/// A field access whose tokens carry the key literal's span, so rustc's own
/// "no field" diagnostics land on the attribute. Keywords that can be raw
/// identifiers (`type`, `match`) become `r#type`; `self`, `super`, `crate`
/// and `Self`, which cannot, were refused before.
fn member(segment: &Segment, span: Span) -> syn::Member {
    match segment {
        Segment::Field(name) => {
            let ident = syn::parse_str::<Ident>(name)
                .map(|mut i| {
                    i.set_span(span);
                    i
                })
                .unwrap_or_else(|_| Ident::new_raw(name, span));
            syn::Member::Named(ident)
        }
        Segment::Index(i) => syn::Member::Unnamed(syn::Index { index: *i, span }),
    }
}

/// The `max_attempts` argument: an integer literal from 1 to `u32::MAX`.
/// Anything else is reported on it, with what to write instead.
fn max_attempts(cx: &mut Ctxt, expr: &syn::Expr) -> Option<u32> {
    const MEANING: &str = "it is how many deliveries of one key may fail before the next one is refused with `Error::Exhausted` without running the body";
    let expr = unparenthesized_expr(expr);
    let message = match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(int),
            ..
        }) => {
            let suffix = int.suffix();
            let digits = int.base10_digits();
            let value = int.base10_parse::<u128>().ok();
            let fits_suffix = match (suffix, value) {
                (_, None) => true,
                ("u8", Some(v)) => v <= u128::from(u8::MAX),
                ("i8", Some(v)) => v <= 127,
                ("u16", Some(v)) => v <= u128::from(u16::MAX),
                ("i16", Some(v)) => v <= 32_767,
                ("i32", Some(v)) => v <= 2_147_483_647,
                _ => true,
            };
            let integer_suffix = matches!(
                suffix,
                "" | "u8"
                    | "u16"
                    | "u32"
                    | "u64"
                    | "u128"
                    | "usize"
                    | "i8"
                    | "i16"
                    | "i32"
                    | "i64"
                    | "i128"
                    | "isize"
            );
            match value.and_then(|v| u32::try_from(v).ok()) {
                _ if !integer_suffix => format!(
                    "`{int}` is not an integer: write max_attempts = {digits}"
                ),
                _ if !fits_suffix => format!(
                    "`{int}` does not fit a `{suffix}`: write max_attempts = {digits}"
                ),
                Some(0) => format!(
                    "`max_attempts` must be at least 1: {MEANING}, so 0 would refuse every delivery; write max_attempts = 1 or more, or remove it to let every delivery run"
                ),
                Some(n) => return Some(n),
                None => format!(
                    "`max_attempts = {digits}` is too large: it is a `u32`, at most {}; remove it to let every delivery run",
                    u32::MAX
                ),
            }
        }
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Float(float),
            ..
        }) => {
            let value = float
                .base10_parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && *v <= f64::from(u32::MAX));
            let advice = match value {
                Some(v) if v.fract() == 0.0 => format!("write max_attempts = {v}"),
                Some(v) if v < 1.0 => "write max_attempts = 1".to_owned(),
                Some(v) => format!(
                    "write max_attempts = {} or max_attempts = {}",
                    v.floor(),
                    v.ceil()
                ),
                None => "write e.g. max_attempts = 5".to_owned(),
            };
            format!(
                "`max_attempts` counts deliveries, a whole number from 1 to {}: {advice}",
                u32::MAX
            )
        }
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(text),
            ..
        }) => {
            let value = text.value();
            match value.trim().parse::<u32>() {
                Ok(n) if n > 0 => format!(
                    "`max_attempts` takes an integer, not a string: write it without quotes: max_attempts = {n}"
                ),
                _ => "`max_attempts` takes an integer, not a string: write it without quotes, e.g. max_attempts = 5".to_owned(),
            }
        }
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr: operand,
            ..
        }) if matches!(
            unparenthesized_expr(operand),
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(_) | syn::Lit::Float(_),
                ..
            })
        ) =>
        {
            format!(
                "`max_attempts` cannot be negative: {MEANING}; write a count of at least 1, e.g. max_attempts = 5"
            )
        }
        _ => "`max_attempts` takes an integer literal, e.g. max_attempts = 5: the macro reads the count at compile time, so it cannot be a constant's name or an expression".to_owned(),
    };
    cx.error_spanned_by(expr, message);
    None
}

/// `(e)` as `e`.
fn unparenthesized_expr(expr: &syn::Expr) -> &syn::Expr {
    match expr {
        syn::Expr::Paren(p) => unparenthesized_expr(&p.expr),
        syn::Expr::Group(g) => unparenthesized_expr(&g.expr),
        other => other,
    }
}
