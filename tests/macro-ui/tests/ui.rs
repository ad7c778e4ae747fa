//! Compile-time behaviour of `#[idempotent]`: every misuse the macro can see
//! is a compile error on the offending token (`ui/fail`), and the supported
//! shapes of handlers compile and can be called as rewritten (`ui/pass`).
//!
//! Regenerate the expected output after an intended change with
//! `TRYBUILD=overwrite cargo test -p idem-macro-ui --test ui`, then read every
//! changed `.stderr` as a user would.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
