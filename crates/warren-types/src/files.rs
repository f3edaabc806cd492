//! File call types: stat, list, mkdir, chmod. Read/write/upload/download are raw byte streams.

use serde::{Deserialize, Serialize};

/// Most entries one page of a directory listing returns (`limit`).
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Entries of a listing page when the request names no `limit`.
pub const DEFAULT_LIST_ENTRIES: usize = 1_000;
/// A listing page stops early once its entries take about this many bytes, so that no answer
/// grows with the directory.
pub const MAX_LIST_BYTES: usize = 8 << 20;

/// One page of `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirPage {
    /// Entries in byte order of their names.
    pub entries: Vec<FileStat>,
    /// Present when more entries follow: pass it as `after` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Metadata of one path inside a sandbox (symlinks are not followed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileStat {
    /// Base name for list entries, full path for stat.
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`0o7777` part of st_mode).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    #[serde(default)]
    pub parents: bool,
    #[serde(default)]
    pub mode: Option<u32>,
}

/// `POST /v1/sandboxes/{id}/files/chmod`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChmodRequest {
    pub path: String,
    pub mode: u32,
}
