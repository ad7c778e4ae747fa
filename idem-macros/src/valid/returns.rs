//! Reading the return type: the `Ok` and `Err` types of the handler's
//! `Result`, where the signature names them.

use syn::{GenericArgument, Ident, PathArguments, ReturnType, Type};

use crate::ctxt::Ctxt;
use crate::model::ResultTypes;
use crate::types::segment_names;

/// Splits the return type. `Result<T, E>` names both parts; `X::Result<T>`
/// (`io::Result<T>`, `anyhow::Result<T>`, a `Result<T>` alias) names `Ok`.
/// Any other path type (`AppResult<T>`, a zero-argument alias) is taken as a
/// `Result` whose parts the runtime's `HandlerResult` names; that trait is
/// implemented for `Result` only, so `Option<u64>` or `u64` is reported by
/// rustc on the type itself. Only what is surely not a `Result` (a tuple, a
/// reference, `impl Trait`, no return type) is refused here.
pub(super) fn return_types(
    cx: &mut Ctxt,
    output: &ReturnType,
    ident: &Ident,
) -> Option<ResultTypes> {
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
    let segments = segment_names(&path.path);
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
