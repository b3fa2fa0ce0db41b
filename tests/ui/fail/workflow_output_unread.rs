//! An output option that was meant but could not be read (misspelt and
//! written as a list, written as a list, or under a name close to nothing):
//! one error each. The steps finish with a `u32`, which no stand-in output
//! would be checked against (the default `()` would not match).

use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Listed;

#[workflow(outptu(u32))]
impl Listed {
    #[step(start)]
    async fn count(n: u32) -> Result<Transition<ListedStep>, StepError> {
        Ok(Transition::done(n))
    }
}

struct Spelt;

#[workflow(output(u32))]
impl Spelt {
    #[step(start)]
    async fn count(n: u32) -> Result<Transition<SpeltStep>, StepError> {
        Ok(Transition::done(n))
    }
}

struct Named;

#[workflow(result = u32)]
impl Named {
    #[step(start)]
    async fn count(n: u32) -> Result<Transition<NamedStep>, StepError> {
        Ok(Transition::done(n))
    }
}

fn main() {
    let _ = (ListedInput { n: 1 }, SpeltInput { n: 2 }, NamedInput { n: 3 });
}
