use taquba_workflow::jobs::JobContext;
use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    // A job's context in a step.
    #[step(start)]
    async fn charge(ctx: JobContext<'_>, order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = (ctx, order_id);
        Ok(Transition::done(()))
    }
}

fn main() {}
