use taquba_workflow::job;

struct NotSerde;

#[derive(serde::Serialize, serde::Deserialize)]
struct NotClone(u32);

#[job]
async fn bounds(a: NotSerde, b: NotClone, c: &NotClone) -> Result<NotSerde, String> {
    let _ = (a, b, c);
    Ok(NotSerde)
}

fn main() {}
