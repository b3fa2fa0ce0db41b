use taquba_workflow::workflow;
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::StepError;

struct Order {
    charged: u32,
}

#[workflow(output = u32)]
impl Order {
    // The workflow value is shared by concurrent runs: `&mut self` is refused.
    #[step(start)]
    async fn charge(&mut self, order_id: String) -> Result<Transition<OrderStep>, StepError> {
        self.charged += 1;
        Ok(Transition::next(OrderStep::Ship { order_id }))
    }

    #[step]
    async fn ship(&self, ctx: StepContext<'_>, order_id: String) -> Result<Transition<OrderStep>, StepError> {
        let _ = (ctx, order_id);
        Ok(Transition::done(self.charged))
    }
}

fn main() {}
