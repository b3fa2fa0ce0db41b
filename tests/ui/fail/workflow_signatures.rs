use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::{Step, StepError};

struct Order;

#[workflow(outptu = u32)]
impl Order {
    #[step(start, begin)]
    fn charge(&mut self, (a, b): (u32, u32)) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(a + b))
    }

    #[step]
    async fn ship(step: &Step, order: Self) -> u32 {
        let _ = (step, order);
        0
    }
}

fn main() {}
