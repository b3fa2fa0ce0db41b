//! The `parent_child` example as a binary, so the kill -9 test
//! (`tests/runtime/children.rs`) can run it, kill it mid-child and run it
//! again on the same store.

#[path = "../../examples/parent_child.rs"]
mod parent_child;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    parent_child::main()
}
