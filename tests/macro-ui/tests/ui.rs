//! Compile-time behaviour of `#[idempotent]`: every misuse the macro can see
//! is a compile error on the offending token (`ui/fail`), checked here with
//! trybuild. The supported shapes of handlers (`ui/pass`) are test targets
//! of this package, each a program of its own (see Cargo.toml): built with
//! the workspace's other targets, not by trybuild, which would otherwise
//! build every dependency a second time in full.
//!
//! Regenerate the expected output after an intended change with
//! `TRYBUILD=overwrite cargo test -p idem-macro-ui --test ui`, then read every
//! changed `.stderr` as a user would.

use std::path::Path;

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
}

/// Every case in `ui/pass` is a test target in Cargo.toml, so that none is
/// left out of the build without a word.
#[test]
fn every_passing_case_is_a_target() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("read Cargo.toml");
    let mut missing = Vec::new();
    let mut cases = 0;
    for entry in std::fs::read_dir(dir.join("ui/pass")).expect("read ui/pass") {
        let name = entry.expect("an entry of ui/pass").file_name();
        let name = name.to_string_lossy();
        if !name.ends_with(".rs") {
            continue;
        }
        cases += 1;
        if !manifest.contains(&format!("path = \"ui/pass/{name}\"")) {
            missing.push(name.into_owned());
        }
    }
    assert!(cases > 0, "no case found in ui/pass");
    assert!(
        missing.is_empty(),
        "cases in ui/pass with no [[test]] target in tests/macro-ui/Cargo.toml: {missing:?}"
    );
}
