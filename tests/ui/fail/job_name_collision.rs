use taquba_workflow::job;

/// The user's own `Tick`, beside the struct `#[job]` generates for `tick`.
pub struct Tick;

#[job]
async fn tick() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    let _ = Tick;
}
