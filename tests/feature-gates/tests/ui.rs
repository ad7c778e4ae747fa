//! With idem-runtime's store features off, naming a store is a compile error
//! that says which feature to turn on.

#[test]
fn store_features_off() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
