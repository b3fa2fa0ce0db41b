use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order;

// A version that is not a string, a duplicate option, and patches that are
// not distinct string literals: one error each.
#[workflow(version = 2, version = "2.0.0", patches = ["skip-slack-post", "skip-slack-post", 3])]
impl Order {
    #[step(start)]
    async fn charge(order_id: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(drop(order_id)))
    }
}

struct Invoice;

// `patches` takes a list, and a version cannot be empty.
#[workflow(version = "", patches = "skip-slack-post")]
impl Invoice {
    #[step(start)]
    async fn send(invoice_id: String) -> Result<Transition<InvoiceStep>, StepError> {
        Ok(Transition::done(drop(invoice_id)))
    }
}

fn main() {}
