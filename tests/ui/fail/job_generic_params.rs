use taquba_workflow::job;

#[job]
async fn generic<T: serde::Serialize>(value: T) -> Result<(), std::io::Error> {
    let _ = value;
    Ok(())
}

#[job]
async fn impl_trait(name: impl Into<String>) -> Result<(), std::io::Error> {
    let _ = name.into();
    Ok(())
}

fn main() {}
