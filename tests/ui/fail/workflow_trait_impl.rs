use taquba_workflow::workflow;

struct Order;

#[workflow]
impl Clone for Order {
    fn clone(&self) -> Self {
        Order
    }
}

fn main() {}
