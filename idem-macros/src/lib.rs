//! The `#[idempotent]` attribute. Use it through `idem-runtime`, which
//! re-exports it and holds everything the generated code calls.
//!
//! The crate is split the way the work is: [`attr`] parses the attribute's
//! arguments, [`valid`] checks them against the function's signature and
//! builds the [`valid::Handler`] model, [`expand`] generates the rewritten
//! function. Every mistake found is collected and reported together; on error
//! the user's function is still emitted, so the rest of the crate keeps
//! compiling and the IDE keeps working.

#![warn(clippy::unwrap_used)]

use proc_macro::TokenStream;
use quote::ToTokens;

mod attr;
mod ctxt;
mod expand;
mod valid;

/// Makes an async handler idempotent. See `idem_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item2: proc_macro2::TokenStream = item.clone().into();
    let func: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(e) => {
            let mut out = syn::Error::new(
                e.span(),
                "#[idempotent] goes on an `async fn` (a free function or a method)",
            )
            .to_compile_error();
            out.extend(item2);
            return out.into();
        }
    };
    let mut cx = ctxt::Ctxt::default();
    let args = attr::parse(&mut cx, args.into());
    let handler = valid::check(&mut cx, &args, &func);
    match (cx.finish(), handler) {
        (Ok(()), Some(handler)) => expand::expand(&handler).into(),
        (Err(errors), _) => {
            let mut out = errors;
            out.extend(func.into_token_stream());
            out.into()
        }
        (Ok(()), None) => func.into_token_stream().into(),
    }
}
