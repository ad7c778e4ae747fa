//! Parsing the attribute's arguments: `key = "...", ttl = "...", ...`.
//!
//! Each argument is kept with its keyword token so that a repeat is reported
//! on the repeat, and with its literal so that later errors point at it.

use proc_macro2::TokenStream;
use syn::parse::{ParseStream, Parser};
use syn::{LitStr, Token};

use crate::ctxt::Ctxt;

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(store);
    syn::custom_keyword!(name);
    syn::custom_keyword!(lease);
}

const VALID: &str = "`key`, `ttl`, `store`, `name`, `lease` or `crate`";

/// The arguments as written. `None` where an argument is absent.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) store: Option<LitStr>,
    pub(crate) name: Option<LitStr>,
    pub(crate) lease: Option<LitStr>,
    pub(crate) krate: Option<LitStr>,
}

/// Parses the arguments, recording every problem in `cx`; what parsed is kept.
pub(crate) fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Args {
    let mut args = Args::default();
    let mut errors: Vec<syn::Error> = Vec::new();
    let parser = |input: ParseStream<'_>| {
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            let (slot, label): (&mut Option<LitStr>, &str) = if lookahead.peek(kw::key) {
                input.parse::<kw::key>()?;
                (&mut args.key, "key")
            } else if lookahead.peek(kw::ttl) {
                input.parse::<kw::ttl>()?;
                (&mut args.ttl, "ttl")
            } else if lookahead.peek(kw::store) {
                input.parse::<kw::store>()?;
                (&mut args.store, "store")
            } else if lookahead.peek(kw::name) {
                input.parse::<kw::name>()?;
                (&mut args.name, "name")
            } else if lookahead.peek(kw::lease) {
                input.parse::<kw::lease>()?;
                (&mut args.lease, "lease")
            } else if lookahead.peek(Token![crate]) {
                input.parse::<Token![crate]>()?;
                (&mut args.krate, "crate")
            } else if input.peek(syn::Ident) {
                let unknown: syn::Ident = input.parse()?;
                errors.push(syn::Error::new(
                    unknown.span(),
                    format!("unknown argument `{unknown}`: expected {VALID}"),
                ));
                // Skip its value and go on, so later mistakes are reported too.
                if input.parse::<Option<Token![=]>>()?.is_some() {
                    input.parse::<syn::Expr>()?;
                }
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
                continue;
            } else {
                return Err(lookahead.error());
            };
            let eq: Token![=] = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("expected `=` after `{label}`, as in {label} = \"...\""),
                )
            })?;
            let value: LitStr = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("`{label}` takes a string literal, as in {}", example(label)),
                )
            })?;
            if slot.is_some() {
                errors.push(syn::Error::new(
                    eq.span.join(value.span()).unwrap_or(value.span()),
                    format!("`{label}` is given twice: keep one"),
                ));
            } else {
                *slot = Some(value);
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    };
    let fatal = parser.parse2(tokens).err();
    for e in errors.into_iter().chain(fatal) {
        cx.syn_error(e);
    }
    args
}

fn example(label: &str) -> &'static str {
    match label {
        "key" => "key = \"order_id + sku\"",
        "ttl" => "ttl = \"24h\"",
        "store" => "store = \"sqlite\"",
        "name" => "name = \"deduct_stock\"",
        "lease" => "lease = \"30s\"",
        _ => "crate = \"my_idem\"",
    }
}
