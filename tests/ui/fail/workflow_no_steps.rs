use taquba_workflow::workflow;

struct Order;

#[workflow]
impl Order {
    fn helper(&self) {}
}

fn main() {}
