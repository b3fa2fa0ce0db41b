use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship { order_id }))
    }

    #[step]
    async fn ship(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(()))
    }
}

// The input as the user meant it (the first step's parameters): not reported
// on top of the missing `start`.
fn main() {
    let _ = OrderInput { order_id: String::new() };
}
