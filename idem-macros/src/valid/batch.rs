//! Telling a batch handler: the `&[M]` parameter the key reads, and what
//! a batch handler cannot have.

use syn::{GenericArgument, PathArguments, Type};

use crate::ctxt::Ctxt;
use crate::model::{Batch, KeyTerm, Param};
use crate::suggest::list;
use crate::types::unparenthesized;

/// `M` of a parameter type `&[M]` (or `&'a [M]`): the one form of a batch.
fn slice_elem(ty: &Type) -> Option<&Type> {
    match unparenthesized(ty) {
        Type::Reference(r) if r.mutability.is_none() => match unparenthesized(&r.elem) {
            Type::Slice(s) => Some(&s.elem),
            _ => None,
        },
        _ => None,
    }
}

/// What a type that holds several messages but is no `&[M]` is: `&mut
/// [M]`, an array, a `Vec` or a boxed slice, by value or by reference.
/// `None` for anything else.
fn batch_like(ty: &Type) -> Option<&'static str> {
    match unparenthesized(ty) {
        Type::Reference(r) => match unparenthesized(&r.elem) {
            Type::Slice(_) if r.mutability.is_some() => Some("a `&mut` slice"),
            inner => batch_like(inner).map(|what| match what {
                "an array" => "a reference to an array",
                "a `Vec`" => "a reference to a `Vec`",
                other => other,
            }),
        },
        Type::Array(_) => Some("an array"),
        Type::Slice(_) => Some("a slice by value"),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            let one_type = matches!(&last.arguments, PathArguments::AngleBracketed(a)
                if a.args.len() == 1 && matches!(a.args.first(), Some(GenericArgument::Type(_))));
            match &last.arguments {
                PathArguments::AngleBracketed(a) if last.ident == "Box" => match a.args.first() {
                    Some(GenericArgument::Type(Type::Slice(_))) => Some("a boxed slice"),
                    _ => None,
                },
                _ if last.ident == "Vec" && one_type => Some("a `Vec`"),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The batch parameter, when the key reads a parameter taken as `&[M]`;
/// and the refusals of what a batch handler cannot have. `Err(batch)`
/// once an error is recorded, `batch` telling whether the handler still
/// reads as one (for the stub's signature).
pub(super) fn batch(
    cx: &mut Ctxt,
    messages: &[Param],
    key: Option<&[KeyTerm]>,
    key_given: bool,
    key_param: Option<&syn::PatType>,
    outbox_param: Option<&syn::PatType>,
    max_attempts: Option<&syn::Expr>,
) -> Result<Option<Batch>, bool> {
    // The parameters the key reads, and whether it reads their fields. A
    // key that could not be resolved (an error is reported) is taken to read
    // the one slice among the messages, if there is one, so that the stub's
    // signature is the batch's.
    let read: Vec<(&Param, bool)> = match key {
        Some(terms) => messages
            .iter()
            .filter_map(|m| {
                let ident = m.ident.as_ref()?;
                let mut fields = terms.iter().filter_map(|t| match t {
                    KeyTerm::Path { root, fields, .. } if root == ident => Some(!fields.is_empty()),
                    _ => None,
                });
                let first = fields.next()?;
                Some((m, first || fields.any(|f| f)))
            })
            .collect(),
        None if key_given => {
            let mut slices = messages.iter().filter(|m| slice_elem(&m.arg.ty).is_some());
            match (slices.next(), slices.next()) {
                (Some(only), None) => vec![(only, true)],
                _ => Vec::new(),
            }
        }
        None => Vec::new(),
    };
    let mut ok = true;
    let mut batches: Vec<(&Param, &Type)> = Vec::new();
    for (param, with_fields) in read {
        if let Some(elem) = slice_elem(&param.arg.ty) {
            batches.push((param, elem));
        } else if let (Some(what), true) = (batch_like(&param.arg.ty), with_fields) {
            let name = param
                .ident
                .as_ref()
                .map_or("msgs".to_owned(), ToString::to_string);
            cx.error_spanned_by(
                &param.arg.ty,
                format!(
                    "`{name}` is {what}: a batch handler takes its messages as a shared slice, `{name}: &[M]`, whose elements the key reads one by one{}",
                    if what.ends_with("`Vec`") {
                        " (callers pass `&vec`)"
                    } else {
                        ""
                    }
                ),
            );
            ok = false;
        }
    }
    let (param, elem) = match batches.as_slice() {
        [] => return if ok { Ok(None) } else { Err(false) },
        [only] => *only,
        [_, .., last] => {
            let names: Vec<String> = batches
                .iter()
                .filter_map(|(p, _)| p.ident.as_ref().map(|i| format!("`{i}`")))
                .collect();
            cx.error_spanned_by(
                &last.0.arg.ty,
                format!(
                    "the key reads {}, and each is a batch (`&[M]`): a batch handler takes one batch, whose messages the key reads one by one; take the other parameters as single values",
                    list(&names, "and")
                ),
            );
            return Err(true);
        }
    };
    let Some(ident) = param.ident.clone() else {
        return Err(true);
    };
    if batch_like(elem).is_some() || slice_elem(elem).is_some() {
        cx.error_spanned_by(
            elem,
            format!(
                "`{ident}` is a batch of batches: the elements of `&[M]` are the handler's messages, whose fields the key reads one by one; take `&[M]` with `M` the message type, and call the handler once per batch"
            ),
        );
        ok = false;
    }
    if let Some(expr) = max_attempts {
        cx.error_spanned_by(
            expr,
            "`max_attempts` cannot count the failures of a batch handler: its body runs once for all the fresh messages of a batch and fails for all of them, so a failure belongs to no one message; remove `max_attempts` (a failed batch records nothing, and its messages run again when redelivered)",
        );
        ok = false;
    }
    if let Some(key_param) = key_param {
        cx.error_spanned_by(
            &key_param.ty,
            format!(
                "a batch handler has no single key to give its body: each message of `{ident}` has its own; remove this parameter"
            ),
        );
        ok = false;
    }
    if let Some(outbox) = outbox_param {
        cx.error_spanned_by(
            &outbox.ty,
            format!(
                "a batch handler takes no outbox: a staged message's id derives from one message's key, and `{ident}` holds many; stage per message with `store.outbox(name, key.as_str())` on the transaction, or handle one message per call"
            ),
        );
        ok = false;
    }
    if !ok {
        return Err(true);
    }
    Ok(Some(Batch {
        ident,
        param: param.arg.clone(),
        elem: elem.clone(),
    }))
}
