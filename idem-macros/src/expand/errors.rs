//! The error codec: how the handler's `E` is told final and written out.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::visit::Visit;
use syn::{Ident, Lifetime, Type};

use super::spans::{around, ends, respan};

/// `let errors = ErrorCodec::<E>::new(idem_final, idem_text)`, the lookups
/// of `__private` made on `E` (see there), and in transaction mode
/// `.with_view(idem_view)`. Where `E` is named only through
/// `HandlerResult`, each expression that names it is spanned from the
/// written type's first token to its last, as `around` does, so that a
/// return type that is no `Result` is reported once, on that type.
pub(super) fn error_codec(
    err_ty: Option<&Type>,
    ret_ty: &Type,
    p: &TokenStream,
    errors: &Ident,
    tx: bool,
) -> TokenStream {
    let (first, last) = ends(ret_ty);
    // `before E after`
    let with_err = |before: TokenStream, after: TokenStream| match err_ty {
        Some(t) => quote!(#before #t #after),
        None => around(
            quote!(#before <),
            ret_ty,
            quote!(as #p::HandlerResult>::Err #after),
        ),
    };
    // `(&ErrorProbe::<E>::new()).method()`, or with `refs` references
    let lookup = |method: &str, refs: TokenStream| {
        let probe = with_err(quote!(#p::ErrorProbe::<), quote!(>::new()));
        let mut receiver =
            proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#refs #probe));
        let method = Ident::new(method, Span::call_site());
        match err_ty {
            Some(_) => quote!(#receiver.#method()),
            None => {
                receiver.set_span(first);
                let call = respan(quote!(.#method()), last);
                quote!(#receiver #call)
            }
        }
    };
    let idem_final = lookup("idem_final", quote!(&));
    let idem_text = lookup("idem_text", quote!(&));
    let new = with_err(quote!(#p::ErrorCodec::<), quote!(>::new));
    let mut args = proc_macro2::Group::new(
        proc_macro2::Delimiter::Parenthesis,
        quote!(#idem_final, #idem_text),
    );
    if err_ty.is_none() {
        args.set_span(last);
    }
    // The view sees the error as a `dyn Error + 'static`: an error type
    // that names a lifetime of its own may borrow (from the message), and
    // keeps its errors the body's, as before, instead of failing to compile.
    let borrows = named_lifetimes(err_ty.unwrap_or(ret_ty));
    if !tx || borrows {
        return quote! {
            let #errors = {
                #[allow(unused_imports)]
                use #p::{DisplayText as _, FinalErrors as _, NoFinalErrors as _, NoText as _};
                #new #args
            };
        };
    }
    // One dereference a level: the error itself, the error it holds, none.
    let idem_view = lookup("idem_view", quote!(&&&));
    let mut view = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, idem_view);
    if err_ty.is_none() {
        view.set_span(last);
    }
    let with_view = match err_ty {
        Some(_) => quote!(.with_view),
        None => respan(quote!(.with_view), last),
    };
    quote! {
        let #errors = {
            #[allow(unused_imports)]
            use #p::{
                DisplayText as _, ErrorInside as _, ErrorItself as _, FinalErrors as _,
                NoErrorView as _, NoFinalErrors as _, NoText as _,
            };
            #new #args #with_view #view
        };
    }
}

/// Whether `ty` names a lifetime other than `'static` (`'_` included).
fn named_lifetimes(ty: &Type) -> bool {
    struct Named(bool);
    impl Visit<'_> for Named {
        fn visit_lifetime(&mut self, lifetime: &Lifetime) {
            self.0 |= lifetime.ident != "static";
        }
    }
    let mut named = Named(false);
    named.visit_type(ty);
    named.0
}

#[cfg(test)]
mod tests {
    use super::named_lifetimes;

    #[test]
    fn lifetimes_other_than_static_are_seen() {
        let ty = |s: &str| syn::parse_str::<syn::Type>(s).unwrap();
        assert!(named_lifetimes(&ty("Borrowed<'m>")));
        assert!(named_lifetimes(&ty("Result<u32, Borrowed<'_>>")));
        assert!(!named_lifetimes(&ty(
            "Box<dyn std::error::Error + Send + Sync + 'static>"
        )));
        assert!(!named_lifetimes(&ty("AppError")));
    }
}
