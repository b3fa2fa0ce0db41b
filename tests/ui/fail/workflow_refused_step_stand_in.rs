//! Steps the macro refuses still have their variant, and a refused start
//! step still defines the input, as written: the code that names them is
//! not reported on top of the refusals.

use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

#[derive(Default)]
struct Order;

#[workflow(output = u32)]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::next(OrderStep::Ship { order_id, count: 1 }))
    }

    // Not async, and `&mut self`: two errors, and `OrderStep::Ship` above
    // still resolves.
    #[step]
    fn ship(&mut self, order_id: String, count: &mut u32) -> Result<Transition<OrderStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(*count))
    }
}

#[derive(Default)]
struct Refund;

#[workflow(output = u32)]
impl Refund {
    // An attribute that cannot be carried: one error, and `RefundInput`
    // still has the field.
    #[step(start)]
    async fn check(#[serde(rename = "id")] order_id: String) -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::next(RefundStep::Pay { order_id, cents: 1 }))
    }

    #[step]
    async fn pay(order_id: String, cents: u32) -> Result<Transition<RefundStep>, StepError> {
        let _ = order_id;
        Ok(Transition::done(cents))
    }
}

fn main() {
    let _ = RefundInput { order_id: String::new() };
}
