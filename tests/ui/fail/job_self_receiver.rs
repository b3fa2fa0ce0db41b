use taquba_workflow::job;

struct Mailer;

impl Mailer {
    #[job]
    async fn send(&self, to: String) -> Result<(), std::io::Error> {
        let _ = to;
        Ok(())
    }
}

fn main() {}
