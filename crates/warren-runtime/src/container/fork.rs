//! Fork: N new sandboxes from one, sharing its image and a snapshot of its writable layer.
//!
//! The parent's upper directory is frozen for a moment and packed once into a new read-only
//! EROFS layer (content-addressed, in the image store, like any other layer). Each child is
//! then an ordinary container whose stack is the parent's layers plus that snapshot, under a
//! fresh writable layer: a write in one child is invisible to its siblings and to the parent,
//! and N children cost one pack, not N copies.
//!
//! The pack runs `mkfs.erofs` inside the parent's user namespace (so file owners are recorded
//! as the sandbox sees them, and the layer idmaps like any image layer) on the upper directory
//! handle the agent keeps at [`warren_proto::UPPER_FD`]. Overlay whiteouts and opaque-dir
//! xattrs are carried over, so deletions in the parent stay deleted in the children.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use super::{create, Container, ContainerRuntime};
use crate::reaper::{spawn_wait, ChildExit};
use crate::{Instance, RuntimeError, SandboxSpec, StartCause};

/// Runs a helper program to completion; its stderr goes into the error on failure.
async fn run_helper(
    rt: &ContainerRuntime,
    argv: &[String],
    fds: &[(i32, i32)],
) -> Result<(), RuntimeError> {
    let exe = which(&argv[0]).ok_or_else(|| {
        RuntimeError::Unsupported(crate::Unsupported::NotInstalled {
            tool: argv[0].clone(),
        })
    })?;
    let errlog = rt.images.root().join("tmp").join(format!(
        "helper-{}-{}.log",
        std::process::id(),
        next_seq()
    ));
    let errfile = std::fs::File::create(&errlog)
        .map_err(|e| RuntimeError::io(format!("create {}", errlog.display()), e))?;
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RuntimeError::io("open /dev/null", e))?;
    let mut map = vec![
        (devnull.as_raw_fd(), 0),
        (devnull.as_raw_fd(), 1),
        (errfile.as_raw_fd(), 2),
    ];
    map.extend_from_slice(fds);
    let (_, done) = spawn_wait(
        &exe,
        argv,
        &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
        &map,
    )?;
    drop((devnull, errfile));
    let exit = done.await.unwrap_or(ChildExit::Signal(libc::SIGKILL));
    let stderr = std::fs::read_to_string(&errlog).unwrap_or_default();
    let _ = std::fs::remove_file(&errlog);
    if exit.success() {
        Ok(())
    } else {
        Err(StartCause::Tool {
            what: argv[0].to_string(),
            status: format!("{exit:?}"),
            stderr: stderr.trim().to_string(),
        }
        .into())
    }
}

fn next_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Packs the parent's writable layer into a layer of the store; returns its digest and the
/// temporary lease that keeps it until the children hold it.
///
/// Two steps: `cp -a` copies the upper directory (reached through the agent's handle, which
/// lives in another mount namespace) to a staging directory of the store, keeping owners,
/// modes, times, xattrs (overlay's opaque markers) and whiteout devices; then `mkfs.erofs`
/// runs inside the parent's user namespace so owners are recorded as the sandbox sees them.
pub async fn snapshot(
    rt: &ContainerRuntime,
    parent: &Container,
) -> Result<(String, warren_image::Lease), RuntimeError> {
    pack(rt, parent, &[], &format!("fork snapshot of {}", parent.id)).await
}

