use taquba_workflow::job;

#[job]
async fn count(items: Vec<u32>) -> usize {
    items.len()
}

#[job]
async fn nothing(items: Vec<u32>) {
    let _ = items;
}

// With `classify`, which is given the job's error: still one error, at the
// return type (not at `classify` too).
#[job(classify = classify)]
async fn classified(items: Vec<u32>) -> usize {
    items.len()
}

fn classify(_error: &std::io::Error) -> taquba_workflow::StepErrorKind {
    taquba_workflow::StepErrorKind::Permanent
}

fn main() {}
