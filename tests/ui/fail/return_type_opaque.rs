//! `impl Trait` in a job's or a step's return type: the job's types are
//! decoded by its caller and a step's error is converted by name, so each
//! is one error asking for the named type.

use taquba_workflow::{job, workflow, StepError};
use taquba_workflow::workflows::Transition;

#[job]
async fn opaque(n: u32) -> Result<impl serde::Serialize, std::io::Error> {
    Ok(n)
}

#[derive(Default)]
struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn only() -> Result<Transition<OrderStep>, impl std::fmt::Display> {
        Err::<Transition<OrderStep>, _>(StepError::permanent("x").to_string())
    }
}
fn main() {}
