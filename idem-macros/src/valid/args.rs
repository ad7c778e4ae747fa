//! The arguments' values: which are missing, and whether `store`, `ttl`,
//! `lease`, `name` and `max_attempts` say something the macro can use.

use std::time::Duration;

use proc_macro2::Span;
use syn::{Ident, LitStr};

use crate::attr::Args;
use crate::ctxt::Ctxt;
use crate::model::{StoreArg, StoreRef};

/// Reports the required arguments that are absent, in one error when several
/// are, on the attribute (there is no token of theirs to point at).
pub(super) fn missing_arguments(cx: &mut Ctxt, args: &Args) {
    // (argument, what it says, an example)
    let required: [(&str, &str, &str); 3] = [
        (
            "key",
            "the message fields that identify a message",
            "key = \"order_id\"",
        ),
        (
            "ttl",
            "how long a completed message suppresses duplicates",
            "ttl = \"24h\"",
        ),
        (
            "store",
            "where the records live: the name of one of idem_runtime's stores, or the path of a store type of your own",
            "store = \"sqlite\"",
        ),
    ];
    let missing: Vec<_> = required
        .iter()
        .filter(|(label, _, _)| args.is_missing(label))
        .collect();
    let message = match missing.as_slice() {
        [] => return,
        [(label, what, example)] => format!("missing `{label}`: {what}, e.g. {example}"),
        [first @ .., last] => {
            let names: Vec<String> = first.iter().map(|(l, _, _)| format!("`{l}`")).collect();
            let whats: Vec<&str> = first.iter().map(|(_, w, _)| *w).collect();
            let examples: Vec<&str> = missing.iter().map(|(_, _, e)| *e).collect();
            format!(
                "missing {} and `{}`: {}, and {}; e.g. {}",
                names.join(", "),
                last.0,
                whats.join(", "),
                last.1,
                examples.join(", ")
            )
        }
    };
    cx.error_at(Span::call_site(), message);
}

pub(super) fn store(cx: &mut Ctxt, lit: &LitStr) -> Option<StoreArg> {
    let value = lit.value();
    let arg = |store| {
        Some(StoreArg {
            store,
            text: value.clone(),
            span: lit.span(),
        })
    };
    let ident = syn::parse_str::<Ident>(&value)
        .ok()
        .filter(|i| *i == value && !value.starts_with("r#"));
    if let Some(mut name) = ident {
        if value.chars().all(|c| !c.is_ascii_uppercase()) {
            name.set_span(lit.span());
            return arg(StoreRef::Name(name));
        }
        cx.error_spanned_by(
            lit,
            format!(
                "unknown store \"{value}\": built-in stores have lowercase names (did you mean \"{}\"?), and a store type of your own is named by its path, e.g. store = \"crate::{value}\"",
                value.to_ascii_lowercase()
            ),
        );
        return None;
    }
    if value.contains("::")
        && let Ok(path) = syn::parse_str::<syn::Path>(&value)
    {
        return arg(StoreRef::Type(path));
    }
    // A slip of case or spacing (`"redis "`, `"Sqlite 3"`): suggest the
    // name it looks like; rustc then says whether that store exists.
    let meant: String = value
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let suggestion = syn::parse_str::<Ident>(&meant)
        .ok()
        .map(|_| format!(": did you mean \"{meant}\"?"))
        .unwrap_or_default();
    cx.error_spanned_by(
        lit,
        format!(
            "invalid store \"{value}\"{suggestion} A built-in store is named by a lowercase identifier, e.g. store = \"sqlite\", and a store type of your own by its path, e.g. store = \"crate::MyStore\""
        ),
    );
    None
}

pub(super) fn duration(cx: &mut Ctxt, lit: &LitStr, what: &str) -> Option<Duration> {
    match idem_grammar::parse_duration(&lit.value()) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `{what}`: {}", e.message));
            None
        }
    }
}

pub(super) fn handler_name(cx: &mut Ctxt, lit: &LitStr) -> Option<String> {
    let value = lit.value();
    if value.is_empty()
        || value.len() > 128
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        cx.error_spanned_by(
            lit,
            "`name` must be 1 to 128 characters without spaces, e.g. name = \"deduct_stock\"; it scopes the handler's keys in the store, so keep it stable",
        );
        return None;
    }
    Some(value)
}

