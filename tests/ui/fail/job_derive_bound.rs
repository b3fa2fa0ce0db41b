use taquba_workflow::job;

#[derive(serde::Serialize, serde::Deserialize)]
struct Token(u32);

// `derive(Clone)` asked of a struct whose field is not `Clone`: one error,
// on the parameter.
#[job(derive(Clone))]
async fn send(token: &Token) -> Result<(), std::io::Error> {
    let _ = token;
    Ok(())
}

fn main() {}
