use taquba_workflow::job;

#[job(nmae = "a", name = "b", name = "c", max_attempts = 0, retries = 3, key = "k:{x}", idempotent)]
async fn options(x: u32) -> Result<u32, std::io::Error> {
    Ok(x)
}

fn main() {}
