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

#[job]
async fn sized<const N: usize>(value: u32) -> Result<(), std::io::Error> {
    let _ = (value, N);
    Ok(())
}

fn main() {}
