use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Receipt;

struct Order;

#[workflow(output = Receipt)]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(Receipt))
    }
}

fn main() {}
