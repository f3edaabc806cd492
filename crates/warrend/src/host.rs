//! Process-wide set-up and take-down of the daemon on its host: limits, the socket, the
//! node's lock, stop signals, the allocator's trimmer and the image store's mounts at a stop.
//! Nothing about sandboxes lives here.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use warren_image::{ImageStore, MountRelease, StoreUser};
use warren_node::Manager;
use warren_types::NodeId;

/// Every sandbox costs the daemon a socket (its agent connection) plus a few fds per call in
/// flight: lift the soft fd limit to the hard one.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
            }
        }
        tracing::info!(limit = hard.max(soft), "open-file limit");
    }
}

pub fn default_agent() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe.with_file_name("warren-agent"))
}

/// Refuses a socket another daemon answers on; removes a stale one.
pub fn check_socket(path: &Path) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another daemon already answers on {}; pick another --socket",
            path.display()
        );
    }
    match std::fs::remove_file(path) {
        Ok(()) => info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", path.display()))
        }
    }
    Ok(())
}

pub fn bind_socket(path: &Path, group: Option<&str>) -> Result<tokio::net::UnixListener> {
    let gid = match group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .with_context(|| format!("looking up group {name}"))?
                .with_context(|| format!("--socket-group {name}: no such group (groupadd {name})"))?
                .gid,
        ),
        None => None,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("chmod {}", path.display()))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid))
            .with_context(|| format!("chgrp {} to {gid}", path.display()))?;
        info!(socket = %path.display(), group = group.unwrap_or_default(), "socket open to its group (mode 0660)");
    }
    Ok(listener)
}

/// Holds an exclusive lock on `/run/warren/node-<id>.lock` for the daemon's life.
pub fn lock_node(node: &NodeId) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = Path::new("/run/warren");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("node-{node}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "another daemon runs as node {node} on this host ({}: {e}); pick another --node",
            path.display()
        )
    })
}

/// SIGTERM and SIGINT, caught from the start of the daemon: a stop asked for while the daemon
/// starts (its wait for the cluster registration included) goes through the same clean stop
/// as one asked for later, instead of the signal's default action killing it half-way.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn install() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The next stop signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// At a clean stop: the store's mounts go when this daemon was its last user and no sandbox
/// (of this node or any other) is left on it; else they stay for the sandboxes and the next
/// start.
pub async fn release_store_mounts(images: &Arc<ImageStore>, user: StoreUser, manager: &Manager) {
    let held = manager.count();
    if held > 0 {
        drop(user);
        info!(
            sandboxes = held,
            "image store mounts kept: this node's sandboxes keep running"
        );
        return;
    }
    let store = images.clone();
    match tokio::task::spawn_blocking(move || store.release_mounts(user)).await {
        Ok(MountRelease::Unmounted(m)) => {
            info!(mounts = m.len(), store = %images.root().display(), "image store mounts removed")
        }
        Ok(MountRelease::Kept(why)) => info!(reason = %why, "image store mounts kept"),
        Ok(MountRelease::Failed(m)) => {
            warn!(mounts = ?m, "image store mounts that could not be removed")
        }
        Err(e) => warn!(error = %e, "image store mounts: the release task failed"),
    }
}

/// Once the node holds fewer sandboxes than at the last look (deletes, expiry), gives the
/// allocator's free memory back to the kernel: without it the daemon kept the peak of a large
/// run (240 MiB of anonymous memory after 9,000 sandboxes came and went, 26 MiB after a trim).
pub fn spawn_heap_trimmer(manager: warren_node::Manager) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held = manager.count();
        loop {
            tick.tick().await;
            let now = manager.count();
            if now < held {
                let _ = tokio::task::spawn_blocking(warren_sys::process::trim_heap).await;
            }
            held = now;
        }
    })
}
