//! Deriving the key and the fingerprint from the messages.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;

use super::spans::respan;
use crate::model::{Batch, Fingerprint, Handler, KeyTerm};

/// The key derivation: one `part` call per field path, spanned on the key
/// literal so a missing field or a float lands on the attribute. `root`
/// gives the expression a path starts from (a batch handler's paths read
/// its element); `missing` is what a `None` part does.
pub(super) fn derive_key(
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
pub(super) fn derive_batch(
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
pub(super) fn fingerprint_value(
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
