//! A generated name derived from a fn's name that is not an identifier:
//! one error at the fn's name, saying how to name it instead.

use taquba_workflow::job;
use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

// `_1st` in PascalCase is `1st`.
#[job]
async fn _1st(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

// `self_` in PascalCase is the keyword `Self`.
#[job]
async fn self_(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[derive(Default)]
struct Order;

#[workflow]
impl Order {
    #[step(start)]
    async fn _2nd() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
