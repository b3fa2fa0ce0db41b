use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

/// The user's own `WfStep` (a status for a dashboard, say), beside the step
/// enum `#[workflow]` generates for `Wf`; the steps are written as the docs
/// show, naming `WfStep` for the generated enum.
///
/// `#[workflow]` reports the collision once, at `impl Wf`, naming the
/// option that renames the enum. In the impl block `WfStep` still means the
/// generated enum, so the step fns (`WfStep::Ship { .. }`,
/// `Transition::done(..)`) are not reported on top; `main` below means the
/// user's.
pub enum WfStep {
    Charging,
    Shipping,
}

struct Wf;

#[workflow(output = String)]
impl Wf {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<WfStep>, StepError> {
        Ok(Transition::next(WfStep::Ship { order_id }))
    }

    #[step]
    async fn ship(order_id: String) -> Result<Transition<WfStep>, StepError> {
        Ok(Transition::done(order_id))
    }
}

fn main() {
    let _ = (WfStep::Charging, WfStep::Shipping);
}
