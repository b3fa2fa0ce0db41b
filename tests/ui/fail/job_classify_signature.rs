use taquba_workflow::{StepErrorKind, job};

fn classify(error: String) -> StepErrorKind {
    let _ = error;
    StepErrorKind::Permanent
}

#[job(classify = classify)]
async fn fails(day: u32) -> Result<u32, String> {
    Err(format!("day {day}"))
}

fn main() {}
