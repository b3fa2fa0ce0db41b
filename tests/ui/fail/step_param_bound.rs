use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Connection;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn charge(order_id: String, connection: Connection) -> Result<Transition<OrderStep>, StepError> {
        let _ = (order_id, connection);
        Ok(Transition::done(()))
    }
}

fn main() {}
