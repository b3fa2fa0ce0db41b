use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

/// The user's own `WfStep`, beside the step enum `#[workflow]` generates.
pub struct WfStep;

struct Wf;

#[workflow]
impl Wf {
    #[step(start)]
    async fn only() -> Result<Transition<WfStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {
    let _ = WfStep;
}
