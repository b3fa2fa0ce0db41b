use taquba_workflow::job;

#[job(key = "email:{to}:{subjet}")]
async fn send(to: String, subject: String) -> Result<(), std::io::Error> {
    let _ = (to, subject);
    Ok(())
}

fn main() {}
