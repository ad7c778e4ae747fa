//! Sorting the parameters: the receiver, the transaction, the `&Key`
//! parameter, the `&mut Outbox` parameter and the message parameters.

use syn::{FnArg, ItemFn, Pat, Type};

use crate::ctxt::Ctxt;
use crate::model::Param;
use crate::types::{mut_referent, segment_names};

/// The parameters, sorted.
pub(super) struct SigParts {
    pub(super) tx_param: Option<syn::PatType>,
    pub(super) key_param: Option<syn::PatType>,
    pub(super) outbox_param: Option<syn::PatType>,
    pub(super) receiver: Option<syn::Receiver>,
    pub(super) params: Vec<Param>,
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
    let segments = segment_names(&p.path);
    let no_arguments = p.path.segments.iter().all(|s| s.arguments.is_empty());
    if !no_arguments || segments.last().is_none_or(|l| l != "Key") {
        return KeyName::No;
    }
    let prefix = &segments[..segments.len() - 1];
    let krate = segment_names(krate);
    match prefix {
        [] if p.path.leading_colon.is_none() => KeyName::Bare,
        [only] if only == "idem_runtime" => KeyName::Idem,
        _ if prefix == krate.as_slice() => KeyName::Idem,
        _ => KeyName::No,
    }
}

/// Whether `ty` is `&mut Outbox`, `&mut idem_runtime::outbox::Outbox` or
/// `&mut <crate>::outbox::Outbox`: the outbox the runtime makes for the
/// call. The macro cannot resolve types: a type of the user's own named
/// `Outbox` and taken `&mut` is reported by rustc, on that type.
fn is_outbox(ty: &Type, krate: &syn::Path) -> bool {
    let Type::Reference(r) = ty else {
        return false;
    };
    let Type::Path(p) = &*r.elem else {
        return false;
    };
    if r.mutability.is_none() || p.qself.is_some() {
        return false;
    }
    let segments = segment_names(&p.path);
    let no_arguments = p.path.segments.iter().all(|s| s.arguments.is_empty());
    if !no_arguments || segments.last().is_none_or(|l| l != "Outbox") {
        return false;
    }
    let prefix = &segments[..segments.len() - 1];
    let mut krate = segment_names(krate);
    krate.push("outbox".to_owned());
    match prefix {
        [] => p.path.leading_colon.is_none(),
        [a, b] if a == "idem_runtime" && b == "outbox" => true,
        _ => prefix == krate.as_slice(),
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
pub(super) fn params(
    cx: &mut Ctxt,
    func: &ItemFn,
    krate: &syn::Path,
    key_roots: &[String],
) -> SigParts {
    let mut parts = SigParts {
        tx_param: None,
        key_param: None,
        outbox_param: None,
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
        if position > 0 && is_outbox(&pt.ty, krate) {
            if parts.outbox_param.is_some() {
                cx.error_spanned_by(&pt.ty, "only one `&mut Outbox` parameter is allowed");
            }
            parts.outbox_param = Some(pt.clone());
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
