//! Checks the arguments against the function and builds the model that
//! `expand` generates from. Pure checks: nothing here emits code.
//!
//! Each concern is a file of its own: `args` checks the arguments' values,
//! `returns` reads the return type, `params` sorts the parameters, `paths`
//! resolves the key's and the fingerprint's paths, and `batch` tells a batch
//! handler.

use idem_grammar::FingerprintExpr;
use syn::ItemFn;
use syn::ext::IdentExt;

use crate::attr::Args;
use crate::ctxt::Ctxt;
use crate::model::{DEFAULT_LEASE, Handler, Mode, Param, Shape, Stub};
use crate::types::{future_output, mut_referent, written};

mod args;
mod batch;
mod params;
mod paths;
mod returns;

use args::{duration, handler_name, max_attempts, missing_arguments, store};
use batch::batch;
use params::params;
use paths::{fingerprint, key, roots};
use returns::return_types;

/// The model when nothing was wrong enough to stop generation, and the stub
/// to emit otherwise (errors are in `cx` either way).
pub(crate) struct Checked {
    pub(crate) handler: Option<Handler>,
    pub(crate) stub: Stub,
}

/// Checks everything.
pub(crate) fn check(cx: &mut Ctxt, args: &Args, func: &ItemFn) -> Checked {
    let sig = &func.sig;
    // A `fn` returning a future of its result is one mistake, not also a
    // return type that is no `Result`: its result is the future's `Output`.
    let future = match (&sig.asyncness, &sig.output) {
        (None, syn::ReturnType::Type(_, ty)) => future_output(ty),
        _ => None,
    };
    match (&sig.asyncness, future) {
        (Some(_), _) => {}
        (None, Some(output)) => cx.error_spanned_by(
            sig.fn_token,
            format!(
                "#[idempotent] needs an `async fn`, and this `fn` returns a future: write `async fn {}(..) -> {}` and make the body of its `async` block the function's body (the claim and the record are awaited around it)",
                sig.ident.unraw(),
                written(output),
            ),
        ),
        (None, None) => cx.error_spanned_by(
            sig.fn_token,
            "#[idempotent] needs an `async fn`: the claim and the record are awaited around the body",
        ),
    }
    if let Some(c) = &sig.constness {
        cx.error_spanned_by(c, "an idempotent handler cannot be `const`");
    }
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(v, "an idempotent handler cannot be variadic");
    }

    missing_arguments(cx, args);
    let store = args.store.as_ref().and_then(|lit| store(cx, lit));
    let ttl = args.ttl.as_ref().and_then(|lit| duration(cx, lit, "ttl"));
    let lease = match &args.lease {
        Some(lit) => duration(cx, lit, "lease"),
        None => Some(DEFAULT_LEASE),
    };
    let name = match &args.name {
        Some(lit) => handler_name(cx, lit),
        None => Some(sig.ident.to_string().trim_start_matches("r#").to_owned()),
    };
    let krate = match &args.krate {
        Some(lit) => {
            match lit.parse::<syn::Path>() {
                Ok(p) => Some(p),
                Err(_) => {
                    cx.error_spanned_by(lit, "`crate` takes a path, e.g. crate = \"my_idem\" or crate = \"::idem_runtime\"");
                    None
                }
            }
        }
        None => Some(syn::parse_quote!(::idem_runtime)),
    };

    let result_types = match future {
        Some(output) => return_types(
            cx,
            &syn::ReturnType::Type(Default::default(), Box::new(output.clone())),
            &sig.ident,
        ),
        None => return_types(cx, &sig.output, &sig.ident),
    };
    let max_attempts = args.max_attempts.as_ref().and_then(|e| max_attempts(cx, e));

    // The names the key's and the fingerprint's paths start with: a
    // parameter they read from is a message, whatever its type is called.
    let key_roots: Vec<String> = args
        .key
        .as_ref()
        .and_then(|lit| idem_grammar::parse_key(&lit.value()).ok())
        .into_iter()
        .chain(args.fingerprint.as_ref().and_then(|lit| {
            match idem_grammar::parse_fingerprint(&lit.value()) {
                Ok(FingerprintExpr::Parts(expr)) => Some(expr),
                _ => None,
            }
        }))
        .flat_map(|expr| roots(&expr))
        .collect();
    let sig_parts = params(
        cx,
        func,
        krate.as_ref().unwrap_or(&syn::parse_quote!(::idem_runtime)),
        &key_roots,
    );

    if let (Some(_), Some(lit)) = (&sig_parts.tx_param, &args.lease) {
        cx.error_spanned_by(
            lit,
            "`lease` has no meaning in transaction mode: the open transaction holds the claim until it commits or rolls back; remove `lease`, or remove the transaction parameter to run in lease mode",
        );
    }

    let lease_outbox = sig_parts.tx_param.is_none() && sig_parts.outbox_param.is_some();
    if let (None, Some(outbox)) = (&sig_parts.tx_param, &sig_parts.outbox_param) {
        cx.error_spanned_by(
            &outbox.ty,
            "an outbox stages messages in the handler's transaction, and a lease-mode handler has none: take the store's transaction first (`tx: &mut SqliteTx<'_>`, `&mut PgTx<'_>`, `&mut MySqlTx<'_>`), or take `key: &Key` and derive the ids of a direct publish with `idem_runtime::outbox::MessageIds`",
        );
    }

    // A key reads messages, which a handler takes by value or by shared
    // reference; a `&mut` parameter is state of the body (or a transaction
    // out of place, which the runtime reports), unless all its parameters
    // are `&mut`.
    let all_mut = sig_parts
        .params
        .iter()
        .all(|p| mut_referent(&p.arg.ty).is_some());
    let messages: Vec<Param> = sig_parts
        .params
        .iter()
        .filter(|p| all_mut || mut_referent(&p.arg.ty).is_none())
        .map(|p| Param {
            arg: p.arg.clone(),
            ident: p.ident.clone(),
        })
        .collect();
    let key = args
        .key
        .as_ref()
        .and_then(|lit| key(cx, lit, &messages, sig_parts.receiver.is_some()));
    let fingerprint = args
        .fingerprint
        .as_ref()
        .map(|lit| fingerprint(cx, lit, &messages, sig_parts.receiver.is_some()));

    let batch = batch(
        cx,
        &messages,
        key.as_deref(),
        args.key.is_some(),
        sig_parts.key_param.as_ref(),
        sig_parts.outbox_param.as_ref(),
        args.max_attempts.as_ref(),
    );

    let stub = Stub {
        func: func.clone(),
        krate: krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::idem_runtime)),
        store: store.clone(),
        tx_param: sig_parts.tx_param.clone(),
        receiver: sig_parts.receiver.clone(),
        params: sig_parts.params.iter().map(|p| p.arg.clone()).collect(),
        result: result_types.clone(),
        future: future.and(match &sig.output {
            syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
            syn::ReturnType::Default => None,
        }),
        batch: matches!(batch, Ok(Some(_)) | Err(true)),
    };
    let handler = (|| {
        let result = result_types?;
        Some(Handler {
            func: func.clone(),
            krate: krate?,
            name: name?,
            key_text: args.key.as_ref()?.value(),
            key: key?,
            key_span: args.key.as_ref()?.span(),
            ttl: ttl?,
            store: store?,
            fingerprint: match fingerprint {
                Some(checked) => Some(checked?),
                None => None,
            },
            mode: match sig_parts.tx_param {
                Some(param) => Mode::Tx { param },
                None => Mode::Lease { lease: lease? },
            },
            shape: match batch.ok()? {
                Some(batch) => Shape::Batch(Box::new(batch)),
                None => Shape::Single {
                    key_param: sig_parts.key_param,
                    outbox_param: match (lease_outbox, sig_parts.outbox_param) {
                        (true, _) => return None,
                        (false, outbox) => outbox,
                    },
                    max_attempts: match &args.max_attempts {
                        Some(_) => Some(max_attempts?),
                        None => None,
                    },
                },
            },
            receiver: sig_parts.receiver,
            params: sig_parts.params,
            ok_ty: result.ok,
            err_ty: result.err,
            ret_ty: result.written,
        })
    })();
    Checked { handler, stub }
}
