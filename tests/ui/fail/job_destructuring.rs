use taquba_workflow::job;

#[job]
async fn sum((a, b): (u32, u32), _: u8) -> Result<u32, std::io::Error> {
    Ok(a + b)
}

fn main() {}
