//! Resolving the key's and the fingerprint's paths to the parameters and
//! fields they read.

use idem_grammar::{FingerprintExpr, KeyExpr, Part, Segment};
use proc_macro2::Span;
use syn::{Ident, LitStr, Type};

use crate::ctxt::Ctxt;
use crate::model::{Fingerprint, FingerprintTerm, KeyTerm, Param};
use crate::suggest::list;
use crate::types::unparenthesized;

/// The first segments of the expression's paths.
pub(super) fn roots(expr: &KeyExpr) -> Vec<String> {
    expr.parts
        .iter()
        .filter_map(|p| match p {
            Part::Path { segments, .. } => match segments.first() {
                Some(Segment::Field(f)) => Some(f.clone()),
                _ => None,
            },
            Part::Const { .. } => None,
        })
        .collect()
}

/// The `key` argument: paths resolved as `terms` does, and constants;
/// `None` once an error is recorded.
pub(super) fn key(
    cx: &mut Ctxt,
    lit: &LitStr,
    params: &[Param],
    method: bool,
) -> Option<Vec<KeyTerm>> {
    let text = lit.value();
    let expr = match idem_grammar::parse_key(&text) {
        Ok(e) => e,
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `key`: {}", e.message));
            return None;
        }
    };
    if expr.parts.iter().all(|p| matches!(p, Part::Const { .. })) {
        cx.error_spanned_by(
            lit,
            "this key has only constants, so every message would share one key: add a field of the message, e.g. key = \"'deduct' + order_id\"",
        );
        return None;
    }
    terms(cx, lit, "key", &expr, params, method)
}

/// The `fingerprint` argument: `*` (the one message parameter), or paths
/// read as the key's are. `None` once an error is recorded.
pub(super) fn fingerprint(
    cx: &mut Ctxt,
    lit: &LitStr,
    params: &[Param],
    method: bool,
) -> Option<Fingerprint> {
    let text = lit.value();
    let expr = match idem_grammar::parse_fingerprint(&text) {
        Ok(e) => e,
        Err(e) => {
            cx.error_spanned_by(lit, format!("invalid `fingerprint`: {}", e.message));
            return None;
        }
    };
    let by_reference = |param: &Param| matches!(unparenthesized(&param.arg.ty), Type::Reference(_));
    let expr = match expr {
        FingerprintExpr::Message => {
            let term = match params {
                [] => {
                    cx.error_spanned_by(
                        lit,
                        "fingerprint = \"*\" fingerprints the message, but the handler has no message parameter",
                    );
                    return None;
                }
                [only] => match &only.ident {
                    Some(ident) => FingerprintTerm {
                        root: ident.clone(),
                        fields: Vec::new(),
                        deref: by_reference(only),
                    },
                    None => {
                        cx.error_spanned_by(
                            &only.arg.pat,
                            "the message parameter needs a plain name (e.g. `msg: &OrderPlaced`) for fingerprint = \"*\" to read it",
                        );
                        return None;
                    }
                },
                several => {
                    let names: Vec<String> = several
                        .iter()
                        .filter_map(|p| p.ident.as_ref().map(ToString::to_string))
                        .collect();
                    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                    let example = match names.as_slice() {
                        [a, b, ..] => format!(
                            ": each message whole (fingerprint = \"{a} + {b}\") or the fields that matter (fingerprint = \"{a}.<field> + {b}.<field>\")"
                        ),
                        _ => String::new(),
                    };
                    cx.error_spanned_by(
                        lit,
                        format!(
                            "fingerprint = \"*\" is ambiguous: `*` is the message, and this handler takes {} ({}); name the parts to fingerprint{example}",
                            several.len(),
                            list(&quoted, "and")
                        ),
                    );
                    return None;
                }
            };
            return Some(Fingerprint {
                text,
                span: lit.span(),
                whole: true,
                parts: vec![term],
            });
        }
        FingerprintExpr::Parts(expr) => expr,
    };
    // A constant is the same in every delivery: it would compare nothing.
    let constants: Vec<String> = expr
        .parts
        .iter()
        .filter(|p| matches!(p, Part::Const { .. }))
        .map(ToString::to_string)
        .collect();
    if !constants.is_empty() {
        cx.error_spanned_by(
            lit,
            format!(
                "a fingerprint compares deliveries of one key, and a constant ({}) is the same in every delivery: remove it and name message fields, e.g. fingerprint = \"qty + price\"",
                list(&constants, "and")
            ),
        );
        return None;
    }
    let terms = terms(cx, lit, "fingerprint", &expr, params, method)?;
    let parts = terms
        .into_iter()
        .filter_map(|term| match term {
            KeyTerm::Path { root, fields, .. } => {
                let deref = fields.is_empty()
                    && params
                        .iter()
                        .any(|p| p.ident.as_ref() == Some(&root) && by_reference(p));
                Some(FingerprintTerm {
                    root,
                    fields,
                    deref,
                })
            }
            KeyTerm::Const(_) => None,
        })
        .collect();
    Some(Fingerprint {
        text,
        span: lit.span(),
        whole: false,
        parts,
    })
}

