//! Generates the rewritten handler from the checked model.
//!
//! The user's block is moved, with its own spans, into an `async move` block
//! whose return type is pinned to the written return type (so `?` and type
//! errors read as they would in the original function). Everything the
//! expansion introduces is named with `Span::mixed_site()`, so the body cannot
//! see or shadow it, and reaches the runtime through `<crate>::__private`.
//!
//! Each concern is a file of its own: `single` and `batch` generate the
//! call of each shape, `derive` the key and the fingerprint, `body` wraps
//! the user's body, `output` names the result types, `store` and `errors`
//! the checks of the store and the codec of `E`, `spans` places generated
//! tokens on the user's, and `stub` is what a refused handler becomes.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, Type};

use crate::model::{Handler, Mode, Shape};
use crate::types::unparenthesized;

mod batch;
mod body;
mod derive;
mod errors;
mod output;
mod single;
mod spans;
mod store;
mod stub;

use batch::{batch, by_value_ident, without_mut};
use errors::error_codec;
use output::{Value, ValuesVia, output};
use single::single;
use spans::{around, respan};
use store::store_checks;
pub(crate) use stub::stub;

/// The rewritten handler: its spec registered, its key (or each message's)
/// derived, and the call of its mode and shape around the user's body.
pub(crate) fn expand(h: &Handler) -> TokenStream {
    let rt = &h.krate;
    let p = quote!(#rt::__private);
    let func = &h.func;
    let ident = &func.sig.ident;

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
    let stages = matches!(
        &h.shape,
        Shape::Single {
            outbox_param: Some(_),
            ..
        }
    );
    let (store_param, store_checks) = store_checks(
        &h.store,
        tx_param,
        stages,
        h.params.iter().map(|p| &p.arg),
        &p,
    );

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
        Shape::Single {
            key_param,
            outbox_param,
            ..
        } => single(&c, key_param.as_ref(), outbox_param.as_ref()),
        Shape::Batch(b) => batch(&c, b),
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
    let make_errors = error_codec(
        h.err_ty.as_ref(),
        ret_ty,
        &p,
        &errors,
        matches!(h.mode, Mode::Tx { .. }),
    );
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

    let body = quote! {
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
    };
    Function {
        func,
        lints: TokenStream::new(),
        receiver: h.receiver.as_ref(),
        store: &store,
        store_ty: store_param,
        params: params.collect(),
        output,
        body,
    }
    .tokens()
}

/// The rewritten function around `body`: the user's attributes (then
/// `lints`), visibility, `unsafe`, name, generics and where clause, with
/// `store: &store_ty` after the receiver and before the kept parameters.
struct Function<'a> {
    func: &'a syn::ItemFn,
    lints: TokenStream,
    receiver: Option<&'a syn::Receiver>,
    store: &'a Ident,
    store_ty: TokenStream,
    params: Vec<syn::PatType>,
    output: TokenStream,
    body: TokenStream,
}

impl Function<'_> {
    fn tokens(self) -> TokenStream {
        let Function {
            func,
            lints,
            receiver,
            store,
            store_ty,
            params,
            output,
            body,
        } = self;
        let attrs = &func.attrs;
        let vis = &func.vis;
        let sig = &func.sig;
        let ident = &sig.ident;
        let generics = &sig.generics;
        let where_clause = &generics.where_clause;
        let unsafety = &sig.unsafety;
        let receiver = receiver.map(|r| quote!(#r,));
        quote! {
            #(#attrs)*
            #lints
            #vis async #unsafety fn #ident #generics (
                #receiver
                #store: &#store_ty,
                #(#params),*
            ) -> #output
            #where_clause
            {
                #body
            }
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
