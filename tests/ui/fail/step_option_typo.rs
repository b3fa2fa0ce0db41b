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


struct Refund;

// A misspelt `start` beside a real one: the typo only, not "two start
// steps" on top.
#[workflow]
impl Refund {
    #[step(strat)]
    async fn check() -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::next(RefundStep::Pay {}))
    }

    #[step(start)]
    async fn pay() -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
