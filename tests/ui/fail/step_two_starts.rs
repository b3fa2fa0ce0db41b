use taquba_workflow::workflow;
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship { order_id }))
    }

    #[step(start)]
    async fn ship(ctx: StepContext<'_>, order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = (ctx, order_id);
        Ok(Transition::done(()))
    }
}

fn main() {
    let _ = OrderInput { order_id: String::new() };
}
