//! The `#[idempotent]` attribute. Use it through `idem-runtime`, which
//! re-exports it and holds everything the generated code calls.
//!
//! The crate is split the way the work is: `attr` parses the attribute's
//! arguments, `valid` checks them against the function's signature and
//! builds the `model::Handler` (its mode, transaction or lease, and its
//! shape, single or batch), `expand` generates the rewritten function.
//! `types` reads what written types say, `suggest` words the advice, and
//! `ctxt` collects the errors.
//!
//! Every mistake found is collected and reported together; on error a stub
//! with the rewritten signature is emitted beside the errors, holding the
//! user's body (type-checked, never run), so that callers see no second
//! error, the body's own mistakes are still reported and the IDE keeps
//! working.

#![warn(clippy::unwrap_used)]

use proc_macro::TokenStream;

mod attr;
mod ctxt;
mod expand;
mod model;
mod suggest;
mod types;
mod valid;

/// Makes an async handler idempotent. See `idem_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent_impl(args.into(), item.into()).into()
}

/// The attribute on `proc_macro2` tokens, so tests can expand it.
fn idempotent_impl(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let mut out = syn::Error::new(
                e.span(),
                "#[idempotent] goes on an `async fn` (a free function or a method)",
            )
            .to_compile_error();
            out.extend(item);
            return out;
        }
    };
    let mut cx = ctxt::Ctxt::default();
    let args = attr::parse(&mut cx, args);
    let checked = valid::check(&mut cx, &args, &func);
    match (cx.finish(), checked.handler) {
        (Ok(()), Some(handler)) => expand::expand(&handler),
        (Err(errors), _) => {
            let mut out = errors;
            out.extend(expand::stub(&checked.stub));
            out
        }
        // Not reached: the model is missing only where an error was recorded.
        (Ok(()), None) => expand::stub(&checked.stub),
    }
}

#[cfg(test)]
mod snapshot;
