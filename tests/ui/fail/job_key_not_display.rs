//! A key template naming a field whose type has no `Display`: one error,
//! at the template.

use taquba_workflow::job;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Point {
    x: i32,
}

#[job(key = "point:{point}")]
async fn plot(point: Point) -> Result<i32, std::io::Error> {
    Ok(point.x)
}

fn main() {}
