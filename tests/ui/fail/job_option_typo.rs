use taquba_workflow::job;

// A misspelt `idempotent` beside `key`: the typo only, not a clash of the
// two options on top.
#[job(key = "send:{to}", idempotnet)]
async fn send(to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

fn main() {}
