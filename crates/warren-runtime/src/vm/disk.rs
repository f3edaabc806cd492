//! Disk files: a shared, empty, pre-formatted ext4 image per size (the base of every
//! microVM's writable disk), a shared whole-system image per image stack (the base of every
//! full VM's system disk), and per-sandbox qcow2 overlays on them. A sandbox writes only its
//! own overlay; bases are made once and never written again.

use std::path::{Path, PathBuf};

use super::tool;
use crate::RuntimeError;

/// Serializes base-image building within the process and, with a lock file, across daemons.
async fn lock(
    dir: &Path,
) -> Result<
    (
        tokio::sync::MutexGuard<'static, ()>,
        nix::fcntl::Flock<std::fs::File>,
    ),
    RuntimeError,
> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let g = LOCK.lock().await;
    std::fs::create_dir_all(dir)
        .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .map_err(|e| RuntimeError::io("base lock", e))?;
    // Another daemon may be building the same base: wait for it off the async threads.
    let fl = tokio::task::spawn_blocking(move || {
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| RuntimeError::io("base lock", e.into()))
    })
    .await
    .map_err(|e| RuntimeError::Vmm(crate::VmmError::LockTask(e)))??;
    Ok((g, fl))
}

/// An empty ext4 image of `mb` MiB (sparse), shared by every writable disk of that size.
pub async fn empty_ext4(base_dir: &Path, mb: u64) -> Result<PathBuf, RuntimeError> {
    let path = base_dir.join(format!("empty-ext4-{mb}m.raw"));
    if path.exists() {
        return Ok(path);
    }
    let _l = lock(base_dir).await?;
    if path.exists() {
        return Ok(path);
    }
    let tmp = base_dir.join(format!(".empty-{mb}-{}.tmp", std::process::id()));
    tool::run(
        Path::new("/usr/sbin/mkfs.ext4"),
        &[
            "-q".into(),
            "-F".into(),
            "-m".into(),
            "0".into(),
            "-E".into(),
            "lazy_itable_init=0,nodiscard".into(),
            "-O".into(),
            "^has_journal".into(),
            tmp.display().to_string(),
            format!("{mb}M"),
        ],
    )
    .await?;
    std::fs::rename(&tmp, &path).map_err(|e| RuntimeError::io("rename base", e))?;
    Ok(path)
}

/// A whole-system ext4 image holding the merged image stack plus `free_mb` of room.
pub async fn system_image(
    base_dir: &Path,
    blobs: &[PathBuf],
    key: &str,
    free_mb: u64,
) -> Result<PathBuf, RuntimeError> {
    let path = base_dir.join(format!("system-{key}-{free_mb}m.raw"));
    if path.exists() {
        return Ok(path);
    }
    let _l = lock(base_dir).await?;
    {
        if path.exists() {
            return Ok(path);
        }
        let used: u64 = blobs
            .iter()
            .map(|b| std::fs::metadata(b).map(|m| m.len()).unwrap_or(0))
            .sum();
        let mb = used / (1 << 20) * 3 / 2 + free_mb + 64;
        let tmp = base_dir.join(format!(".system-{key}-{}.tmp", std::process::id()));
        let stage = base_dir.join(format!(".stage-{}", std::process::id()));
        // Mount the layers (and an overlay of them) in a private mount namespace that dies
        // with the shell, then let mkfs.ext4 copy the merged tree into the new filesystem.
        let mut script = String::from("set -e\n");
        let mut lowers = Vec::new();
        for (i, b) in blobs.iter().enumerate() {
            script.push_str(&format!(
                "mkdir -p {s}/l{i}\nmount -t erofs -o ro,loop '{}' {s}/l{i}\n",
                b.display(),
                s = stage.display()
            ));
            lowers.push(format!("{}/l{i}", stage.display()));
        }
        lowers.reverse();
        let root = if blobs.len() == 1 {
            lowers[0].clone()
        } else {
            script.push_str(&format!(
                "mkdir -p {s}/m\nmount -t overlay overlay -o ro,lowerdir={} {s}/m\n",
                lowers.join(":"),
                s = stage.display()
            ));
            format!("{}/m", stage.display())
        };
        script.push_str(&format!(
            "mkfs.ext4 -q -F -m 0 -O ^has_journal -d {root} '{}' {mb}M\n",
            tmp.display()
        ));
        let r = tool::run_str(
            "/usr/bin/unshare",
            &["--mount", "--propagation", "private", "sh", "-c", &script],
        )
        .await;
        let _ = std::fs::remove_dir_all(&stage);
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path).map_err(|e| RuntimeError::io("rename system image", e))?;
        Ok(path)
    }
}

/// A qcow2 overlay at `path` whose reads fall through to `backing`.
pub async fn overlay(
    qemu_img: &Path,
    backing: &Path,
    backing_fmt: &str,
    path: &Path,
) -> Result<(), RuntimeError> {
    let args: Vec<String> = ["create", "-q", "-f", "qcow2", "-F", backing_fmt, "-b"]
        .iter()
        .map(|s| s.to_string())
        .chain([backing.display().to_string(), path.display().to_string()])
        .collect();
    tool::run(qemu_img, &args).await.map(drop)
}

/// Copies a (sparse) file, with a reflink where the filesystem can.
pub async fn copy(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    tool::run(
        Path::new("/usr/bin/cp"),
        &[
            "--reflink=auto".into(),
            "--sparse=always".into(),
            from.display().to_string(),
            to.display().to_string(),
        ],
    )
    .await
    .map(drop)
}
