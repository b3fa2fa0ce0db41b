//! The macros on items of the wrong shape: one error each, spanning the
//! item, saying what to write.

use taquba_workflow::{job, workflow};

#[job]
struct NotAFn;

#[workflow]
struct NotAnImpl;

fn main() {
    let _ = NotAFn;
    let _ = NotAnImpl;
}
