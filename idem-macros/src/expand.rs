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

use crate::model::{Batch, Fingerprint, Handler, KeyTerm, Mode, Shape, StoreArg, StoreRef, Stub};
use crate::types::{mut_referent, unparenthesized};

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

    let mixed = Span::mixed_site();
    let store = Ident::new("store", mixed);
    let spec = Ident::new("__IDEM_SPEC", mixed);

    let ret_ty = &h.ret_ty;
    // A return type that names its parts only through `HandlerResult`
    // (`AppResult<T>`, `Handled`) may be no `Result` at all. Every use of
    // the trait spans exactly the written type (see `around`), so that
    // rustc reports "not a `Result`" once, on that type.
    let via_trait = h.ok_ty.is_none() || h.err_ty.is_none();
    let err_ty = match &h.err_ty {
        Some(t) => quote!(#t),
        None => around(quote!(<), ret_ty, quote!(as #p::HandlerResult>::Err)),
    };
    let value = match &h.shape {
        Shape::Single { .. } => Value::single(h.ok_ty.as_ref(), ret_ty, &p),
        Shape::Batch(_) => Value::batch(h.ok_ty.as_ref(), ret_ty, &p),
    };
    // Only `codec::<T>()` bounds the `Ok` type by serde's traits: the call
    // paths take the codec it makes and need no bounds of their own, so a
    // type serde cannot store is one error, on the user's type. The calls
    // carry that span too, so any error of theirs lands there as well.
    let p_ok = respan(p.clone(), value.span);
    let codec = Ident::new("__idem_codec", mixed);
    let errors = Ident::new("__idem_errors", mixed);

    let receiver = h.receiver.as_ref().map(|r| quote!(#r,));
    // A transaction-mode batch body rebinds the parameters it takes by
    // value (see `rerun_copies`), so their `mut` goes with the copy.
    let rebound = matches!((&h.shape, &h.mode), (Shape::Batch(_), Mode::Tx { .. }));
    let params = h.params.iter().map(|p| {
        let by_value = !matches!(unparenthesized(&p.arg.ty), Type::Reference(_));
        if rebound && by_value && by_value_ident(&p.arg).is_some() {
            without_mut(&p.arg)
        } else {
            p.arg.clone()
        }
    });

    let name = &h.name;
    let function = ident.to_string();
    let key_text = &h.key_text;
    let ttl_ms = u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX);
    let lease_ms = u64::try_from(h.mode.lease().as_millis()).unwrap_or(u64::MAX);
    let store_name = &h.store.text;
    let (mode, tx_param) = match &h.mode {
        Mode::Tx { param } => (quote!(Transaction), Some(param)),
        Mode::Lease { .. } => (quote!(Lease), None),
    };
    let (store_param, store_checks) =
        store_checks(&h.store, tx_param, h.params.iter().map(|p| &p.arg), &p);

    let c = Call {
        h,
        p: &p,
        p_ok: &p_ok,
        value: &value,
        err_ty: &err_ty,
        store: &store,
        spec: &spec,
        codec: &codec,
        errors: &errors,
        via_trait,
    };
    let (derive, call) = match &h.shape {
        Shape::Single { key_param, .. } => single(&c, key_param.as_ref()),
        Shape::Batch(batch) => {
            let derived = Ident::new("__idem_derived", mixed);
            let derive = derive_batch(h, batch, &p, &spec, &err_ty);
            (
                quote!(let #derived = #derive;),
                batch_call(&c, batch, &derived),
            )
        }
    };

    let output = output(
        &p,
        &value.ty,
        &err_ty,
        value
            .via
            .as_ref()
            .map(ValuesVia::written)
            .or(via_trait.then_some(ret_ty)),
        matches!(h.shape, Shape::Batch(_)),
    );

    // The error codec, written out rather than through a `macro_rules!` of
    // the runtime: inside a macro's expansion, an error type that is not
    // one (`<Option<u64> as HandlerResult>::Err`) would be reported on the
    // whole attribute instead of the written return type.
    let (value_ty, ok_span) = (&value.ty, value.span);
    let make_codec = quote_spanned! {ok_span=>
        let #codec = #p_ok::codec::<#value_ty>();
    };
    let make_errors = error_codec(h.err_ty.as_ref(), ret_ty, &p, &errors);
    let fingerprint_text = match &h.fingerprint {
        Some(f) => {
            let text = &f.text;
            quote!(::core::option::Option::Some(#text))
        }
        None => quote!(::core::option::Option::None),
    };
    // A batch handler counts no failures (`valid` refuses `max_attempts`).
    let max_attempts = match &h.shape {
        Shape::Single { max_attempts, .. } => *max_attempts,
        Shape::Batch(_) => None,
    };
    let max_attempts = match max_attempts {
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
            #derive
            #call
        }
    }
}

/// What the call of a handler is generated from, in either shape.
struct Call<'a> {
    h: &'a Handler,
    p: &'a TokenStream,
    /// `__private` spanned on the value type, where serde's errors go.
    p_ok: &'a TokenStream,
    /// `T`, the value of one message.
    value: &'a Value,
    err_ty: &'a TokenStream,
    store: &'a Ident,
    spec: &'a Ident,
    codec: &'a Ident,
    errors: &'a Ident,
    /// Whether the return type names its parts only through `HandlerResult`.
    via_trait: bool,
}

/// The derivation of a single handler's key and fingerprint, and its call:
/// transaction mode begins the store's transaction with `tx_begin`, runs
/// the body in it and ends with `tx_finish`; lease mode hands the body to
/// `run_lease`.
fn single(c: &Call<'_>, key_param: Option<&syn::PatType>) -> (TokenStream, TokenStream) {
    let (h, p, p_ok, value, err_ty) = (c.h, c.p, c.p_ok, c.value, c.err_ty);
    let (store, spec, codec, errors) = (c.store, c.spec, c.codec, c.errors);
    let via_trait = c.via_trait;
    let mixed = Span::mixed_site();
    let key = Ident::new("__idem_key", mixed);
    let key_ref = Ident::new("__idem_key_ref", mixed);
    let fingerprint = Ident::new("__idem_fingerprint", mixed);
    let (ok_ty, ok_span) = (&value.ty, value.span);
    let ret_ty = &h.ret_ty;
    // The body's statements go straight into the generated `async move`
    // block: wrapping the block itself would make rustc warn `unused_braces`
    // on every one-line body.
    let block = &h.func.block.stmts;

    let derive_key = derive_key(
        h,
        p,
        &|root| quote!(#root),
        &|text| quote!(return #p::key_missing(&#spec, #text);),
    );
    // A handler without `fingerprint` computes nothing.
    let fingerprint_value = match &h.fingerprint {
        Some(f) => {
            let value = fingerprint_value(f, p, &|root| quote!(#root));
            quote!(#p::Option::Some(#value))
        }
        None => quote!(#p::Option::None),
    };
    let derive = quote! {
        let #key: #p::Key = #derive_key;
        let #fingerprint: #p::Option<#p::String> = #fingerprint_value;
    };
    // Only a body that reads its key borrows it.
    let key_borrow = key_param.map(|_| quote!(let #key_ref = &#key;));
    let bind_key = key_param.map(|param| bind_key(param, &key_ref, p));
    let fake_return = fake_return(ret_ty);

    let call = match &h.mode {
        Mode::Tx { param: tx_param } => {
            let call_state = Ident::new("__idem_call", mixed);
            let tx = Ident::new("__idem_tx", mixed);
            let result = Ident::new("__idem_result", mixed);
            let bind_tx = bind(tx_param, quote!(#tx));
            let tx_begin = quote_spanned! {ok_span=>
                #p_ok::tx_begin::<_, #ok_ty, #err_ty>(#store, &#spec, &#key, #fingerprint.as_deref(), #codec, #errors).await
            };
            let result_value = if via_trait {
                into_result(ret_ty, p, quote!(#result))
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
        Mode::Lease { .. } => {
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
                let into_result = into_result(ret_ty, p, quote!(#body_future.await));
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
    (derive, call)
}

/// The call of a batch handler, after its keys are derived into `derived`:
/// lease mode hands the body to `run_lease_batch` as a closure over the
/// fresh messages; transaction mode drives a `TxBatchRun`, running the body
/// again when the batch begins again (see `rerun_copies`).
///
/// Both are reached through the lookup `__private` explains, after
/// `batch_message::<M>()` checks `M: Clone` on the written `M`: a type
/// without `Clone` is that one error, and the calls, stand-ins then,
/// report nothing more.
fn batch_call(c: &Call<'_>, batch: &Batch, derived: &Ident) -> TokenStream {
    let (h, p, p_ok, value, err_ty) = (c.h, c.p, c.p_ok, c.value, c.err_ty);
    let (store, spec, codec, errors) = (c.store, c.spec, c.codec, c.errors);
    let via_trait = c.via_trait;
    let mixed = Span::mixed_site();
    let (value_ty, ok_span) = (&value.ty, value.span);
    let fresh = Ident::new("__idem_fresh", mixed);
    let msgs = &batch.ident;
    let calls = Ident::new("__idem_batch", mixed);
    let elem = &batch.elem;
    // `M: Clone`, checked on the written `M`; the calls are looked up as
    // `__private` explains.
    let check = {
        let (first, last) = ends(elem);
        let function = respan(quote!(#p::batch_message::<), first);
        let close = respan(quote!(>), last);
        let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!());
        args.set_span(last);
        quote!(#function #elem #close #args;)
    };
    let lookup = quote! {
        #check
        let #calls = {
            #[allow(unused_imports)]
            use #p::{AnyBatch as _, CloneBatch as _};
            (&#p::BatchProbe::<#elem>::new()).idem_batch()
        };
    };
    let ret_ty = &h.ret_ty;
    let block = &h.func.block.stmts;
    let fake_return = fake_return(ret_ty);
    let bind_msgs = bind(&batch.param, quote!(&*#fresh));
    match &h.mode {
        Mode::Lease { .. } => {
            let body = quote! {
                async move {
                    #bind_msgs
                    #fake_return
                    #(#block)*
                }
            };
            let body = match (via_trait, &value.via) {
                (false, None) => body,
                _ => {
                    let result = if via_trait {
                        into_result(ret_ty, p, quote!(#body.await))
                    } else {
                        quote!(#body.await)
                    };
                    let values = value.values(p, result);
                    quote!(async move { #values })
                }
            };
            let run_lease = quote_spanned! {ok_span=>
                #calls.run_lease::<_, #value_ty, #err_ty, _, _>(
                    #store, &#spec, #msgs, #derived, #codec, #errors,
                    move |#fresh| #body,
                )
                .await
            };
            quote! {
                #lookup
                #run_lease
            }
        }
        Mode::Tx { param: tx_param } => {
            let run = Ident::new("__idem_run", mixed);
            let call_state = Ident::new("__idem_call", mixed);
            let tx = Ident::new("__idem_tx", mixed);
            let result = Ident::new("__idem_result", mixed);
            let span = Ident::new("__idem_span", mixed);
            let bind_tx = bind(tx_param, quote!(#tx));
            let copies = rerun_copies(h, batch, p);
            let new = quote_spanned! {ok_span=>
                #p_ok::TxBatchRun::<_, #value_ty, #err_ty>::new(#store, &#spec, #msgs.len(), #derived, #codec, #errors)
            };
            let result_value = if via_trait {
                into_result(ret_ty, p, quote!(#result))
            } else {
                quote!(#result)
            };
            let result_value = value.values(p, result_value);
            quote! {
                #lookup
                let mut #run = #new;
                loop {
                    let mut #call_state = match #run.begin().await {
                        #p::Result::Ok(#p::TxBatchBegin::Fresh(call)) => call,
                        #p::Result::Ok(#p::TxBatchBegin::Done(results)) => {
                            return #p::Result::Ok(results);
                        }
                        #p::Result::Err(error) => return #p::Result::Err(error),
                    };
                    let #fresh = #calls.fresh(&#run, #msgs, &#call_state);
                    let #span = #run.span();
                    let #tx = #call_state.tx();
                    // Not `async move`: the body may run again, so it
                    // borrows what it does not copy (see `rerun_copies`).
                    let #result: #ret_ty = #p::Instrument::instrument(
                        async {
                            #bind_tx
                            #bind_msgs
                            #copies
                            #fake_return
                            #(#block)*
                        },
                        #span,
                    )
                    .await;
                    if let #p::TxBatchStep::Done(results) = #run.finish(#call_state, #result_value).await {
                        return results;
                    }
                }
            }
        }
    }
}

/// `T`, what one message gets: of a single handler's `Result<T, E>`, of a
/// batch handler's `Result<Vec<T>, E>`.
struct Value {
    /// `T` itself where the `Ok` type is written `Vec<T>`; else
    /// `<Ok as BatchValues>::Item`, spanned on the written type, so that an
    /// `Ok` type that is no `Vec` is one error there.
    ty: TokenStream,
    /// Where errors about `T` go.
    span: Span,
    /// What names `T` through `BatchValues`; `None` for `Vec<T>`.
    via: Option<ValuesVia>,
}

/// The written type a batch handler's `T` is named through.
enum ValuesVia {
    /// The `Ok` type of `Result<Ok, E>`, not written `Vec<T>`.
    Ok(Type),
    /// The return type, whose `Ok` type only `HandlerResult` names.
    Return(Type),
}

impl ValuesVia {
    /// The written type: where errors go.
    fn written(&self) -> &Type {
        match self {
            ValuesVia::Ok(ty) | ValuesVia::Return(ty) => ty,
        }
    }
}

impl Value {
    /// A single handler's `T`: as written in `Result<T, E>`, else
    /// `<R as HandlerResult>::Ok`, spanned on the written type.
    fn single(ok: Option<&Type>, ret_ty: &Type, p: &TokenStream) -> Value {
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
    fn batch(ok: Option<&Type>, ret_ty: &Type, p: &TokenStream) -> Value {
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
    fn values(&self, p: &TokenStream, result: TokenStream) -> TokenStream {
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
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
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

/// The parameters a transaction-mode batch body takes by value, copied for
/// each run of the body through `rerun_copy`, whose bound (`Copy`, spanned
/// on the parameter's type) says to take a parameter by reference when its
/// type is not `Copy`: a body that ran once and runs again after a
/// rollback gets the parameters as they were passed. The references
/// (`&T`, `&mut T`, `&self`) are borrowed by the body block, afresh each
/// run.
fn rerun_copies(h: &Handler, batch: &Batch, p: &TokenStream) -> TokenStream {
    let copies = h.params.iter().filter_map(|param| {
        let arg = &param.arg;
        if *arg == batch.param || matches!(unparenthesized(&arg.ty), Type::Reference(_)) {
            return None;
        }
        let ty = &arg.ty;
        // `rerun_copy::<T>` as a `fn(&T) -> T`, spanned on `T` as `around`
        // does, so that a type that is not `Copy` is reported there (a call
        // would draw rustc's advice to borrow the argument instead of the
        // trait's). A type holding `impl Trait` cannot be named: it is
        // inferred from the call.
        if holds_impl_trait(ty) {
            let copy = respan(quote!(#p::rerun_copy), ty.span());
            let (mutability, ident) = by_value_ident(arg)?;
            return Some(quote!(let #mutability #ident = #copy(&#ident);));
        }
        let copy = Ident::new("__idem_copy", Span::mixed_site());
        let function = around(quote!(#p::rerun_copy::<), ty, quote!(>));
        let check = quote!(let #copy: fn(&#ty) -> #ty = #function;);
        match by_value_ident(arg) {
            Some((mutability, ident)) => Some(quote! {
                #check
                let #mutability #ident = #copy(&#ident);
            }),
            // A pattern (`(a, b): (u32, u32)`) binds its parts at the
            // start; they are checked as a whole.
            None => Some(check),
        }
    });
    quote!(#(#copies)*)
}

/// The `mut` and name of a parameter whose pattern is a plain name.
fn by_value_ident(arg: &syn::PatType) -> Option<(Option<syn::token::Mut>, &Ident)> {
    match &*arg.pat {
        syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
            Some((pi.mutability, &pi.ident))
        }
        _ => None,
    }
}

/// The parameter without `mut` on its name.
fn without_mut(arg: &syn::PatType) -> syn::PatType {
    let mut arg = arg.clone();
    if let syn::Pat::Ident(pi) = &mut *arg.pat {
        pi.mutability = None;
    }
    arg
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
/// literal so a missing field or a float lands on the attribute. `root`
/// gives the expression a path starts from (a batch handler's paths read
/// its element); `missing` is what a `None` part does.
fn derive_key(
    h: &Handler,
    p: &TokenStream,
    root: &dyn Fn(&Ident) -> TokenStream,
    missing: &dyn Fn(&str) -> TokenStream,
) -> TokenStream {
    let builder = Ident::new("__idem_builder", Span::mixed_site());
    let span = h.key_span;
    let parts = h.key.iter().map(|part| match part {
        KeyTerm::Const(text) => quote!(#builder.constant(#text);),
        KeyTerm::Path {
            root: name,
            fields,
            text,
        } => {
            // `KeyPartProbe` picks the float check for float-like parts and
            // passes any other part on to `part`, which requires `KeyPart`.
            let probe = respan(quote!(#p::KeyPartProbe), span);
            let from = root(name);
            let access = quote_spanned!(span=> &(#from) #(.#fields)*);
            let call =
                quote_spanned!(span=> #builder.part((&#probe(#access)).idem_key_part().get()));
            let missing = missing(text);
            quote! {
                if #call.is_err() {
                    #missing
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

/// A batch handler's keys and fingerprints, one per message of the batch
/// parameter, in order: `Ok((key, fingerprint))`, or `Err(KeyMissing)`
/// for a message with a `None` part. Without `fingerprint`, `None`.
fn derive_batch(
    h: &Handler,
    batch: &Batch,
    p: &TokenStream,
    spec: &Ident,
    err_ty: &TokenStream,
) -> TokenStream {
    let mixed = Span::mixed_site();
    let msg = Ident::new("__idem_msg", mixed);
    let all = Ident::new("__idem_all", mixed);
    let label = syn::Lifetime {
        apostrophe: mixed,
        ident: Ident::new("__idem_derive", mixed),
    };
    let msgs = &batch.ident;
    let root = |name: &Ident| {
        if name == msgs {
            quote!(#msg)
        } else {
            quote!(#name)
        }
    };
    // Bound first: `break 'label ::path` would read as a labeled loop to
    // syn (and to prettyplease's readers).
    let missing_var = Ident::new("__idem_missing", mixed);
    let missing = |text: &str| {
        quote! {
            let #missing_var: #p::Derived<#err_ty> = #p::Result::Err(#p::Error::KeyMissing {
                handler: #spec.name,
                part: #text,
            });
            break #label #missing_var;
        }
    };
    let key = derive_key(h, p, &root, &missing);
    let fingerprint = match &h.fingerprint {
        Some(f) => {
            let value = fingerprint_value(f, p, &root);
            quote!(#p::Option::Some(#value))
        }
        None => quote!(#p::Option::None),
    };
    let key_var = Ident::new("__idem_key", mixed);
    quote! {{
        let mut #all: #p::Vec<#p::Derived<#err_ty>> = #p::Vec::with_capacity(#msgs.len());
        for #msg in #msgs {
            #all.push(#label: {
                let #key_var: #p::Key = #key;
                #p::Result::Ok((#key_var, #fingerprint))
            });
        }
        #all
    }}
}

/// The fingerprint's digest: `fingerprint(&(part, part, ...))`, each part
/// passed through `fingerprint_part` (which requires `Serialize`) spanned on
/// the literal, so a part serde cannot write is one error there; for `*`,
/// `fingerprint(msg)`. Always a tuple for parts, even of one, so that the
/// digest of `qty` is that of the JSON array `[qty]`.
fn fingerprint_value(
    f: &Fingerprint,
    p: &TokenStream,
    root: &dyn Fn(&Ident) -> TokenStream,
) -> TokenStream {
    let span = f.span;
    let digest = respan(quote!(#p::fingerprint), span);
    let check = respan(quote!(#p::fingerprint_part), span);
    let parts = f.parts.iter().map(|part| {
        let root = root(&part.root);
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
fn bind(param: &syn::PatType, value: TokenStream) -> TokenStream {
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

/// `Result<Outcome<T>, Error<E>>`, or for a batch handler
/// `Result<Results<T, E>, Error<E>>` (one answer per message). Where `T`
/// or `E` is named through a trait (`HandlerResult`, `BatchValues`),
/// spanned from the written type `via`'s first token to its last, as the
/// projections inside it are.
fn output(
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
