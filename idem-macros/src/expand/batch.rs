//! The call of a batch handler: a slice of messages, a key each, and the
//! body run once for the fresh ones.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Type};

use super::Call;
use super::body::{bind, fake_return};
use super::derive::derive_batch;
use super::output::into_result;
use super::spans::{around, ends, respan};
use crate::model::{Batch, Handler, Mode};
use crate::types::{holds_impl_trait, unparenthesized};

/// The derivation of a batch handler's keys and fingerprints, one per
/// message, and its call: lease mode hands the body to `run_lease_batch` as a closure over the
/// fresh messages; transaction mode drives a `TxBatchRun`, running the body
/// again when the batch begins again (see `rerun_copies`).
///
/// Both are reached through the lookup `__private` explains, after
/// `batch_message::<M>()` checks `M: Clone` on the written `M`: a type
/// without `Clone` is that one error, and the calls, stand-ins then,
/// report nothing more.
pub(super) fn batch(c: &Call<'_>, batch: &Batch) -> (TokenStream, TokenStream) {
    let (h, p, p_ok, value, err_ty) = (c.h, c.p, c.p_ok, c.value, c.err_ty);
    let (store, spec, codec, errors) = (c.store, c.spec, c.codec, c.errors);
    let via_trait = c.via_trait;
    let mixed = Span::mixed_site();
    let derived = Ident::new("__idem_derived", mixed);
    let derive = derive_batch(h, batch, p, spec, err_ty);
    let derive = quote!(let #derived = #derive;);
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
    let call = match &h.mode {
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
    };
    (derive, call)
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
pub(super) fn by_value_ident(arg: &syn::PatType) -> Option<(Option<syn::token::Mut>, &Ident)> {
    match &*arg.pat {
        syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
            Some((pi.mutability, &pi.ident))
        }
        _ => None,
    }
}

/// The parameter without `mut` on its name.
pub(super) fn without_mut(arg: &syn::PatType) -> syn::PatType {
    let mut arg = arg.clone();
    if let syn::Pat::Ident(pi) = &mut *arg.pat {
        pi.mutability = None;
    }
    arg
}
