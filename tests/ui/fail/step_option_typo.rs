use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step(strat)]
    async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship {}))
    }

    #[step]
    async fn ship() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
