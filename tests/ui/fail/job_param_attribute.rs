use taquba_workflow::job;

#[job]
async fn send(#[serde(rename = "t")] to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

fn main() {}
