use taquba_workflow::job;

#[job]
async fn generic<T>(value: T) -> Result<(), std::io::Error>
where
    T: serde::Serialize + Clone,
{
    let _ = value;
    Ok(())
}

fn main() {}
