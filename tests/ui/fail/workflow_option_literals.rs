//! Workflow and step options of the right kind that cannot be right: one
//! error each, and no stand-in types when the output cannot be one.

use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

#[derive(Default)]
struct Order;

#[workflow(name = "order ", derive(Debug, Deserialize))]
impl Order {
    // `/` separates a step's name from its memo keys.
    #[step(start, name = "charge/v2")]
    async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

#[derive(Default)]
struct Report;

// An output that borrows.
#[workflow(output = &str)]
impl Report {
    #[step(start)]
    async fn only() -> Result<Transition<ReportStep>, StepError> {
        Ok(Transition::done("done"))
    }
}

#[derive(Default)]
struct Summary;

// An output that names no type.
#[workflow(output = impl serde::Serialize)]
impl Summary {
    #[step(start)]
    async fn only() -> Result<Transition<SummaryStep>, StepError> {
        Ok(Transition::done(3))
    }
}

fn main() {}
