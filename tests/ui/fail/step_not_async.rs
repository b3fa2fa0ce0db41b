use taquba_workflow::workflow;
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::StepError;

struct Order;

#[workflow(output = usize)]
impl Order {
    #[step(start)]
    fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship { order_id }))
    }

    #[step]
    async fn ship(ctx: StepContext<'_>, order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = ctx;
        Ok(Transition::done(order_id.len()))
    }
}

fn main() {}
