//! `warren`: the command-line front end of a Warren node.

fn main() {}
