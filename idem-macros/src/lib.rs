//! The `#[idempotent]` attribute. Use it through `idem-runtime`, which
//! re-exports it and holds everything the generated code calls.
//!
//! The crate is split the way the work is: `attr` parses the attribute's
//! arguments, `valid` checks them against the function's signature and
//! builds the `valid::Handler` model, `expand` generates the rewritten
//! function. Every mistake found is collected and reported together; on error
//! a stub with the rewritten signature is emitted beside the errors, holding
//! the user's body (type-checked, never run), so that callers see no second
//! error, the body's own mistakes are still reported and the IDE keeps
//! working.

#![warn(clippy::unwrap_used)]

use proc_macro::TokenStream;

mod attr;
mod ctxt;
mod expand;
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

/// The expansions shown in the README, kept honest: this test expands each
/// handler `tests/expanded/<name>.input.rs`, compares the result with
/// `tests/expanded/<name>.rs` and fails when they differ (`IDEM_BLESS=1`
/// rewrites the files).
#[cfg(test)]
mod snapshot {
    fn check(name: &str) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/expanded");
        let input =
            std::fs::read_to_string(format!("{dir}/{name}.input.rs")).expect("read the input");
        let mut item: syn::ItemFn = syn::parse_str(&input).expect("the input parses");
        let attr = item.attrs.remove(0);
        let args = attr
            .meta
            .require_list()
            .expect("#[idempotent(...)]")
            .tokens
            .clone();
        let out = super::idempotent_impl(args, quote::quote!(#item));
        let file: syn::File = syn::parse2(out).expect("the expansion parses");
        let pretty = prettyplease::unparse(&file);
        let path = format!("{dir}/{name}.rs");
        if std::env::var("IDEM_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &pretty).expect("write snapshot");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            pretty, committed,
            "expansion of {name} changed; rerun with IDEM_BLESS=1 and update the README"
        );
    }

    /// A handler in transaction mode, as at the top of the README.
    #[test]
    fn readme_expansion_is_current() {
        check("deduct_stock");
    }

    /// A lease-mode handler with `fingerprint` and `max_attempts`.
    #[test]
    fn fingerprint_expansion_is_current() {
        check("capture_payment");
    }

    /// A batch handler in transaction mode.
    #[test]
    fn tx_batch_expansion_is_current() {
        check("deduct_stock_batch");
    }

    /// A batch handler in lease mode, with a fingerprint.
    #[test]
    fn lease_batch_expansion_is_current() {
        check("notify_batch");
    }
}
