use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;

struct Order;

struct MyError;

#[workflow(output = u32)]
impl Order {
    #[step(start)]
    async fn charge() -> Result<Transition<OrderStep>, MyError> {
        Ok(Transition::done(1))
    }

    #[step]
    async fn ship() -> Result<u32, taquba_workflow::StepError> {
        Ok(1)
    }
}

fn main() {}
