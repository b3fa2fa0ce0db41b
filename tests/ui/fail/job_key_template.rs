//! Key templates that do not parse, or name what is not always a field.

use taquba_workflow::job;

#[job(key = "email:{to")]
async fn unclosed(to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

#[job(key = "email:to}")]
async fn unmatched(to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

#[job(key = "email:{}")]
async fn unnamed(to: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

#[job(key = "email:{to}:{cc}")]
async fn gated(to: String, #[cfg(any())] cc: String) -> Result<(), std::io::Error> {
    let _ = to;
    Ok(())
}

fn main() {}