/// [`snapshot`] leaving out `exclude` (paths relative to the sandbox's root, whatever they
/// are in the writable layer: a file, a whiteout, a directory), with `source` as the layer's
/// recorded origin.
pub async fn pack(
    rt: &ContainerRuntime,
    parent: &Container,
    exclude: &[String],
    source: &str,
) -> Result<(String, warren_image::Lease), RuntimeError> {
    let pid = parent.record.agent_pid;
    let pidfd = warren_sys::pidfd::open(pid)?;
    let upper = warren_sys::pidfd::get_fd(&pidfd, warren_proto::UPPER_FD).map_err(|e| {
        StartCause::Helper {
            what: "parent's writable layer is not reachable".into(),
            detail: e.to_string(),
        }
    })?;
    let seq = next_seq();
    let base = rt.images.root().join("tmp").join(format!(
        "snap-{}-{}-{seq}",
        parent.id.as_str(),
        std::process::id()
    ));
    let staging = base.with_extension("dir");
    let image = base.with_extension("erofs");
    std::fs::create_dir_all(&staging)
        .map_err(|e| RuntimeError::io(format!("create {}", staging.display()), e))?;
    // mkfs runs with the sandbox's user namespace, where the host's root is nobody: give it a
    // file it may write (it only ever holds this snapshot and is re-owned once stored).
    {
        use std::os::unix::fs::PermissionsExt;
        let f = std::fs::File::create(&image)
            .map_err(|e| RuntimeError::io(format!("create {}", image.display()), e))?;
        f.set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(|e| RuntimeError::io("chmod snapshot", e))?;
    }
    let result = async {
        run_helper(
            rt,
            &[
                "cp".into(),
                "-a".into(),
                "/proc/self/fd/3/.".into(),
                staging.display().to_string(),
            ],
            &[(upper.as_raw_fd(), 3)],
        )
        .await?;
        for rel in exclude {
            let rel = rel.trim_start_matches('/');
            if rel.is_empty() || rel.split('/').any(|c| c == "..") {
                continue;
            }
            let p = staging.join(rel);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir_all(&p);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(&p);
                }
                Err(_) => {}
            }
        }
        run_helper(
            rt,
            &[
                "nsenter".into(),
                // As root *of the sandbox* (not the host's root, which is nobody there and
                // would lose every capability at exec).
                format!("--user=/proc/{pid}/ns/user"),
                "--".into(),
                "mkfs.erofs".into(),
                "--quiet".into(),
                "--preserve-mtime".into(),
                image.display().to_string(),
                staging.display().to_string(),
            ],
            &[],
        )
        .await
    }
    .await;
    drop(upper);
    let staging_rm = staging.clone();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(staging_rm)).await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&image);
        return Err(e);
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644));
    }
    let images = rt.images.clone();
    let source = source.to_string();
    let stored = tokio::task::spawn_blocking(move || {
        let lease = images.temp_lease("fork")?;
        let d = images.add_layer(&image, &source, None, Some(&lease))?;
        Ok::<_, warren_image::ImageError>((d, lease))
    })
    .await
    .map_err(|e| RuntimeError::io("store snapshot", std::io::Error::other(e.to_string())))??;
    Ok(stored)
}

fn which(prog: &str) -> Option<String> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| format!("{d}/{prog}"))
        .find(|p| std::path::Path::new(p).is_file())
}

pub async fn fork(
    rt: &ContainerRuntime,
    parent: &Container,
    children: &[SandboxSpec],
) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
    let t0 = Instant::now();
    // A consistent snapshot needs the parent still; a paused parent already is.
    let was_paused = parent.is_paused();
    if !was_paused {
        parent.cgroups.freeze(true).await?;
    }
    let snap = snapshot(rt, parent).await;
    if !was_paused {
        parent.cgroups.freeze(false).await?;
    }
    let (snap, snap_lease) = snap?;
    let t_snap = t0.elapsed();
    let mut stack: Vec<String> = parent.record.layers.clone();
    stack.push(snap.clone());
    let made = futures::future::join_all(children.iter().map(|spec| {
        let mut spec = spec.clone();
        spec.image = stack.clone();
        async move { create::create(rt, &spec, None).await }
    }))
    .await;
    let mut ok: Vec<Arc<dyn Instance>> = Vec::new();
    let mut first_err = None;
    for r in made {
        match r {
            Ok(c) => ok.push(Arc::new(c)),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // Every child now leases the snapshot itself (or none exists and it is collected).
    drop(snap_lease);
    if let Some(e) = first_err {
        for c in &ok {
            let _ = c.destroy().await;
        }
        let images = rt.images.clone();
        let _ = tokio::task::spawn_blocking(move || images.collect(&[snap])).await;
        return Err(e);
    }
    tracing::debug!(parent = %parent.id, n = ok.len(), snapshot_ms = t_snap.as_millis() as u64, total_ms = t0.elapsed().as_millis() as u64, "forked");
    Ok(ok)
}
