//! The expansions shown in the guide (`idem_runtime::guide::expansion`, which includes these files), kept honest: this test expands each
//! handler `tests/expanded/<name>.input.rs`, compares the result with
//! `tests/expanded/<name>.rs` and fails when they differ (`IDEM_BLESS=1`
//! rewrites the files).

fn check(name: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/expanded");
    let input = std::fs::read_to_string(format!("{dir}/{name}.input.rs")).expect("read the input");
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
        "expansion of {name} changed; rerun with IDEM_BLESS=1 (the guide includes the files as they are)"
    );
}

/// A handler in transaction mode, as in the tutorial.
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
