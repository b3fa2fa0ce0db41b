//! Qualifiers an `async fn` job or step cannot have: one error each, and
//! none from rustc on top (the fn is re-emitted without them).

use taquba_workflow::job;
use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

#[job]
const async fn constant(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job]
async extern "C" fn external(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job]
async fn variadic(n: u32, rest: ...) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job]
async unsafe fn not_safe(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[derive(Default)]
struct Order;

#[workflow]
impl Order {
    #[step(start)]
    const async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

#[derive(Default)]
struct Refund;

// `unsafe` on an inherent impl: rustc's parser reports it, and the
// expansion adds nothing on top.
#[workflow]
unsafe impl Refund {
    #[step(start)]
    async fn check() -> Result<Transition<RefundStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