/// The `max_attempts` argument: an integer literal from 1 to `u32::MAX`.
/// Anything else is reported on it, with what to write instead.
pub(super) fn max_attempts(cx: &mut Ctxt, expr: &syn::Expr) -> Option<u32> {
    const MEANING: &str = "it is how many deliveries of one key may fail before the next one is refused with `Error::Exhausted` without running the body";
    let expr = unparenthesized_expr(expr);
    let message = match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(int),
            ..
        }) => {
            let suffix = int.suffix();
            let digits = int.base10_digits();
            let value = int.base10_parse::<u128>().ok();
            let fits_suffix = match (suffix, value) {
                (_, None) => true,
                ("u8", Some(v)) => v <= u128::from(u8::MAX),
                ("i8", Some(v)) => v <= 127,
                ("u16", Some(v)) => v <= u128::from(u16::MAX),
                ("i16", Some(v)) => v <= 32_767,
                ("i32", Some(v)) => v <= 2_147_483_647,
                _ => true,
            };
            let integer_suffix = matches!(
                suffix,
                "" | "u8"
                    | "u16"
                    | "u32"
                    | "u64"
                    | "u128"
                    | "usize"
                    | "i8"
                    | "i16"
                    | "i32"
                    | "i64"
                    | "i128"
                    | "isize"
            );
            match value.and_then(|v| u32::try_from(v).ok()) {
                _ if !integer_suffix => format!(
                    "`{int}` is not an integer: write max_attempts = {digits}"
                ),
                _ if !fits_suffix => format!(
                    "`{int}` does not fit a `{suffix}`: write max_attempts = {digits}"
                ),
                Some(0) => format!(
                    "`max_attempts` must be at least 1: {MEANING}, so 0 would refuse every delivery; write max_attempts = 1 or more, or remove it to let every delivery run"
                ),
                Some(n) => return Some(n),
                None => format!(
                    "`max_attempts = {digits}` is too large: it is a `u32`, at most {}; remove it to let every delivery run",
                    u32::MAX
                ),
            }
        }
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Float(float),
            ..
        }) => {
            let value = float
                .base10_parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && *v <= f64::from(u32::MAX));
            let advice = match value {
                Some(v) if v.fract() == 0.0 => format!("write max_attempts = {v}"),
                Some(v) if v < 1.0 => "write max_attempts = 1".to_owned(),
                Some(v) => format!(
                    "write max_attempts = {} or max_attempts = {}",
                    v.floor(),
                    v.ceil()
                ),
                None => "write e.g. max_attempts = 5".to_owned(),
            };
            format!(
                "`max_attempts` counts deliveries, a whole number from 1 to {}: {advice}",
                u32::MAX
            )
        }
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(text),
            ..
        }) => {
            let value = text.value();
            match value.trim().parse::<u32>() {
                Ok(n) if n > 0 => format!(
                    "`max_attempts` takes an integer, not a string: write it without quotes: max_attempts = {n}"
                ),
                _ => "`max_attempts` takes an integer, not a string: write it without quotes, e.g. max_attempts = 5".to_owned(),
            }
        }
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr: operand,
            ..
        }) if matches!(
            unparenthesized_expr(operand),
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(_) | syn::Lit::Float(_),
                ..
            })
        ) =>
        {
            format!(
                "`max_attempts` cannot be negative: {MEANING}; write a count of at least 1, e.g. max_attempts = 5"
            )
        }
        _ => "`max_attempts` takes an integer literal, e.g. max_attempts = 5: the macro reads the count at compile time, so it cannot be a constant's name or an expression".to_owned(),
    };
    cx.error_spanned_by(expr, message);
    None
}

/// `(e)` as `e`.
fn unparenthesized_expr(expr: &syn::Expr) -> &syn::Expr {
    match expr {
        syn::Expr::Paren(p) => unparenthesized_expr(&p.expr),
        syn::Expr::Group(g) => unparenthesized_expr(&g.expr),
        other => other,
    }
}
