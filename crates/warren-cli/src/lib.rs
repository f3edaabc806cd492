//! The `warren` command's parts, shared with `warren-bench`: one module per subcommand
//! ([`commands`]), latency statistics ([`stats`]) and plain-text tables ([`table`]).

pub mod commands;
pub mod stats;
pub mod table;
