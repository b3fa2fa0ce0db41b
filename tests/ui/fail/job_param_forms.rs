//! Parameters a job cannot store: one error each, at the token to change.

use taquba_workflow::job;
use taquba_workflow::jobs::JobContext;

#[job]
async fn two_contexts(ctx: JobContext<'_>, again: &JobContext<'_>) -> Result<(), std::io::Error> {
    let _ = (ctx, again);
    Ok(())
}

#[job]
async fn by_ref_binding(ref name: String) -> Result<(), std::io::Error> {
    let _ = name;
    Ok(())
}

#[job]
async fn at_pattern(n @ _: u32) -> Result<u32, std::io::Error> {
    Ok(n)
}

// `_` in a fn signature is refused by rustc too: its error is the second.
#[job]
async fn inferred(items: Vec<_>) -> Result<(), std::io::Error> {
    let _: &Vec<u8> = &items;
    Ok(())
}

#[job]
async fn unique_borrow(count: &mut u32) -> Result<(), std::io::Error> {
    *count += 1;
    Ok(())
}

#[job]
async fn nested_reference(name: &&str) -> Result<(), std::io::Error> {
    let _ = name;
    Ok(())
}

#[job]
async fn borrowing_field<'a>(name: std::borrow::Cow<'a, str>) -> Result<(), std::io::Error> {
    let _ = name;
    Ok(())
}

#[job]
async fn borrowed_output<'a>(name: &'a str) -> Result<&'a str, std::io::Error> {
    Ok(name)
}

#[job]
async fn context_by_ref_binding(ref ctx: JobContext<'_>) -> Result<(), std::io::Error> {
    let _ = ctx;
    Ok(())
}

fn main() {}
