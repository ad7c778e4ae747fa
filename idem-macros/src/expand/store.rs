//! The store parameter and the checks of the store and the transaction.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Type};

use super::spans::respan;
use crate::model::{StoreArg, StoreRef};
use crate::types::{holds_impl_trait, mut_referent, unparenthesized};

/// The rewritten function's store parameter type, and the checks the
/// runtime makes of the store and the transaction: `&impl LeaseStore` in
/// lease mode, `&impl TxStore<Tx = T>` in transaction mode, where `T` is the
/// written transaction type with its lifetimes `'static` (what a store hands
/// over). The checks are calls of the runtime's `__private::stores`
/// functions, spanned on what they check, so that rustc reports an unknown
/// store on its name, a first parameter that is not the store's transaction
/// (another store's, or no transaction at all) on its type, with the type
/// to write, and a transaction out of place on its type. Each mistake is
/// one check's error: the store's mode is checked on its name, and the
/// store of a body that `stages` messages must have an outbox; and the
/// transaction against that store only where the store has transactions.
pub(super) fn store_checks<'a>(
    store: &StoreArg,
    tx_param: Option<&syn::PatType>,
    stages: bool,
    params: impl Iterator<Item = &'a syn::PatType>,
    p: &TokenStream,
) -> (TokenStream, TokenStream) {
    let stores = quote!(#p::stores);
    let tx = tx_param.and_then(|param| mut_referent(&param.ty));
    let named_at = store.span;
    // The store's own check, spanned on its literal: an unknown name,
    // another name of a store, a feature that is off; and, for a store type,
    // whether it runs this mode. In transaction mode a second check,
    // spanned on the transaction's type, says whether that type is this
    // store's transaction.
    let lease_mode = respan(quote!(#stores::LeaseMode), named_at);
    let (param, tx) = match tx {
        Some(ty) => {
            let owned = static_lifetimes(ty);
            // A body that stages messages needs a store with an outbox.
            let param = if stages {
                quote!((impl #p::TxStore<Tx = #owned> + #p::StagesMessages))
            } else {
                quote!(impl #p::TxStore<Tx = #owned>)
            };
            (param, Some((owned, ty.span())))
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
            // The store's bound accepts its own transaction only.
            let by_tx = tx.map(|(owned, span)| {
                let store_fn = Ident::new("__idem_store", Span::mixed_site().located_at(span));
                let mode = respan(quote!(#stores::TxMode), span);
                quote_spanned!(span=> #store_fn::<#mode<#owned>>();)
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
            match tx {
                // Whether the store has transactions, on its name; whether
                // the first parameter is its `Tx`, on the parameter (only
                // for a store with transactions, through `StoreProbe`'s
                // lookup, so that a store without is one error).
                Some((owned, span)) => {
                    let any_tx = respan(quote!(#stores::AnyTxMode), named_at);
                    let at_ty = respan(stores.clone(), span);
                    let by_name = quote_spanned!(named_at=> #check::<#path, #any_tx>(););
                    let by_tx = quote_spanned! {span=>
                        {
                            #[allow(unused_imports)]
                            use #at_ty::{NoStoreTx as _, StoreTx as _};
                            (&#at_ty::StoreProbe::<#path, #owned>::new()).store_tx().first_param();
                        }
                    };
                    quote! {
                        #by_name
                        #by_tx
                    }
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
