use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

/// The user's own `WfInput`, beside the input struct `#[workflow]` generates.
pub struct WfInput;

struct Wf;

#[workflow]
impl Wf {
    #[step(start)]
    async fn only() -> Result<Transition<WfStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {
    let _ = WfInput;
}
