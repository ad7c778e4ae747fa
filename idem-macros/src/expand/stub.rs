//! The stub emitted beside the errors of a refused handler.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Ident, Type};

use super::Function;
use super::body::fake_return;
use super::output::{Value, ValuesVia, output};
use super::spans::around;
use super::store::store_checks;
use crate::model::Stub;
use crate::types::unparenthesized;

/// The function emitted beside the errors of a refused handler: the
/// rewritten signature, so that callers written for it get no second, wrong
/// error ("this function takes 1 argument but 2 were supplied"), and the
/// user's body, type-checked but never run, so that its own mistakes are
/// still reported and the imports it uses stay used.
pub(crate) fn stub(s: &Stub) -> TokenStream {
    let rt = &s.krate;
    let p = quote!(#rt::__private);
    let func = &s.func;
    let sig = &func.sig;
    let block = &func.block.stmts;
    let mixed = Span::mixed_site();
    let store = Ident::new("store", mixed);

    // Whatever the store was meant to be, any store will do; the store's
    // own mistakes are still reported.
    let store_ty = quote!(impl ::core::any::Any);
    let store_checks = s
        .store
        .as_ref()
        .map(|store| store_checks(store, s.tx_param.as_ref(), false, s.params.iter(), &p).1);

    let via_trait = s
        .result
        .as_ref()
        .filter(|r| r.ok.is_none() || r.err.is_none())
        .map(|r| &r.written);
    let (ok_ty, err_ty, fake_return) = match &s.result {
        Some(r) => {
            let written = &r.written;
            let ok_ty = match &r.ok {
                Some(t) => quote!(#t),
                None => around(quote!(<), written, quote!(as #p::HandlerResult>::Ok)),
            };
            let err_ty = match &r.err {
                Some(t) => quote!(#t),
                None => around(quote!(<), written, quote!(as #p::HandlerResult>::Err)),
            };
            (ok_ty, err_ty, fake_return(written))
        }
        // The return type itself was refused (none, a tuple, a reference,
        // `impl Trait`). Its callers cannot have been written for an `Ok`
        // type the handler never named; the written type (or `()`) is the
        // truest guess, and a generic `T` would only add "type annotations
        // needed" at each call. `Infallible` as `E` lets `?` convert the
        // error into `Box<dyn Error>` and `anyhow::Error` alike. A type with
        // a lifetime or `impl Trait` cannot stand in the rewritten signature
        // (elision is ambiguous there), so it becomes `()`.
        None => {
            let ok_ty = match &sig.output {
                syn::ReturnType::Type(_, ty) if plain(ty) => quote!(#ty),
                _ => quote!(()),
            };
            let fake_return = match &sig.output {
                syn::ReturnType::Type(_, ty) if plain(ty) => fake_return(ty),
                _ => TokenStream::new(),
            };
            (ok_ty, quote!(::core::convert::Infallible), fake_return)
        }
    };

    // The removed parameters (the transaction, the key) are bound to a
    // diverging value of their written type, so the body type-checks as
    // written and everything after them is unreachable.
    let removed = func.sig.inputs.iter().filter_map(|arg| match arg {
        syn::FnArg::Typed(pt) if !s.params.iter().any(|kept| kept == pt) => {
            let pat = &pt.pat;
            let ty = &pt.ty;
            Some(quote!(let #pat: #ty = loop {};))
        }
        _ => None,
    });

    // A batch handler's callers were written for its answer per message.
    let value = s
        .result
        .as_ref()
        .filter(|_| s.batch)
        .map(|r| Value::batch(r.ok.as_ref(), &r.written, &p));
    let (ok_ty, via) = match &value {
        Some(value) => (
            value.ty.clone(),
            value.via.as_ref().map(ValuesVia::written).or(via_trait),
        ),
        None => (ok_ty, via_trait),
    };
    let output = output(&p, &ok_ty, &err_ty, via, s.batch);

    let lints = quote! {
        #[allow(
            unknown_lints,
            unreachable_code,
            unused_variables,
            unused_assignments,
            unused_mut,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_underscore_future,
            clippy::let_unit_value,
            clippy::needless_return,
            clippy::redundant_closure_call,
            clippy::unused_async
        )]
    };
    // Never runs: the macro refused this handler (see the errors reported
    // with it).
    let result = match &s.future {
        Some(written) => future_body(written, &func.block),
        None => quote!(#(#block)*),
    };
    let body = quote! {
        #store_checks
        let _ = async move {
            #(#removed)*
            #fake_return
            #result
        };
        ::core::unreachable!("#[idempotent] refused this handler at compile time")
    };
    Function {
        func,
        lints,
        receiver: s.receiver.as_ref(),
        store: &store,
        store_ty,
        params: s.params.clone(),
        output,
        body,
    }
    .tokens()
}

/// The body of a `fn` that returns a future (`written`) instead of being
/// `async`: the future it makes, checked against the written type, and
/// awaited, so that the stub's `async` block (its result pinned to the
/// future's `Output`) type-checks the body as written. The block runs in a
/// closure, so that a `return` in it returns the future as it did.
fn future_body(written: &Type, block: &syn::Block) -> TokenStream {
    let future = Ident::new("__idem_future", Span::mixed_site());
    let make = quote!((move || #block)());
    match unparenthesized(written) {
        // An opaque type cannot be named: the future is checked against
        // each of its traits instead.
        Type::ImplTrait(t) => {
            let checks = t.bounds.iter().filter_map(|bound| match bound {
                syn::TypeParamBound::Trait(tb)
                    if matches!(tb.modifier, syn::TraitBoundModifier::None) =>
                {
                    Some(quote!(let _: &dyn #tb = &#future;))
                }
                _ => None,
            });
            quote! {
                let #future = #make;
                #(#checks)*
                #future.await
            }
        }
        named => quote! {
            let #future: #named = #make;
            #future.await
        },
    }
}

/// Whether a type can stand in the rewritten signature as it is: no
/// references, lifetimes, `impl Trait` or `_`.
fn plain(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type(&mut self, ty: &'ast Type) {
            match ty {
                Type::Reference(_)
                | Type::ImplTrait(_)
                | Type::Infer(_)
                | Type::Macro(_)
                | Type::Never(_)
                | Type::Verbatim(_)
                | Type::TraitObject(_) => self.0 = false,
                _ => syn::visit::visit_type(self, ty),
            }
        }
        fn visit_lifetime(&mut self, _: &'ast syn::Lifetime) {
            self.0 = false;
        }
    }
    let mut finder = Finder(true);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.0
}
