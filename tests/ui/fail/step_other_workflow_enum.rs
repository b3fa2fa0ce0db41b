use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Refund;

#[workflow]
impl Refund {
    #[step(start)]
    async fn refund(order_id: String) -> Result<Transition<RefundStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(()))
    }
}

struct Order;

#[workflow]
impl Order {
    // Returns a transition of another workflow's step enum.
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::next(RefundStep::Refund { order_id }))
    }
}

fn main() {}
