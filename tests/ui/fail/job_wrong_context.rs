use taquba_workflow::job;
use taquba_workflow::workflows::StepContext;

// A workflow step's context in a job, by reference as well.
#[job]
async fn send(ctx: &StepContext<'_>, to: String) -> Result<(), std::io::Error> {
    let _ = (ctx, to);
    Ok(())
}

fn main() {}