/// The terms of a key (`what` = "key") or fingerprint expression: each path
/// resolved to a parameter and its fields, spanned on the literal. `None`
/// once an error is recorded.
fn terms(
    cx: &mut Ctxt,
    lit: &LitStr,
    what: &str,
    expr: &KeyExpr,
    params: &[Param],
    method: bool,
) -> Option<Vec<KeyTerm>> {
    let names: Vec<String> = params
        .iter()
        .filter_map(|p| p.ident.as_ref().map(|i| i.to_string()))
        .collect();
    // The parameters that some key part already starts with.
    let used_roots: Vec<&str> = expr
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Path { segments, .. } => match segments.first() {
                Some(Segment::Field(f)) if segments.len() > 1 => Some(f.as_str()),
                _ => None,
            },
            Part::Const { .. } => None,
        })
        .filter(|f| names.iter().any(|n| n == f))
        .collect();
    // A method's key that reads the receiver (`self.tenant`) has two roots,
    // so the message's paths may name theirs too (`msg.id`).
    let reads_self = method
        && expr.parts.iter().any(|p| {
            matches!(p, Part::Path { segments, .. }
                if segments.len() > 1 && matches!(&segments[0], Segment::Field(f) if f == "self"))
        });
    let mut out = Vec::new();
    let mut ok = true;
    for part in &expr.parts {
        let (segments, part_text) = match part {
            Part::Const { value, .. } => {
                out.push(KeyTerm::Const(value.clone()));
                continue;
            }
            Part::Path { segments, .. } => (segments, part.to_string()),
        };
        // `self`, `super`, `crate` and `Self` are never field names; `self`
        // may start a path in a method.
        let keyword = segments.iter().enumerate().find_map(|(i, s)| match s {
            Segment::Field(f) if matches!(f.as_str(), "self" | "super" | "crate" | "Self") => {
                Some((i, f.as_str()))
            }
            _ => None,
        });
        let from_self = match keyword {
            None => false,
            Some((0, "self")) if method && segments.len() > 1 => true,
            Some((0, "self")) if method => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` is the receiver itself: name one of its fields, e.g. `self.tenant`"),
                );
                ok = false;
                continue;
            }
            Some((0, "self")) => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` reads `self`, but this handler is not a method: start the path with a parameter's name"),
                );
                ok = false;
                continue;
            }
            Some((_, word)) => {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "{what} part `{part_text}`: `{word}` is a keyword and cannot be a field name"
                    ),
                );
                ok = false;
                continue;
            }
        };
        let (root, rest): (Ident, &[Segment]) = match params {
            _ if from_self => (Ident::new("self", lit.span()), &segments[1..]),
            [] => {
                cx.error_spanned_by(
                    lit,
                    format!("{what} part `{part_text}` names a field, but the handler has no message parameter to read it from"),
                );
                ok = false;
                continue;
            }
            [only] => match &only.ident {
                Some(ident)
                    if reads_self
                        && segments.len() > 1
                        && matches!(&segments[0], Segment::Field(f) if ident == f) =>
                {
                    (ident.clone(), &segments[1..])
                }
                Some(ident) => (ident.clone(), &segments[..]),
                None => {
                    cx.error_spanned_by(
                        &only.arg.pat,
                        format!("the message parameter needs a plain name (e.g. `msg: &OrderPlaced`) for the {what} to read its fields"),
                    );
                    ok = false;
                    continue;
                }
            },
            _ => {
                let first = match &segments[0] {
                    Segment::Field(f) => f.as_str(),
                    Segment::Index(_) => "",
                };
                let root = params
                    .iter()
                    .filter_map(|p| p.ident.as_ref())
                    .find(|i| *i == first);
                match root {
                    Some(r) => (r.clone(), &segments[1..]),
                    None => {
                        let message = if segments.len() == 1 {
                            let suggestions: Vec<String> =
                                names.iter().map(|n| format!("`{n}.{part_text}`")).collect();
                            format!(
                                "{what} part `{part_text}` is ambiguous: with several message parameters a {what} path starts with the parameter's name, e.g. {}",
                                suggestions.join(" or ")
                            )
                        } else {
                            not_a_parameter(what, &part_text, segments, &names, &used_roots)
                        };
                        cx.error_spanned_by(lit, message);
                        ok = false;
                        continue;
                    }
                }
            }
        };
        let fields = rest.iter().map(|s| member(s, lit.span())).collect();
        out.push(KeyTerm::Path {
            root,
            fields,
            text: part_text,
        });
    }
    ok.then_some(out)
}

