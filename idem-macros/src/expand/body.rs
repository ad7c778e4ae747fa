//! Wrapping the user's body: the removed parameters bound inside it, and
//! its return type pinned to the written one.

use proc_macro2::{Ident, TokenStream};
use quote::{quote, quote_spanned};
use syn::Type;
use syn::spanned::Spanned;

/// Binds the key parameter inside the body through the runtime's `IdemKey`,
/// implemented for idem's `Key` only: a bare `&Key` taken for the key that
/// names the user's own type is reported on that type, with advice.
pub(super) fn bind_key(param: &syn::PatType, value: &Ident, p: &TokenStream) -> TokenStream {
    let pat = &param.pat;
    let ty = &param.ty;
    let elem = match &**ty {
        Type::Reference(r) => &*r.elem,
        other => other,
    };
    let from_key = quote_spanned!(elem.span()=> <#elem as #p::IdemKey>::from_key);
    quote!(let #pat: #ty = #from_key(#value);)
}

/// Binds a removed parameter (the transaction, the key) inside the body, with
/// the type as written (named lifetimes elided, since the binding is local).
/// The annotation keeps the user's imports used and checks that the written
/// type is what the store hands over, reporting a mismatch on that type.
pub(super) fn bind(param: &syn::PatType, value: TokenStream) -> TokenStream {
    struct Elide;
    impl syn::visit_mut::VisitMut for Elide {
        fn visit_lifetime_mut(&mut self, l: &mut syn::Lifetime) {
            if l.ident != "static" {
                *l = syn::Lifetime::new("'_", l.span());
            }
        }
    }
    let pat = &param.pat;
    let mut ty = (*param.ty).clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut Elide, &mut ty);
    quote!(let #pat: #ty = #value;)
}

/// Pins the body's return type to the written one, spanned on it, so the
/// body type-checks exactly as the function did.
pub(super) fn fake_return(ret_ty: &Type) -> TokenStream {
    quote_spanned! {ret_ty.span()=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let __idem_fake_return: #ret_ty = loop {};
            return __idem_fake_return;
        }
    }
}
