//! Directory copies as tar streams: `ReadTar` packs a file or a directory tree (regular files,
//! directories and symlinks, with modes and mtimes; other kinds are skipped) into a ustar/GNU
//! stream sent as credit-limited STDOUT frames; `WriteTar` unpacks the STDIN frames of such a
//! stream under a directory as they arrive.
//!
//! Unpacking never writes outside its destination: an entry naming `..` or an absolute path
//! is refused, no entry is written through a symlink (one in the archive or one already
//! there), and a hard link may only point at a path inside the destination. The agent's root
//! is the sandbox's root, so even a bypass could not reach the host; these checks keep an
//! archive from landing somewhere in the sandbox its sender did not name. Files are owned by
//! the agent's user (root in the sandbox), like `docker cp`; the size is bounded by the
//! sandbox's own disk.
//!
//! `pack` is the reading side, `unpack` the writing side.

mod pack;
#[cfg(test)]
mod tests;
mod unpack;

use std::path::Path;
use warren_proto::Event;
use warren_types::ErrorCode;

pub use pack::read;
pub use unpack::write;

const BLOCK: usize = 512;
const CHUNK: usize = 256 * 1024;

fn io_event(path: &Path, e: &std::io::Error) -> Event {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => ErrorCode::NotFound,
        _ => ErrorCode::FileError,
    };
    Event::error(code, format!("{}: {e}", path.display()))
}

fn bad_entry(name: &str, why: &str) -> Event {
    Event::error(ErrorCode::InvalidPath, format!("tar entry {name:?}: {why}"))
}
