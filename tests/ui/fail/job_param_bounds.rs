use taquba_workflow::job;

struct NotSerde;

#[derive(serde::Serialize, serde::Deserialize)]
struct NotClone(u32);

#[job]
async fn by_value(a: NotSerde) -> Result<(), String> {
    let _ = a;
    Ok(())
}

#[job]
async fn by_value_not_clone(b: NotClone) -> Result<(), String> {
    let _ = b;
    Ok(())
}

#[job]
async fn by_reference(c: &NotSerde) -> Result<(), String> {
    let _ = c;
    Ok(())
}

// A type of several tokens: one error too, spanning the whole type (the
// field's bound is checked once; its serialization and its clone for each
// attempt state no bound).
#[job]
async fn by_value_vec(items: Vec<NotSerde>) -> Result<usize, String> {
    Ok(items.len())
}

fn main() {}
