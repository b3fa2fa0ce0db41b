use taquba_workflow::job;

#[job(key = "email:{to}:{subjet}")]
async fn send(to: String, subject: String) -> Result<(), std::io::Error> {
    let _ = (to, subject);
    Ok(())
}

// A singleton job (a constant key is fine) whose key names a placeholder
// anyway: the placeholder is the mistake.
#[job(name = "reindex", key = "reindex:{scope}")]
async fn reindex() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {}
