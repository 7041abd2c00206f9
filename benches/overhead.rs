//! Placeholder until the overhead bench is written (issue 10).
fn main() {}
