use taquba_workflow::workflow;
use taquba_workflow::workflows::Transition;
use taquba_workflow::StepError;

struct Order<T>(T);

#[workflow]
impl<T> Order<T>
where
    T: Send + Sync + 'static,
{
    #[step(start)]
    async fn charge() -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::done(()))
    }
}

fn main() {}
