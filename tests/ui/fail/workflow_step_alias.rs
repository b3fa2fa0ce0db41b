use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

// Each stored name must lead to one step: an alias may not repeat a step's
// name or another alias, nor be its own step's name, nor hold a `/`.
#[workflow]
impl Order {
    #[step(start, alias = "pay")]
    async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship {}))
    }

    #[step(alias = "charge", alias = "pay", alias = "ship")]
    async fn ship() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Notify {}))
    }

    #[step(alias = "notify/v1", alias = "")]
    async fn notify() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
