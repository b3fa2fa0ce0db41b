//! A generic step fn: one error, on its generics, saying "generic".

use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn charge<T: serde::Serialize>(value: T) -> Result<Transition<OrderStep>, StepError> {
        let _ = value;
        Ok(Transition::next(OrderStep::Ship { count: 1 }))
    }

    #[step]
    async fn ship<const N: usize>(count: u32) -> Result<Transition<OrderStep>, StepError> {
        let _ = (count, N);
        Ok(Transition::done(()))
    }
}

fn main() {}
