//! A `classify` closure of the wrong signature: one error, at the closure,
//! naming the expected `fn(&E) -> StepErrorKind`.

use taquba_workflow::{StepErrorKind, job};

#[job(classify = |error: String| if error.is_empty() { StepErrorKind::Permanent } else { StepErrorKind::Transient })]
async fn by_value(day: u32) -> Result<u32, String> {
    Err(format!("day {day}"))
}

fn main() {}
