//! The call of a single handler: one message, one key.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned as _;

use super::Call;
use super::body::{bind, bind_key, fake_return};
use super::derive::{derive_key, fingerprint_value};
use super::output::into_result;
use crate::model::Mode;

/// The derivation of a single handler's key and fingerprint, and its call:
/// transaction mode begins the store's transaction with `tx_begin`, runs
/// the body in it and ends with `tx_finish`; lease mode hands the body to
/// `run_lease`. A transaction-mode body that stages messages gets the
/// outbox its store makes for the call, committed with the outcome.
pub(super) fn single(
    c: &Call<'_>,
    key_param: Option<&syn::PatType>,
    outbox_param: Option<&syn::PatType>,
) -> (TokenStream, TokenStream) {
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
            // The outbox lives beside the call; the body borrows it, and
            // it is committed (counted, the relays woken) once the outcome
            // is.
            let outbox = Ident::new("__idem_outbox", mixed);
            let outbox_ref = Ident::new("__idem_outbox_ref", mixed);
            let (make_outbox, bind_outbox, tx_finish) = match outbox_param {
                Some(param) => {
                    let for_store = quote_spanned! {param.ty.span()=>
                        #p::outbox_for(#store, #spec.name, #key.as_str())
                    };
                    let bind = bind(param, quote!(#outbox_ref));
                    (
                        quote! {
                            let mut #outbox = #for_store;
                            let #outbox_ref = &mut #outbox;
                        },
                        bind,
                        quote! {{
                            let done = #tx_finish;
                            #p::outbox_committed(&#outbox, &done);
                            done
                        }},
                    )
                }
                None => (TokenStream::new(), TokenStream::new(), tx_finish),
            };
            quote! {
                let mut #call_state = match #tx_begin {
                    #p::Result::Ok(#p::TxBegin::Fresh(call)) => call,
                    #p::Result::Ok(#p::TxBegin::Done(outcome)) => return #p::Result::Ok(outcome),
                    #p::Result::Err(error) => return #p::Result::Err(error),
                };
                #key_borrow
                #make_outbox
                let __idem_span = #call_state.span();
                let #tx = #call_state.tx();
                let #result: #ret_ty = #p::Instrument::instrument(
                    async move {
                        #bind_tx
                        #bind_key
                        #bind_outbox
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
