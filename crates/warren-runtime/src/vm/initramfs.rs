//! The guest's initramfs, built by the daemon from what it has: `warren-agent` as `/init`,
//! the shared libraries `ldd` names for it, and the guest kernel's modules in load order.
//!
//! Written as a `newc` cpio archive (uncompressed: the kernel unpacks it in a few ms, and a
//! compressor would cost more CPU under TCG than the copy). Named by the SHA-256 of its
//! content, so a rebuilt agent gives a new file and new templates.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use crate::RuntimeError;

/// One archive entry.
enum Entry {
    Dir(String),
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    CharDev {
        path: String,
        major: u32,
        minor: u32,
    },
}

/// A `newc` cpio writer.
#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn header(&mut self, name: &str, mode: u32, size: usize, rdev: (u32, u32)) {
        self.ino += 1;
        let namesize = name.len() + 1;
        let h = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino, mode, 0, 0, 1, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0
        );
        self.buf.extend_from_slice(h.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn add(&mut self, e: &Entry) {
        match e {
            Entry::Dir(p) => self.header(p, 0o040755, 0, (0, 0)),
            Entry::File { path, mode, data } => {
                self.header(path, 0o100000 | mode, data.len(), (0, 0));
                self.buf.extend_from_slice(data);
                self.pad();
            }
            Entry::CharDev { path, major, minor } => {
                self.header(path, 0o020600, 0, (*major, *minor))
            }
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.header("TRAILER!!!", 0, 0, (0, 0));
        self.buf
    }
}

/// The libraries the dynamic loader needs for `bin`, as absolute paths (from `ldd`).
async fn libraries(bin: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let text = match super::tool::run_str("/usr/bin/ldd", &[&bin.display().to_string()]).await {
        Ok(t) => t,
        // ldd fails on static executables.
        Err(_) => return Ok(Vec::new()),
    };
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// The agent without its debug sections when `strip` is there (a smaller archive unpacks
/// faster and takes less guest memory); as it is otherwise.
async fn stripped(agent: &Path) -> Result<Vec<u8>, RuntimeError> {
    let tmp = std::env::temp_dir().join(format!("warren-agent-strip-{}", unique()));
    let ok = super::tool::run_str(
        "/usr/bin/strip",
        &[
            "--strip-debug",
            "-o",
            &tmp.display().to_string(),
            &agent.display().to_string(),
        ],
    )
    .await
    .is_ok();
    let data = if ok { read(&tmp) } else { read(agent) };
    let _ = std::fs::remove_file(&tmp);
    data
}

/// A name no other build in this or another process uses at the same time.
fn unique() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{}-{n}", std::process::id())
}

fn read(p: &Path) -> Result<Vec<u8>, RuntimeError> {
    std::fs::read(p).map_err(|e| RuntimeError::io(format!("read {}", p.display()), e))
}

/// Builds the initramfs into `dir` (if not there yet) and returns its path.
pub async fn build(agent: &Path, kernel_dir: &Path, dir: &Path) -> Result<PathBuf, RuntimeError> {
    let mut entries = vec![
        Entry::Dir("dev".into()),
        Entry::CharDev {
            path: "dev/console".into(),
            major: 5,
            minor: 1,
        },
        Entry::Dir("proc".into()),
        Entry::Dir("sys".into()),
        Entry::Dir("newroot".into()),
        Entry::Dir("modules".into()),
        Entry::File {
            path: "init".into(),
            mode: 0o755,
            data: stripped(agent).await?,
        },
    ];
    let mut dirs: Vec<String> = Vec::new();
    for lib in libraries(agent).await? {
        let rel = lib.to_string_lossy().trim_start_matches('/').to_string();
        let mut parent = Path::new(&rel).parent();
        let mut chain = Vec::new();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            chain.push(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
        for d in chain.into_iter().rev() {
            if !dirs.contains(&d) {
                entries.push(Entry::Dir(d.clone()));
                dirs.push(d);
            }
        }
        // `read` follows symlinks: the archive holds the real file under the linked name.
        entries.push(Entry::File {
            path: rel,
            mode: 0o755,
            data: read(&lib)?,
        });
    }
    let order_path = kernel_dir.join("modules.order");
    let order = std::fs::read_to_string(&order_path)
        .map_err(|e| RuntimeError::io(format!("read {}", order_path.display()), e))?;
    for m in order.lines().filter(|l| !l.is_empty()) {
        entries.push(Entry::File {
            path: format!("modules/{m}"),
            mode: 0o644,
            data: read(&kernel_dir.join("modules").join(m))?,
        });
    }
    entries.push(Entry::File {
        path: "modules.order".into(),
        mode: 0o644,
        data: order.into_bytes(),
    });
    let mut cpio = Cpio::default();
    for e in &entries {
        cpio.add(e);
    }
    let data = cpio.finish();
    let hash = hex::encode(Sha256::digest(&data));
    let path = dir.join(format!("initramfs-{}.cpio", &hash[..16]));
    if !path.exists() {
        std::fs::create_dir_all(dir)
            .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
        let tmp = dir.join(format!(".initramfs-{}.tmp", unique()));
        std::fs::write(&tmp, &data)
            .map_err(|e| RuntimeError::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| RuntimeError::io(format!("rename {}", path.display()), e))?;
    }
    Ok(path)
}

/// An empty archive: what a restored VM is given as its initrd. QEMU still loads an initrd
/// at start, but the guest booted long ago, so there is no point reading and holding the real
/// one in every restored VMM's memory.
pub fn empty(dir: &Path) -> Result<PathBuf, RuntimeError> {
    let path = dir.join("empty.cpio");
    if !path.exists() {
        std::fs::create_dir_all(dir)
            .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
        let tmp = dir.join(format!(".empty-{}.tmp", unique()));
        std::fs::write(&tmp, Cpio::default().finish())
            .map_err(|e| RuntimeError::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| RuntimeError::io(format!("rename {}", path.display()), e))?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_headers_are_aligned_and_end_with_a_trailer() {
        let mut c = Cpio::default();
        c.add(&Entry::Dir("a".into()));
        c.add(&Entry::File {
            path: "a/b".into(),
            mode: 0o644,
            data: b"hello".to_vec(),
        });
        let data = c.finish();
        assert!(data.len().is_multiple_of(4));
        assert!(data.starts_with(b"070701"));
        let s = String::from_utf8_lossy(&data);
        assert!(s.contains("a/b\0"));
        assert!(s.contains("hello"));
        assert!(s.contains("TRAILER!!!\0"));
    }
}
