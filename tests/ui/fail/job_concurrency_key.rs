use taquba_workflow::job;

// A placeholder naming no parameter.
#[job(concurrency_key = "customer:{custmer}")]
async fn sync(customer: String) -> Result<(), std::io::Error> {
    let _ = customer;
    Ok(())
}

// A limit without a key: what would it be per?
#[job(limit = 2)]
async fn charge(card: String) -> Result<(), std::io::Error> {
    let _ = card;
    Ok(())
}

// A limit of 0 would never run the job.
#[job(concurrency_key = "{tenant}", limit = 0)]
async fn call_api(tenant: String) -> Result<(), std::io::Error> {
    let _ = tenant;
    Ok(())
}

// Keys may not hold a `/`, and may not be empty.
#[job(concurrency_key = "tenant/{tenant}")]
async fn export(tenant: String) -> Result<(), std::io::Error> {
    let _ = tenant;
    Ok(())
}

#[job(concurrency_key = "")]
async fn import(tenant: String) -> Result<(), std::io::Error> {
    let _ = tenant;
    Ok(())
}

fn main() {}
