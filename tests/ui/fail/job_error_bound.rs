use taquba_workflow::job;

struct Failed;

#[job]
async fn fails(day: u32) -> Result<u32, Failed> {
    Err(Failed).map(|()| day)
}

fn main() {}
