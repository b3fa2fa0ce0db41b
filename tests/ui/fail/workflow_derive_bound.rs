use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt;

struct Order;

// `derive(Debug)` asked of the generated types, and a step parameter that
// is not `Debug`: one error, on the parameter. (A parameter of the start
// step is a field of the input struct as well, and is reported for each of
// the two types.)
#[workflow(derive(Debug))]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship { order_id, receipt: Receipt }))
    }

    #[step]
    async fn ship(order_id: String, receipt: Receipt) -> Result<Transition<OrderStep>, StepError> {
        let _ = (order_id, receipt);
        Ok(Transition::done(()))
    }
}

fn main() {}
