use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;

struct Order;

#[workflow]
impl Order {
    // The transition without the `Result`.
    #[step(start)]
    async fn charge(order_id: String) -> Transition<OrderStep> {
        let _ = order_id;
        Transition::done(())
    }
}

fn main() {}
