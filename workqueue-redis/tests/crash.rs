//! Crash tests (placeholder).

fn main() {}
