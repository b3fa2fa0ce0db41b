//! Option values of the right kind that cannot be right: one error each,
//! at the value.

use taquba_workflow::job;

// A suffix other than `u32`.
#[job(max_attempts = 5u8)]
async fn suffixed(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

// Whitespace at an end of a stored name.
#[job(name = " email.send")]
async fn spaced(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

// An empty key: it would be the key of every job that wrote it. (A
// constant key, `key = "report"`, is a singleton job, and accepted.)
#[job(key = "")]
async fn empty_key(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

// Serde's derives, which the struct always has.
#[derive(Debug)]
struct Unused;

#[job(derive(Debug, serde::Serialize))]
async fn serde_derive(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

fn main() {}
