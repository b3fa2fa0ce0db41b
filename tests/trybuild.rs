//! Compile-time tests of `#[job]` and `#[workflow]`: every case under
//! `tests/ui/fail` must fail with the reviewed `.stderr` beside it. The
//! cases that must compile live in `tests/macros_hygiene.rs` and the other
//! `macros_*` tests, built with the rest of the suite; keeping this suite
//! fail-only lets trybuild type-check its cases (`cargo check`) instead of
//! building the whole dependency tree a second time.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}
