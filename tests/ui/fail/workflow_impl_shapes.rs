//! Impl blocks and step markers `#[workflow]` cannot take: one error each.

use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order<T>(T);

// A generic type's instance.
#[workflow]
impl Order<u8> {
    #[step(start)]
    async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

trait Priced {}

// Not a named type.
#[workflow]
impl dyn Priced {
    #[step(start)]
    async fn charge() -> Result<Transition<PricedStep>, StepError> {
        Ok(Transition::done(()))
    }
}

#[derive(Default)]
struct Refund;

#[workflow]
impl Refund {
    // A marker on a const, two markers on a fn, a marker with `=`.
    #[step]
    const LIMIT: u32 = 3;

    #[step(start)]
    #[step(name = "check")]
    async fn check() -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::next(RefundStep::Pay {}))
    }

    #[step = "pay"]
    async fn pay() -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::next(RefundStep::Notify {}))
    }

    // No return type; a return type that borrows.
    #[step]
    async fn notify() {}

    #[step]
    async fn close<'a>(reason: &'a str) -> Result<Transition<RefundStep>, &'a str> {
        Err(reason)
    }
}

fn main() {}
