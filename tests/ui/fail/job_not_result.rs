use taquba_workflow::job;

#[job]
async fn count(items: Vec<u32>) -> usize {
    items.len()
}

#[job]
async fn nothing(items: Vec<u32>) {
    let _ = items;
}

fn main() {}
