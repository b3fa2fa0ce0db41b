use taquba_workflow::workflows::step;

struct Order;

impl Order {
    #[step]
    async fn charge(&self) {}
}

fn main() {}
