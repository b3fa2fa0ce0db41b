use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;

struct Opaque;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn charge() -> Result<Transition<OrderStep>, Opaque> {
        Err(Opaque)
    }
}

fn main() {}
