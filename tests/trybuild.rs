//! Compile-time tests of `#[job]` and `#[workflow]`: every case under
//! `tests/ui/fail` must fail with the reviewed `.stderr` beside it, and
//! every case under `tests/ui/pass` must compile.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
