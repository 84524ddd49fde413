//! `wq`: the workqueue command line.

fn main() {}
