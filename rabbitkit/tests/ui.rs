//! Compile tests of `#[subscriber]`: every key compiles and means what the builder means;
//! every mistake is a compile error on the offending token (snapshots in `ui/fail`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
