use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

/// The user's own `WfStep` (a status for a dashboard, say), beside the step
/// enum `#[workflow]` generates for `Wf`; the steps are written as the docs
/// show, naming `WfStep` for the generated enum.
///
/// `#[workflow]` reports the collision once, at `impl Wf`, naming the
/// option that renames the enum; the generated code adds nothing. The
/// step fns' own uses of `WfStep` as a step enum are errors of their own,
/// reported where they are: `WfStep::Ship { .. }` (this enum has no such
/// variant) and `Transition::done(..)` (whose output is found through the
/// step enum; rustc reports the call and its argument).
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
