use taquba_workflow::job;

// Each option with a value of the wrong kind: one error each, saying what
// to write.
#[job(max_attempts = "5", name = email, struct_name = "Email", idempotent = true, classify = "f")]
async fn send(to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

fn main() {}
