use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Shipp { order_id }))
    }

    #[step]
    async fn ship(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(()))
    }
}

fn main() {}
