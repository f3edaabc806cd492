//! What the runtime tests of every substrate share: the agent binary, the image store with
//! the default image, one node name per test, and the container runtime. Each helper says why
//! when a test cannot run here (and the test then skips, or fails under `CI=true`).

// Each test binary uses its own subset.
#![allow(dead_code)]

#[path = "../../../../tests/skip.rs"]
mod skip_rule;
pub use skip_rule::skip;

use std::path::PathBuf;
use std::sync::Arc;
use warren_image::ImageStore;
use warren_runtime::container::{ContainerConfig, ContainerRuntime};
use warren_types::NodeId;

/// The `warren-agent` to run: `$WARREN_BIN_DIR`, else this workspace's release or debug build.
pub fn agent_bin() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Ok(d) = std::env::var("WARREN_BIN_DIR") {
        cands.push(PathBuf::from(d).join("warren-agent"));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    cands.push(root.join("target/release/warren-agent"));
    cands.push(root.join("target/debug/warren-agent"));
    cands.into_iter().find(|p| p.is_file())
}

/// Root, a built agent and the image store (`$WARREN_IMAGE_STORE`) holding `default`, which
/// is built from the setup's rootfs when missing and `build` is set. `what` names the tests
/// in the skip message.
pub fn prerequisites(what: &str, build: bool) -> Option<(PathBuf, Arc<ImageStore>)> {
    if !nix::unistd::geteuid().is_root() {
        skip(format!("{what} tests need root"));
        return None;
    }
    let Some(agent) = agent_bin() else {
        skip("warren-agent not built (cargo build -p warren-agent)");
        return None;
    };
    let store_dir =
        std::env::var("WARREN_IMAGE_STORE").unwrap_or_else(|_| "/var/lib/warren/images".into());
    let store = Arc::new(ImageStore::open(&store_dir).unwrap());
    if store.manifest("default").is_err() {
        if !build {
            skip("no default image (scripts/build-default-image.sh)");
            return None;
        }
        let rootfs = PathBuf::from("/var/cache/warren/rootfs-default");
        assert!(
            rootfs.is_dir(),
            "no default image and no rootfs to build it from: run scripts/setup.sh"
        );
        store.build_layer(&rootfs, "default").unwrap();
    }
    Some((agent, store))
}

/// A node name of its own for each test (`prefix` + pid + counter): tests run side by side
/// and each reconciles only its own node.
pub fn node(prefix: &str) -> NodeId {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{prefix}{}x{n}", std::process::id() % 100000)
        .parse()
        .unwrap()
}

/// A container runtime on a node of its own.
pub fn container_runtime() -> Option<(ContainerRuntime, NodeId)> {
    let (agent, store) = prerequisites("container", true)?;
    let node = node("rt");
    let rt = ContainerRuntime::new(ContainerConfig::new(node.clone(), agent), store).unwrap();
    Some((rt, node))
}

/// Kills every process of `node`'s cgroups (`warren-<node>` in each hierarchy) and removes
/// them: what a test that failed midway leaves of its sandboxes (a VM's QEMU outlives its
/// test process by design, as sandboxes outlive a daemon that stops).
pub fn kill_node_cgroups(node: &NodeId) {
    let name = format!("warren-{node}");
    let roots: Vec<PathBuf> = match std::fs::read_dir("/sys/fs/cgroup") {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path().join(&name))
            .chain([PathBuf::from("/sys/fs/cgroup").join(&name)])
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => return,
    };
    let subtree = |root: &PathBuf| -> Vec<PathBuf> {
        let mut dirs = vec![root.clone()];
        let mut i = 0;
        while i < dirs.len() {
            if let Ok(rd) = std::fs::read_dir(&dirs[i]) {
                dirs.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            i += 1;
        }
        dirs
    };
    for _ in 0..50 {
        let mut alive = false;
        for root in &roots {
            for dir in subtree(root) {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    alive = true;
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        if !alive {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for root in &roots {
        for dir in subtree(root).iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
