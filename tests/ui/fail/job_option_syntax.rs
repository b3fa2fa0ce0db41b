//! Option lists that do not parse: one error at each malformed entry, and
//! the entries after it still read.

use taquba_workflow::job;

#[job(name)]
async fn no_value(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(derive = Debug)]
async fn not_a_list(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(name = "")]
async fn empty_name(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(name = "email\u{7}send")]
async fn control_character(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(max_attempts = 10000000000)]
async fn too_many_attempts(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job("email.send")]
async fn no_option_name(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(name = , max_attempts = 3)]
async fn missing_value(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(name "email.send", max_attempts = 3)]
async fn missing_equals(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

#[job(derive(Debug) max_attempts = 3)]
async fn missing_comma(n: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

fn main() {}
