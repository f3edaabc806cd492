//! File helpers every part of the store uses: digests, atomic writes, packing a directory
//! with `mkfs.erofs`, and the time stamps of records. Nothing here knows the store's layout.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

use crate::ImageError;

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn hex_of(digest: &str) -> Result<&str, ImageError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageError::BadRef(digest.to_string()))
}

pub(crate) fn seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs `mkfs.erofs` (uncompressed: reads of a shared layer cost no CPU) on `dir`.
/// With `preserve_mtime`, every file keeps its modification time (imported layers);
/// otherwise times are fixed at 0 so a directory always packs to the same digest.
pub(crate) fn mkfs(dir: &Path, out: &Path, preserve_mtime: bool) -> Result<(), ImageError> {
    let mut cmd = std::process::Command::new("mkfs.erofs");
    cmd.arg("--quiet")
        .arg("-U00000000-0000-0000-0000-000000000000");
    if preserve_mtime {
        cmd.arg("--preserve-mtime");
    } else {
        cmd.arg("-T0");
    }
    cmd.arg(out).arg(dir);
    // Through the reaper-safe `output`: the daemon collects every child with one reaper.
    let out_res = warren_sys::children::output(&mut cmd).map_err(|e| ImageError::Build {
        dir: dir.display().to_string(),
        message: format!("mkfs.erofs: {e} (install erofs-utils)"),
    })?;
    if !out_res.status.success() {
        let _ = std::fs::remove_file(out);
        return Err(ImageError::Build {
            dir: dir.display().to_string(),
            message: String::from_utf8_lossy(&out_res.stderr).trim().to_string(),
        });
    }
    Ok(())
}

pub(crate) fn sha256_file(p: &Path) -> Result<String, ImageError> {
    let mut f =
        std::fs::File::open(p).map_err(|e| ImageError::io(format!("open {}", p.display()), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| ImageError::io(format!("read {}", p.display()), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

pub(crate) fn write_atomic(p: &Path, data: &[u8]) -> Result<(), ImageError> {
    let tmp = p.with_extension(format!("tmp{}-{}", std::process::id(), seq()));
    std::fs::write(&tmp, data)
        .map_err(|e| ImageError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, p).map_err(|e| ImageError::io(format!("write {}", p.display()), e))
}
