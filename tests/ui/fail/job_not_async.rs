use taquba_workflow::job;

#[derive(Debug)]
struct E;
impl std::fmt::Display for E {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("e")
    }
}
impl std::error::Error for E {}

#[job]
fn not_async(x: u32) -> Result<u32, E> {
    Ok(x)
}

fn main() {}
