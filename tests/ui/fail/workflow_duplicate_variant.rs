use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn ship() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship {}))
    }

    // Also the variant `Ship`: one error, and `OrderStep::Ship {}` above
    // still means the first.
    #[step]
    async fn ship_() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
