use taquba_workflow::job;

struct Summary;

#[job]
async fn report(day: u32) -> Result<Summary, String> {
    let _ = day;
    Ok(Summary)
}

fn main() {}