/// The message for a path whose first segment is no parameter: names
/// the parameters, and suggests the path with the nearest parameter's name
/// in place of the first segment (by edit distance; of equally near ones,
/// one that no other key part starts with yet).
fn not_a_parameter(
    what: &str,
    part_text: &str,
    segments: &[Segment],
    names: &[String],
    used_roots: &[&str],
) -> String {
    let first = segments[0].to_string();
    let rest: Vec<String> = segments[1..].iter().map(ToString::to_string).collect();
    let rest = rest.join(".");
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    let nearest = names.iter().min_by_key(|n| {
        (
            crate::suggest::distance(&first, n),
            used_roots.contains(&n.as_str()),
        )
    });
    let mut message = format!(
        "{what} part `{part_text}` starts with `{first}`, but the handler has no parameter `{first}`: its parameters are {}",
        list(&quoted, "and")
    );
    if let Some(n) = nearest {
        message.push_str(&format!("; did you mean `{n}.{rest}`?"));
        let slip = crate::suggest::similar(&first, &[n.as_str()]).is_some()
            || first.chars().next() == n.chars().next();
        if !slip {
            // Neither a misspelling nor an abbreviation of the name: `first`
            // may be a field of a parameter.
            message.push_str(&format!(
                " (if `{first}` is a field, start with the parameter's name: `{n}.{part_text}`)"
            ));
        }
    }
    message
}

/// A field access whose tokens carry the key literal's span, so rustc's own
/// "no field" diagnostics land on the attribute. Keywords that can be raw
/// identifiers (`type`, `match`) become `r#type`; `self`, `super`, `crate`
/// and `Self`, which cannot, were refused before.
fn member(segment: &Segment, span: Span) -> syn::Member {
    match segment {
        Segment::Field(name) => {
            let ident = syn::parse_str::<Ident>(name)
                .map(|mut i| {
                    i.set_span(span);
                    i
                })
                .unwrap_or_else(|_| Ident::new_raw(name, span));
            syn::Member::Named(ident)
        }
        Segment::Index(i) => syn::Member::Unnamed(syn::Index { index: *i, span }),
    }
}
