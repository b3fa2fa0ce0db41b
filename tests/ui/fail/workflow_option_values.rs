use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

// Quoted values, and an option misspelt: one error each, and the code below
// (which uses them as meant) is not reported on top.
#[workflow(outptu = u32, step_enum = "Steps", input = "Start", vis = "pub(crate)")]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<Steps>, StepError> {
        Ok(Transition::next(Steps::Ship { order_id }))
    }

    #[step]
    async fn ship(order_id: String) -> Result<Transition<Steps>, StepError> {
        Ok(Transition::done(order_id.len() as u32))
    }
}

fn main() {
    let _ = Start { order_id: String::new() };
}
