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
///
/// Every file keeps its modification time: caches that check a source's time (Python's
/// bytecode, `make`) stay valid inside the sandbox; with times flattened to 0, every
/// `python3` start recompiled each module it imported, several times slower. The image's own
/// build time, the one thing that differs between two packings of the same tree, is then
/// pinned to 0 ([`pin_build_time`]), so a tree always packs to the same digest.
pub(crate) fn mkfs(dir: &Path, out: &Path) -> Result<(), ImageError> {
    let mut cmd = std::process::Command::new("mkfs.erofs");
    cmd.arg("--quiet")
        .arg("-U00000000-0000-0000-0000-000000000000")
        .arg("--preserve-mtime");
    cmd.arg(out).arg(dir);
    let fail = |message: String| {
        let _ = std::fs::remove_file(out);
        ImageError::Build {
            dir: dir.display().to_string(),
            message,
        }
    };
    // Through the reaper-safe `output`: the daemon collects every child with one reaper.
    let out_res = warren_sys::children::output(&mut cmd)
        .map_err(|e| fail(format!("mkfs.erofs: {e} (install erofs-utils)")))?;
    if !out_res.status.success() {
        return Err(fail(mkfs_error(&String::from_utf8_lossy(&out_res.stderr))));
    }
    pin_build_time(out).map_err(|e| fail(e.to_string()))
}

/// What `mkfs.erofs` said went wrong: its error lines (`<E> …`), not the usage text it
/// prints after some of them; a failure to open the output is this user's permission (or
/// space) on the store.
fn mkfs_error(stderr: &str) -> String {
    let errors: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.trim().strip_prefix("<E>"))
        .map(str::trim)
        .collect();
    let text = if errors.is_empty() {
        stderr.lines().next().unwrap_or("").trim().to_string()
    } else {
        errors.join("; ")
    };
    if text.contains("erofs_io: failed to open") {
        format!("mkfs.erofs cannot write the layer ({text}): the image store needs root (or write access)")
    } else {
        format!("mkfs.erofs: {text}")
    }
}

/// Where an EROFS superblock starts, its magic, and the compat flag of its checksum
/// (the on-disk format, `include/uapi/linux/erofs_fs.h` in the kernel).
const SB_OFFSET: u64 = 1024;
const SB_MAGIC: u32 = 0xE0F5_E1E2;
const COMPAT_SB_CHKSUM: u32 = 0x1;

/// Sets the superblock's build time (seconds at 24, nanoseconds at 32) to 0 and renews its
/// checksum. Files whose time equals the build time would be stored in compact inodes that
/// inherit it; with per-file times kept, `mkfs.erofs` gives those only to files whose time
/// matches the build time to the nanosecond, so none of them changes here in practice.
/// `mkfs.erofs` 1.5 (Debian 12) has no option that fixes only the build time.
fn pin_build_time(img: &Path) -> Result<(), PinError> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .map_err(|source| PinError::Open {
            img: img.to_path_buf(),
            source,
        })?;
    let mut head = [0u8; 16];
    f.read_exact_at(&mut head, SB_OFFSET)
        .map_err(PinError::Read)?;
    let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if le32(&head[0..4]) != SB_MAGIC {
        return Err(PinError::NoSuperblock);
    }
    let bits = head[12];
    if !(9..=16).contains(&bits) {
        return Err(PinError::BlockSize(bits));
    }
    // The checksum covers the rest of the superblock's block (all of it for blocks of
    // at most 1 KiB), as the kernel computes it.
    let block = 1usize << bits;
    let len = if block > SB_OFFSET as usize {
        block - SB_OFFSET as usize
    } else {
        block
    };
    let mut sb = vec![0u8; len];
    f.read_exact_at(&mut sb, SB_OFFSET)
        .map_err(PinError::Read)?;
    sb[24..36].fill(0);
    if le32(&sb[8..12]) & COMPAT_SB_CHKSUM != 0 {
        sb[4..8].fill(0);
        let sum = sb_checksum(&sb);
        sb[4..8].copy_from_slice(&sum.to_le_bytes());
    }
    f.write_all_at(&sb, SB_OFFSET).map_err(PinError::Write)
}

/// Why a packed layer's build time could not be pinned.
#[derive(Debug, thiserror::Error)]
enum PinError {
    #[error("open {}: {source}", img.display())]
    Open {
        img: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read the superblock: {0}")]
    Read(#[source] std::io::Error),
    #[error("write the superblock: {0}")]
    Write(#[source] std::io::Error),
    #[error("mkfs.erofs wrote no EROFS superblock")]
    NoSuperblock,
    #[error("unexpected EROFS block size 2^{0}")]
    BlockSize(u8),
}

/// The kernel's superblock checksum: CRC-32C seeded with all ones and without the final
/// inversion (`crc32c(~0, sb, len)` in `fs/erofs/super.c`), i.e. the complement of the
/// standard CRC-32C.
fn sb_checksum(sb: &[u8]) -> u32 {
    !crc32c::crc32c(sb)
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

#[cfg(test)]
mod mkfs_tests {
    #[test]
    fn mkfs_errors_are_one_line_without_the_usage_text() {
        let stderr = "mkfs.erofs 1.5\n<E> erofs_io: failed to open(/s/tmp/x.img).\nusage: [options] FILE DIRECTORY\n\nGenerate erofs image from DIRECTORY to FILE, and [options] are:\n -d#   set output message level\n";
        let m = super::mkfs_error(stderr);
        assert!(!m.contains('\n') && !m.contains("usage"), "{m}");
        assert!(m.contains("needs root"), "{m}");
        let m = super::mkfs_error(
            "<E> erofs: failed to parse source directory: [Error 2] No such file or directory\n",
        );
        assert_eq!(m, "mkfs.erofs: erofs: failed to parse source directory: [Error 2] No such file or directory");
    }
}
