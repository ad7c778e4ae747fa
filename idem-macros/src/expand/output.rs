//! The rewritten function's result: `T`, what one message gets, and the
//! `Result` the function returns.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Type;
use syn::spanned::Spanned;

use super::spans::{around, ends, respan};
use crate::types::{segment_names, unparenthesized};

/// `T`, what one message gets: of a single handler's `Result<T, E>`, of a
/// batch handler's `Result<Vec<T>, E>`.
pub(super) struct Value {
    /// `T` itself where the `Ok` type is written `Vec<T>`; else
    /// `<Ok as BatchValues>::Item`, spanned on the written type, so that an
    /// `Ok` type that is no `Vec` is one error there.
    pub(super) ty: TokenStream,
    /// Where errors about `T` go.
    pub(super) span: Span,
    /// What names `T` through `BatchValues`; `None` for `Vec<T>`.
    pub(super) via: Option<ValuesVia>,
}

/// The written type a batch handler's `T` is named through.
pub(super) enum ValuesVia {
    /// The `Ok` type of `Result<Ok, E>`, not written `Vec<T>`.
    Ok(Type),
    /// The return type, whose `Ok` type only `HandlerResult` names.
    Return(Type),
}

impl ValuesVia {
    /// The written type: where errors go.
    pub(super) fn written(&self) -> &Type {
        match self {
            ValuesVia::Ok(ty) | ValuesVia::Return(ty) => ty,
        }
    }
}

impl Value {
    /// A single handler's `T`: as written in `Result<T, E>`, else
    /// `<R as HandlerResult>::Ok`, spanned on the written type.
    pub(super) fn single(ok: Option<&Type>, ret_ty: &Type, p: &TokenStream) -> Value {
        Value {
            ty: match ok {
                Some(t) => quote!(#t),
                None => around(quote!(<), ret_ty, quote!(as #p::HandlerResult>::Ok)),
            },
            span: ok.map_or(ret_ty.span(), Spanned::span),
            via: None,
        }
    }

    /// A batch handler's `T`.
    pub(super) fn batch(ok: Option<&Type>, ret_ty: &Type, p: &TokenStream) -> Value {
        match ok {
            Some(ok) => match vec_item(ok) {
                Some(item) => Value {
                    ty: quote!(#item),
                    span: item.span(),
                    via: None,
                },
                None => Value {
                    ty: around(quote!(<), ok, quote!(as #p::BatchValues>::Item)),
                    span: ok.span(),
                    via: Some(ValuesVia::Ok(ok.clone())),
                },
            },
            None => Value {
                ty: around(
                    quote!(< <),
                    ret_ty,
                    quote!(as #p::HandlerResult>::Ok as #p::BatchValues>::Item),
                ),
                span: ret_ty.span(),
                via: Some(ValuesVia::Return(ret_ty.clone())),
            },
        }
    }

    /// The body's `Result<Ok, E>` as a `Result<Vec<T>, E>`: as it is where
    /// the `Ok` type is written `Vec<T>`, else through `batch_values`,
    /// spanned on the written type as `around` does.
    pub(super) fn values(&self, p: &TokenStream, result: TokenStream) -> TokenStream {
        let (function, written) = match &self.via {
            None => return result,
            Some(ValuesVia::Ok(ty)) => (around(quote!(#p::batch_values::<), ty, quote!(, _>)), ty),
            Some(ValuesVia::Return(ty)) => (
                around(
                    quote!(#p::batch_values::< <),
                    ty,
                    quote!(as #p::HandlerResult>::Ok, _>),
                ),
                ty,
            ),
        };
        let (_, last) = ends(written);
        let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, result);
        args.set_span(last);
        quote!(#function #args)
    }
}

/// `T` of a type written `Vec<T>` (or `std::vec::Vec<T>`, `alloc::vec::Vec<T>`).
fn vec_item(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = unparenthesized(ty) else {
        return None;
    };
    if path.qself.is_some() {
        return None;
    }
    let segments = segment_names(&path.path);
    let vec = match segments.as_slice() {
        [v] => path.path.leading_colon.is_none() && v == "Vec",
        [root, m, v] => (root == "std" || root == "alloc") && m == "vec" && v == "Vec",
        _ => false,
    };
    let last = path.path.segments.last()?;
    match &last.arguments {
        syn::PathArguments::AngleBracketed(a) if vec && a.args.len() == 1 => match a.args.first() {
            Some(syn::GenericArgument::Type(item)) => Some(item),
            _ => None,
        },
        _ => None,
    }
}

/// `Result<Outcome<T>, Error<E>>`, or for a batch handler
/// `Result<Results<T, E>, Error<E>>` (one answer per message). Where `T`
/// or `E` is named through a trait (`HandlerResult`, `BatchValues`),
/// spanned from the written type `via`'s first token to its last, as the
/// projections inside it are.
pub(super) fn output(
    p: &TokenStream,
    ok_ty: &TokenStream,
    err_ty: &TokenStream,
    via: Option<&Type>,
    batch: bool,
) -> TokenStream {
    match via {
        Some(written) => {
            let (first, last) = ends(written);
            let open = respan(quote!(#p::Result<), first);
            let answer = if batch {
                let open = respan(quote!(#p::Results<), first);
                let middle = respan(quote!(,), last);
                let close = respan(quote!(>), last);
                quote!(#open #ok_ty #middle #err_ty #close)
            } else {
                let open = respan(quote!(#p::Outcome<), first);
                let close = respan(quote!(>), last);
                quote!(#open #ok_ty #close)
            };
            let middle = respan(quote!(, #p::Error<), last);
            let close = respan(quote!(>>), last);
            quote!(#open #answer #middle #err_ty #close)
        }
        None if batch => quote!(#p::Result<#p::Results<#ok_ty, #err_ty>, #p::Error<#err_ty>>),
        None => quote!(#p::Result<#p::Outcome<#ok_ty>, #p::Error<#err_ty>>),
    }
}

/// `<R as HandlerResult>::into_result(value)`, spanned as `around` does
/// (the parentheses too, since they end the call expression).
pub(super) fn into_result(ret_ty: &Type, p: &TokenStream, value: TokenStream) -> TokenStream {
    let (_, last) = ends(ret_ty);
    let function = around(
        quote!(<),
        ret_ty,
        quote!(as #p::HandlerResult>::into_result),
    );
    let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, value);
    args.set_span(last);
    quote!(#function #args)
}
