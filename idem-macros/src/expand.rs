//! Generates the rewritten handler from the checked model.
//!
//! The user's block is moved, with its own spans, into an `async move` block
//! whose return type is pinned to the written return type (so `?` and type
//! errors read as they would in the original function). Everything the
//! expansion introduces is named with `Span::mixed_site()`, so the body cannot
//! see or shadow it, and reaches the runtime through `<crate>::__private`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Type};

use crate::valid::{
    Fingerprint, Handler, KeyTerm, StoreArg, StoreRef, Stub, mut_referent, unparenthesized,
};

pub(crate) fn expand(h: &Handler) -> TokenStream {
    let rt = &h.krate;
    let p = quote!(#rt::__private);
    let func = &h.func;
    let attrs = &func.attrs;
    let vis = &func.vis;
    let sig = &func.sig;
    let ident = &sig.ident;
    let generics = &sig.generics;
    let where_clause = &generics.where_clause;
    let unsafety = &sig.unsafety;
    // The body's statements go straight into the generated `async move`
    // block: wrapping the block itself would make rustc warn `unused_braces`
    // on every one-line body.
    let block = &func.block.stmts;

    let mixed = Span::mixed_site();
    let store = Ident::new("store", mixed);
    let spec = Ident::new("__IDEM_SPEC", mixed);
    let key = Ident::new("__idem_key", mixed);
    let key_ref = Ident::new("__idem_key_ref", mixed);

    let ret_ty = &h.ret_ty;
    // A return type that names its parts only through `HandlerResult`
    // (`AppResult<T>`, `Handled`) may be no `Result` at all. Every use of
    // the trait spans exactly the written type (see `around`), so that
    // rustc reports "not a `Result`" once, on that type.
    let via_trait = h.ok_ty.is_none() || h.err_ty.is_none();
    let ok_ty = match &h.ok_ty {
        Some(t) => quote!(#t),
        None => around(quote!(<), ret_ty, quote!(as #p::HandlerResult>::Ok)),
    };
    let err_ty = match &h.err_ty {
        Some(t) => quote!(#t),
        None => around(quote!(<), ret_ty, quote!(as #p::HandlerResult>::Err)),
    };
    let ok_span = h.ok_ty.as_ref().map_or(ret_ty.span(), Spanned::span);
    // Only `codec::<T>()` bounds the `Ok` type by serde's traits: the call
    // paths take the codec it makes and need no bounds of their own, so a
    // type serde cannot store is one error, on the user's type. The calls
    // carry that span too, so any error of theirs lands there as well.
    let p_ok = respan(p.clone(), ok_span);
    let codec = Ident::new("__idem_codec", mixed);
    let errors = Ident::new("__idem_errors", mixed);
    let fingerprint = Ident::new("__idem_fingerprint", mixed);

    let receiver = h.receiver.as_ref().map(|r| quote!(#r,));
    let params = h.params.iter().map(|p| &p.arg);

    let name = &h.name;
    let function = ident.to_string();
    let key_text = &h.key_text;
    let ttl_ms = u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX);
    let lease_ms = u64::try_from(h.lease.as_millis()).unwrap_or(u64::MAX);
    let store_name = &h.store.text;
    let mode = if h.tx_param.is_some() {
        quote!(Transaction)
    } else {
        quote!(Lease)
    };
    let (store_param, store_checks) = store_checks(
        &h.store,
        h.tx_param.as_ref(),
        h.params.iter().map(|p| &p.arg),
        &p,
    );

    let derive_key = derive_key(h, &p, &spec);
    // Only a body that reads its key borrows it.
    let key_borrow = h.key_param.as_ref().map(|_| quote!(let #key_ref = &#key;));
    let bind_key = h
        .key_param
        .as_ref()
        .map(|param| bind_key(param, &key_ref, &p));
    let fake_return = fake_return(ret_ty);

    let call = match &h.tx_param {
        Some(tx_param) => {
            let call_state = Ident::new("__idem_call", mixed);
            let tx = Ident::new("__idem_tx", mixed);
            let result = Ident::new("__idem_result", mixed);
            let bind_tx = bind(tx_param, &tx);
            let tx_begin = quote_spanned! {ok_span=>
                #p_ok::tx_begin::<_, #ok_ty, #err_ty>(#store, &#spec, &#key, #fingerprint.as_deref(), #codec, #errors).await
            };
            let result_value = if via_trait {
                into_result(ret_ty, &p, quote!(#result))
            } else {
                quote!(#result)
            };
            let tx_finish = quote_spanned! {ok_span=>
                #p_ok::tx_finish::<_, #ok_ty, #err_ty>(#store, &#spec, &#key, #fingerprint.as_deref(), #codec, #errors, #call_state, #result_value).await
            };
            quote! {
                let mut #call_state = match #tx_begin {
                    #p::Result::Ok(#p::TxBegin::Fresh(call)) => call,
                    #p::Result::Ok(#p::TxBegin::Done(outcome)) => return #p::Result::Ok(outcome),
                    #p::Result::Err(error) => return #p::Result::Err(error),
                };
                #key_borrow
                let __idem_span = #call_state.span();
                let #tx = #call_state.tx();
                let #result: #ret_ty = #p::Instrument::instrument(
                    async move {
                        #bind_tx
                        #bind_key
                        #fake_return
                        #(#block)*
                    },
                    __idem_span,
                )
                .await;
                #tx_finish
            }
        }
        None => {
            let body = Ident::new("__idem_body", mixed);
            let run_lease = quote_spanned! {ok_span=>
                #p_ok::run_lease::<_, #ok_ty, #err_ty, _>(#store, &#spec, &#key, #fingerprint.as_deref(), #codec, #errors, #body).await
            };
            let body_future = quote! {
                async move {
                    #bind_key
                    #fake_return
                    #(#block)*
                }
            };
            let body_future = if via_trait {
                let into_result = into_result(ret_ty, &p, quote!(#body_future.await));
                quote!(async move { #into_result })
            } else {
                body_future
            };
            quote! {
                #key_borrow
                let #body = #body_future;
                #run_lease
            }
        }
    };

    let output = output(&p, &ok_ty, &err_ty, via_trait.then_some(ret_ty));

    // The error codec, written out rather than through a `macro_rules!` of
    // the runtime: inside a macro's expansion, an error type that is not
    // one (`<Option<u64> as HandlerResult>::Err`) would be reported on the
    // whole attribute instead of the written return type.
    let make_codec = quote_spanned! {ok_span=>
        let #codec = #p_ok::codec::<#ok_ty>();
    };
    let make_errors = error_codec(h.err_ty.as_ref(), ret_ty, &p, &errors);
    // A handler without `fingerprint` computes nothing.
    let fingerprint_value = match &h.fingerprint {
        Some(f) => {
            let value = fingerprint_value(f, &p);
            quote!(#p::Option::Some(#value))
        }
        None => quote!(#p::Option::None),
    };
    let fingerprint_text = match &h.fingerprint {
        Some(f) => {
            let text = &f.text;
            quote!(::core::option::Option::Some(#text))
        }
        None => quote!(::core::option::Option::None),
    };
    let max_attempts = match h.max_attempts {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };

    quote! {
        #(#attrs)*
        #vis async #unsafety fn #ident #generics (
            #receiver
            #store: &#store_param,
            #(#params),*
        ) -> #output
        #where_clause
        {
            #store_checks
            const #spec: #p::HandlerSpec = #p::HandlerSpec {
                name: #name,
                function: #function,
                key: #key_text,
                ttl: #p::Duration::from_millis(#ttl_ms),
                lease: #p::Duration::from_millis(#lease_ms),
                store: #store_name,
                mode: #p::Mode::#mode,
                module: ::core::module_path!(),
                file: ::core::file!(),
                line: ::core::line!(),
                fingerprint: #fingerprint_text,
                max_attempts: #max_attempts,
            };
            #p::inventory::submit! { #spec }
            #make_codec
            #make_errors
            let #key: #p::Key = #derive_key;
            let #fingerprint: #p::Option<#p::String> = #fingerprint_value;
            #call
        }
    }
}

/// The rewritten function's store parameter type, and the checks the
/// runtime makes of the store and the transaction: `&impl LeaseStore` in
/// lease mode, `&impl TxStore<Tx = T>` in transaction mode, where `T` is the
/// written transaction type with its lifetimes `'static` (what a store hands
/// over). The checks are calls of the runtime's `__private::stores`
/// functions, spanned on what they check, so that rustc reports an unknown
/// store on its name, a transaction of another store on the transaction's
/// type, and a transaction out of place on its type.
fn store_checks<'a>(
    store: &StoreArg,
    tx_param: Option<&syn::PatType>,
    params: impl Iterator<Item = &'a syn::PatType>,
    p: &TokenStream,
) -> (TokenStream, TokenStream) {
    let stores = quote!(#p::stores);
    let tx = tx_param.and_then(|param| mut_referent(&param.ty));
    let named_at = store.span;
    // The store's own check, spanned on its literal: an unknown name,
    // another name of a store, a feature that is off; and, for a store type,
    // whether it runs this mode. In transaction mode a second check,
    // spanned on the transaction's type, says whether that type is a store's
    // transaction and this store's.
    let lease_mode = respan(quote!(#stores::LeaseMode), named_at);
    let (param, tx_mode) = match tx {
        Some(ty) => {
            let owned = static_lifetimes(ty);
            let at_ty = respan(stores.clone(), ty.span());
            let mode = quote_spanned!(ty.span()=> <#owned as #at_ty::TxModeOf>::Mode);
            (
                quote!(impl #p::TxStore<Tx = #owned>),
                Some((mode, ty.span())),
            )
        }
        None => (quote!(impl #p::LeaseStore), None),
    };
    let checks = match &store.store {
        StoreRef::Name(name) => {
            // Imported alone, so that rustc reports an unknown name on it.
            let names = respan(quote!(#stores::names), named_at);
            let store_fn = Ident::new("__idem_store", Span::mixed_site().located_at(named_at));
            let import = quote_spanned!(named_at=> use #names::#name as #store_fn;);
            let by_name = quote_spanned!(named_at=> #store_fn::<#lease_mode>(););
            let by_tx = tx_mode.map(|(mode, span)| {
                let store_fn = Ident::new("__idem_store", Span::mixed_site().located_at(span));
                quote_spanned!(span=> #store_fn::<#mode>();)
            });
            quote! {
                #import
                #by_name
                #by_tx
            }
        }
        StoreRef::Type(path) => {
            let path = respan(quote!(#path), named_at);
            let check = respan(quote!(#stores::store_type), named_at);
            match tx_mode {
                Some((mode, span)) => {
                    let mode = respan(mode, span);
                    quote_spanned!(named_at=> #check::<#path, #mode>();)
                }
                None => quote_spanned!(named_at=> #check::<#path, #lease_mode>();),
            }
        }
    };
    // A `&mut T` after the first parameter is fine unless `T` is a store's
    // transaction (then it was meant to come first). A `T` the probe cannot
    // name (one holding `impl Trait`) cannot be a transaction anyway.
    let misplaced = params.filter_map(|param| {
        let ty = unparenthesized(mut_referent(&param.ty)?);
        if holds_impl_trait(ty) {
            return None;
        }
        let span = ty.span();
        let probe = respan(quote!(#stores::TxProbe), span);
        Some(quote_spanned! {span=>
            {
                #[allow(unused_imports)]
                use #stores::{MisplacedTx as _, NotTx as _};
                (&#probe::<#ty>::new()).tx_after_first().check();
            }
        })
    });
    let checks = quote! {
        #checks
        #(#misplaced)*
    };
    (param, checks)
}

/// Whether `ty` holds `impl Trait` anywhere.
fn holds_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.0
}

/// `ty` with every lifetime but `'static` made `'static`: `Tx<'_>`
/// becomes `Tx<'static>`, the transaction type a store hands over.
fn static_lifetimes(ty: &Type) -> Type {
    struct Static;
    impl syn::visit_mut::VisitMut for Static {
        fn visit_lifetime_mut(&mut self, l: &mut syn::Lifetime) {
            *l = syn::Lifetime::new("'static", l.span());
        }
    }
    let mut ty = ty.clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut Static, &mut ty);
    ty
}

/// `let errors = ErrorCodec::<E>::new(idem_final, idem_text)`, the lookups
/// of `__private` made on `E` (see there). Where `E` is named only through
/// `HandlerResult`, each expression that names it is spanned from the
/// written type's first token to its last, as `around` does, so that a
/// return type that is no `Result` is reported once, on that type.
fn error_codec(
    err_ty: Option<&Type>,
    ret_ty: &Type,
    p: &TokenStream,
    errors: &Ident,
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
    // `(&ErrorProbe::<E>::new()).method()`
    let lookup = |method: &str| {
        let probe = with_err(quote!(#p::ErrorProbe::<), quote!(>::new()));
        let mut receiver =
            proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(&#probe));
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
    let idem_final = lookup("idem_final");
    let idem_text = lookup("idem_text");
    let new = with_err(quote!(#p::ErrorCodec::<), quote!(>::new));
    let mut args = proc_macro2::Group::new(
        proc_macro2::Delimiter::Parenthesis,
        quote!(#idem_final, #idem_text),
    );
    if err_ty.is_none() {
        args.set_span(last);
    }
    quote! {
        let #errors = {
            #[allow(unused_imports)]
            use #p::{DisplayText as _, FinalErrors as _, NoFinalErrors as _, NoText as _};
            #new #args
        };
    }
}

/// The key derivation: one `part` call per field path, spanned on the key
/// literal so a missing field or a float lands on the attribute.
fn derive_key(h: &Handler, p: &TokenStream, spec: &Ident) -> TokenStream {
    let builder = Ident::new("__idem_builder", Span::mixed_site());
    let span = h.key_span;
    let parts = h.key.iter().map(|part| match part {
        KeyTerm::Const(text) => quote!(#builder.constant(#text);),
        KeyTerm::Path { root, fields, text } => {
            // `KeyPartProbe` picks the float check for float-like parts and
            // passes any other part on to `part`, which requires `KeyPart`.
            let probe = respan(quote!(#p::KeyPartProbe), span);
            let access = quote_spanned!(span=> &(#root) #(.#fields)*);
            let call =
                quote_spanned!(span=> #builder.part((&#probe(#access)).idem_key_part().get()));
            quote! {
                if #call.is_err() {
                    return #p::key_missing(&#spec, #text);
                }
            }
        }
    });
    quote! {{
        use #p::{AnyProbe as _, FloatProbe as _};
        let mut #builder = #p::KeyBuilder::new();
        #(#parts)*
        #builder.finish()
    }}
}

/// The fingerprint's digest: `fingerprint(&(part, part, ...))`, each part
/// passed through `fingerprint_part` (which requires `Serialize`) spanned on
/// the literal, so a part serde cannot write is one error there; for `*`,
/// `fingerprint(msg)`. Always a tuple for parts, even of one, so that the
/// digest of `qty` is that of the JSON array `[qty]`.
fn fingerprint_value(f: &Fingerprint, p: &TokenStream) -> TokenStream {
    let span = f.span;
    let digest = respan(quote!(#p::fingerprint), span);
    let check = respan(quote!(#p::fingerprint_part), span);
    let parts = f.parts.iter().map(|part| {
        let root = &part.root;
        let fields = &part.fields;
        // The parentheses end the expression, so its span is the
        // literal's, not one reaching to the parameter's name.
        let access = if part.deref {
            quote_spanned!(span=> &*(#root))
        } else {
            quote_spanned!(span=> &(#root) #(.#fields)*)
        };
        quote_spanned!(span=> #check(#access))
    });
    if f.whole {
        quote_spanned!(span=> #digest(#(#parts)*))
    } else {
        quote_spanned!(span=> #digest(&(#(#parts,)*)))
    }
}

/// Binds the key parameter inside the body through the runtime's `IdemKey`,
/// implemented for idem's `Key` only: a bare `&Key` taken for the key that
/// names the user's own type is reported on that type, with advice.
fn bind_key(param: &syn::PatType, value: &Ident, p: &TokenStream) -> TokenStream {
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
fn bind(param: &syn::PatType, value: &Ident) -> TokenStream {
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
/// body type-checks exactly as the function did (a trick from
/// tracing-attributes).
fn fake_return(ret_ty: &Type) -> TokenStream {
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

/// `before #ty after`, with `before` spanned on the first token of `ty` and
/// `after` on its last. rustc spans a type or path from its first token to
/// its last, so whatever it reports on the result points at exactly the
/// written type (a stable proc macro cannot join spans itself).
fn around(before: TokenStream, ty: &Type, after: TokenStream) -> TokenStream {
    let (first, last) = ends(ty);
    let before = respan(before, first);
    let after = respan(after, last);
    quote!(#before #ty #after)
}

/// `Result<Outcome<T>, Error<E>>`. Where `T` or `E` is named through
/// `HandlerResult`, spanned from the written type's first token to its last,
/// as the projections inside it are.
fn output(
    p: &TokenStream,
    ok_ty: &TokenStream,
    err_ty: &TokenStream,
    via: Option<&Type>,
) -> TokenStream {
    match via {
        Some(written) => {
            let (first, last) = ends(written);
            let open = respan(quote!(#p::Result<#p::Outcome<), first);
            let middle = respan(quote!(>, #p::Error<), last);
            let close = respan(quote!(>>), last);
            quote!(#open #ok_ty #middle #err_ty #close)
        }
        None => quote!(#p::Result<#p::Outcome<#ok_ty>, #p::Error<#err_ty>>),
    }
}

/// `<R as HandlerResult>::into_result(value)`, spanned as `around` does
/// (the parentheses too, since they end the call expression).
fn into_result(ret_ty: &Type, p: &TokenStream, value: TokenStream) -> TokenStream {
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

/// The spans of the first and the last token of `ty`.
fn ends(ty: &Type) -> (Span, Span) {
    let mut tokens = quote!(#ty).into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    (first, last)
}

/// Gives every token of `tokens` the span `span` (generated tokens only:
/// never pass user tokens, whose own spans matter).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// The function emitted beside the errors of a refused handler: the
/// rewritten signature, so that callers written for it get no second, wrong
/// error ("this function takes 1 argument but 2 were supplied"), and the
/// user's body, type-checked but never run, so that its own mistakes are
/// still reported and the imports it uses stay used.
pub(crate) fn stub(s: &Stub) -> TokenStream {
    let rt = &s.krate;
    let p = quote!(#rt::__private);
    let func = &s.func;
    let attrs = &func.attrs;
    let vis = &func.vis;
    let sig = &func.sig;
    let ident = &sig.ident;
    let generics = &sig.generics;
    let where_clause = &generics.where_clause;
    let unsafety = &sig.unsafety;
    let receiver = s.receiver.as_ref().map(|r| quote!(#r,));
    let params = &s.params;
    let block = &func.block.stmts;
    let mixed = Span::mixed_site();
    let store = Ident::new("store", mixed);

    // Whatever the store was meant to be, any store will do; the store's
    // own mistakes are still reported.
    let store_ty = quote!(impl ::core::any::Any);
    let store_checks = s
        .store
        .as_ref()
        .map(|store| store_checks(store, s.tx_param.as_ref(), s.params.iter(), &p).1);

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

    let output = output(&p, &ok_ty, &err_ty, via_trait);

    quote! {
        #(#attrs)*
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
            clippy::unused_async
        )]
        #vis async #unsafety fn #ident #generics (
            #receiver
            #store: &#store_ty,
            #(#params),*
        ) -> #output
        #where_clause
        {
            // Never runs: the macro refused this handler (see the errors
            // reported with it).
            #store_checks
            let _ = async move {
                #(#removed)*
                #fake_return
                #(#block)*
            };
            ::core::unreachable!("#[idempotent] refused this handler at compile time")
        }
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
