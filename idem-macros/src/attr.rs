//! Parsing the attribute's arguments: `key = "...", ttl = "...", ...`.
//!
//! Each argument is kept with its literal so that later errors point at it;
//! a repeat is reported on the repeated keyword.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::{LitStr, Token};

use crate::ctxt::Ctxt;
use crate::suggest::similar;

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(store);
    syn::custom_keyword!(name);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(max_attempts);
}

const VALID: &str =
    "`key`, `ttl`, `store`, `name`, `lease`, `fingerprint`, `max_attempts` or `crate`";

/// The arguments as written. `None` where an argument is absent.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<LitStr>,
    pub(crate) store: Option<LitStr>,
    pub(crate) name: Option<LitStr>,
    pub(crate) lease: Option<LitStr>,
    pub(crate) fingerprint: Option<LitStr>,
    /// An integer literal, checked by `valid`; kept as an expression so that
    /// a string, a float or a sign is reported with advice there.
    pub(crate) max_attempts: Option<syn::Expr>,
    pub(crate) krate: Option<LitStr>,
    /// Arguments written but already reported (a value that is not a string
    /// literal, a misspelled name): not to be reported as missing too.
    reported: Vec<&'static str>,
    /// Something could not be read as an argument (a syntax error, a value
    /// without a name): which arguments the user meant to give is unknown.
    unreadable: bool,
}

impl Args {
    /// The slot of an argument that takes a string literal.
    fn slot(&mut self, label: &str) -> &mut Option<LitStr> {
        match label {
            "key" => &mut self.key,
            "ttl" => &mut self.ttl,
            "store" => &mut self.store,
            "name" => &mut self.name,
            "lease" => &mut self.lease,
            "fingerprint" => &mut self.fingerprint,
            _ => &mut self.krate,
        }
    }

    /// Whether `label` is absent and should be reported as missing: not when
    /// an error about it was reported already, nor after a syntax error.
    pub(crate) fn is_missing(&self, label: &str) -> bool {
        let given = match label {
            "key" => self.key.is_some(),
            "ttl" => self.ttl.is_some(),
            "store" => self.store.is_some(),
            "name" => self.name.is_some(),
            "lease" => self.lease.is_some(),
            "fingerprint" => self.fingerprint.is_some(),
            "max_attempts" => self.max_attempts.is_some(),
            _ => self.krate.is_some(),
        };
        !given && !self.unreadable && !self.reported.contains(&label)
    }
}

const NAMES: &[&str] = &[
    "key",
    "ttl",
    "store",
    "name",
    "lease",
    "fingerprint",
    "max_attempts",
    "crate",
];

/// Parses the arguments, recording every problem in `cx`; what parsed is kept.
pub(crate) fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Args {
    let mut args = Args::default();
    let mut errors: Vec<syn::Error> = Vec::new();
    let parser = |input: ParseStream<'_>| {
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            let name_span = input.span();
            let label: &'static str = if lookahead.peek(kw::key) {
                input.parse::<kw::key>()?;
                "key"
            } else if lookahead.peek(kw::ttl) {
                input.parse::<kw::ttl>()?;
                "ttl"
            } else if lookahead.peek(kw::store) {
                input.parse::<kw::store>()?;
                "store"
            } else if lookahead.peek(kw::name) {
                input.parse::<kw::name>()?;
                "name"
            } else if lookahead.peek(kw::lease) {
                input.parse::<kw::lease>()?;
                "lease"
            } else if lookahead.peek(kw::fingerprint) {
                input.parse::<kw::fingerprint>()?;
                "fingerprint"
            } else if lookahead.peek(kw::max_attempts) {
                input.parse::<kw::max_attempts>()?;
                "max_attempts"
            } else if lookahead.peek(Token![crate]) {
                input.parse::<Token![crate]>()?;
                "crate"
            } else if input.peek(LitStr) {
                let value: LitStr = input.parse()?;
                errors.push(syn::Error::new(
                    value.span(),
                    "this value has no name: arguments are written `name = \"value\"`, as in key = \"order_id\", ttl = \"24h\", store = \"sqlite\"",
                ));
                args.unreadable = true;
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
                continue;
            } else if input.peek(syn::Ident) {
                let unknown: syn::Ident = input.parse()?;
                let message = match similar(&unknown.to_string(), NAMES) {
                    Some(known) => {
                        // A misspelling: the argument it names is not missing.
                        args.reported.push(known);
                        format!("unknown argument `{unknown}`: did you mean `{known}`?")
                    }
                    None => format!("unknown argument `{unknown}`: expected {VALID}"),
                };
                errors.push(syn::Error::new(unknown.span(), message));
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
            input.parse::<Token![=]>().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("expected `=` after `{label}`, as in {}", example(label)),
                )
            })?;
            let twice =
                || syn::Error::new(name_span, format!("`{label}` is given twice: keep one"));
            if label == "max_attempts" {
                // Any expression: `valid` says what to write instead of a
                // string, a float or a sign.
                let value: syn::Expr = input.parse()?;
                if args.max_attempts.is_some() {
                    errors.push(twice());
                } else {
                    args.max_attempts = Some(value);
                }
            } else if input.peek(LitStr) {
                let value: LitStr = input.parse()?;
                let slot = args.slot(label);
                if slot.is_some() {
                    errors.push(twice());
                } else {
                    *slot = Some(value);
                }
            } else if label == "fingerprint"
                && input.peek(Token![*])
                && (input.peek2(Token![,]) || {
                    let fork = input.fork();
                    fork.parse::<Token![*]>().is_ok() && fork.is_empty()
                })
            {
                // `*` is no expression: say what to write before syn fails.
                let star: Token![*] = input.parse()?;
                errors.push(syn::Error::new(
                    star.span,
                    "`fingerprint` takes a string literal: write fingerprint = \"*\" for the whole message",
                ));
                args.reported.push(label);
            } else {
                // Report the value and go on: the argument is not missing.
                let span = input.span();
                let value: syn::Expr = input.parse()?;
                let written = value.to_token_stream().to_string();
                let advice = if quoting_fits(label, &written) {
                    format!("write {label} = \"{written}\"")
                } else {
                    format!("as in {}", example(label))
                };
                errors.push(syn::Error::new(
                    span,
                    format!("`{label}` takes a string literal: {advice}"),
                ));
                args.reported.push(label);
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    };
    let fatal = parser.parse2(tokens).err();
    args.unreadable |= fatal.is_some();
    for e in errors.into_iter().chain(fatal) {
        cx.syn_error(e);
    }
    args
}

/// Whether `written`, put in quotes, is a valid value of `label`; then the
/// error can say exactly what to write.
fn quoting_fits(label: &str, written: &str) -> bool {
    match label {
        "key" => idem_grammar::parse_key(written).is_ok(),
        "fingerprint" => idem_grammar::parse_fingerprint(written).is_ok(),
        "ttl" | "lease" => idem_grammar::parse_duration(written).is_ok(),
        _ => syn::parse_str::<syn::Ident>(written).is_ok(),
    }
}

fn example(label: &str) -> &'static str {
    match label {
        "key" => "key = \"order_id + sku\"",
        "ttl" => "ttl = \"24h\"",
        "store" => "store = \"sqlite\"",
        "name" => "name = \"deduct_stock\"",
        "lease" => "lease = \"30s\"",
        "fingerprint" => "fingerprint = \"qty + price\"",
        "max_attempts" => "max_attempts = 5",
        _ => "crate = \"my_idem\"",
    }
}
