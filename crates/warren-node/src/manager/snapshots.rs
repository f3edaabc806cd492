//! Snapshots: `POST /v1/sandboxes/{id}/snapshot` saves a sandbox under an id of its own,
//! `POST /v1/sandboxes` with `snapshot` starts new sandboxes from it, `GET`/`DELETE
//! /v1/snapshots[/{id}]` list and remove them.
//!
//! What a snapshot holds is the substrate's business ([`warren_runtime::Runtime::save_snapshot`]):
//! a VM's memory, devices and disk (processes keep running in every sandbox made from it), a
//! container's files (its writable layer packed into a layer of the image store). The node
//! keeps, per snapshot, a directory `<state dir>/snapshots/<id>/` with `snapshot.json` (what
//! the API shows, the runtime's record) and `data/` (the runtime's files); the image layers it
//! needs are leased to the holder `snapshot.<id>`. [`Snapshots`] is the one owner of that
//! directory and of the table of snapshots in memory.
//!
//! A sandbox made from a snapshot starts its trajectory with a `forked_from` entry naming the
//! snapshotted sandbox and its last entry at the time, so a revive replays that sandbox's
//! trajectory up to there (from the trajectory store when it is gone); the snapshotted
//! sandbox logs a `snapshot` entry.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};
use warren_types::{
    ApiError, Caller, CreateSandboxRequest, CreateSnapshotRequest, ErrorCode, ImageRef, SandboxId,
    SnapshotId, SnapshotInfo, TrajectoryCall,
};

use super::{now_ms, ActivityGuard, Manager};
use crate::error::NodeError;

/// Most snapshots one node keeps (each may hold a VM's memory on disk).
pub const MAX_SNAPSHOTS: usize = 1024;

const FORMAT: u32 = 1;

/// A snapshot's `snapshot.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    format: u32,
    info: SnapshotInfo,
    record: serde_json::Value,
}

/// A snapshot the node holds.
#[derive(Debug)]
pub(crate) struct Held {
    pub info: SnapshotInfo,
    record: serde_json::Value,
    dir: PathBuf,
    /// Creates from it hold it shared; its removal holds it alone.
    in_use: tokio::sync::RwLock<()>,
}

impl Held {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
}

fn holder(id: &str) -> String {
    format!("snapshot.{id}")
}

fn not_found(id: &str) -> NodeError {
    NodeError::Api(ApiError::not_found(format!("snapshot {id} not found")))
}

/// The snapshots of a node, a part of its own beside the manager: owns their directory, the
/// table of them in memory, and the directories of saves a crash cut off (until
/// [`Manager::recover`] has them removed). The manager reads it to create sandboxes from a
/// snapshot; saving one reads the manager's sandbox. Cheap to clone; every clone is the same.
#[derive(Clone, Debug)]
pub struct Snapshots {
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    root: PathBuf,
    map: Mutex<BTreeMap<String, Arc<Held>>>,
    leftovers: Mutex<Vec<PathBuf>>,
}

impl Snapshots {
    /// The snapshots kept under `root`. A directory without a readable `snapshot.json` is
    /// a save cut off by a crash: it is kept as leftover, for [`Manager::recover`] to
    /// remove through the runtimes.
    pub fn open(root: PathBuf) -> Snapshots {
        let mut map = BTreeMap::new();
        let mut leftovers = Vec::new();
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let dir = e.path();
            let stored = std::fs::read(dir.join("snapshot.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Stored>(&b).ok())
                .filter(|s| s.format == FORMAT);
            match stored {
                Some(s) if e.file_name().to_string_lossy() == s.info.id => {
                    map.insert(
                        s.info.id.clone(),
                        Arc::new(Held {
                            info: s.info,
                            record: s.record,
                            dir,
                            in_use: tokio::sync::RwLock::new(()),
                        }),
                    );
                }
                _ => leftovers.push(dir),
            }
        }
        Snapshots {
            state: Arc::new(State {
                root,
                map: Mutex::new(map),
                leftovers: Mutex::new(leftovers),
            }),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Held>>> {
        self.state.map.lock().expect("snapshots lock")
    }

    /// The snapshot `id` when `caller` may see it; another tenant's answers like a missing
    /// one.
    pub(crate) fn get(&self, caller: &Caller, id: &str) -> Result<Arc<Held>, NodeError> {
        self.map()
            .get(id)
            .filter(|h| caller.sees(h.info.tenant.as_deref()))
            .cloned()
            .ok_or_else(|| not_found(id))
    }

    pub fn count(&self) -> usize {
        self.map().len()
    }
}

/// Fills a create request from the snapshot it names: the snapshot's substrate, image and
/// limits (any given must equal them), env under the request's, workdir, user and network
/// unless given.
pub(crate) fn fill(
    snap: &SnapshotInfo,
    mut req: CreateSandboxRequest,
) -> Result<CreateSandboxRequest, ApiError> {
    let s = snap;
    let differs = |what: &str, asked: String, has: String| {
        ApiError::invalid(format!(
            "{what} {asked} differs from snapshot {}'s {has}: a sandbox made from a snapshot \
             has the snapshot's substrate, image and limits",
            s.id
        ))
    };
    if req.substrate != warren_types::Substrate::default() && req.substrate != s.substrate {
        return Err(differs(
            "substrate",
            req.substrate.as_str().into(),
            s.substrate.as_str().into(),
        ));
    }
    if req.image != ImageRef::default() && req.image.refs() != s.image {
        return Err(differs(
            "image",
            format!("{:?}", req.image.refs()),
            format!("{:?}", s.image),
        ));
    }
    let l = &s.limits;
    fn same<T: PartialEq + std::fmt::Display>(
        asked: &mut Option<T>,
        has: T,
        name: &str,
        differs: &dyn Fn(&str, String, String) -> ApiError,
    ) -> Result<(), ApiError> {
        match asked.take() {
            Some(a) if a != has => Err(differs(name, a.to_string(), has.to_string())),
            _ => {
                *asked = Some(has);
                Ok(())
            }
        }
    }
    same(&mut req.cpus, l.cpus, "cpus", &differs)?;
    same(&mut req.memory_mb, l.memory_mb, "memory_mb", &differs)?;
    same(&mut req.disk_mb, l.disk_mb, "disk_mb", &differs)?;
    if s.substrate == warren_types::Substrate::Container {
        same(&mut req.disk_medium, l.disk_medium, "disk_medium", &differs)?;
    }
    same(&mut req.pids, l.pids, "pids", &differs)?;
    same(
        &mut req.trajectory_mb,
        l.trajectory_mb,
        "trajectory_mb",
        &differs,
    )?;
    match req.cpu_class {
        Some(c) if c != l.cpu_class => {
            return Err(differs(
                "cpu_class",
                format!("{c:?}"),
                format!("{:?}", l.cpu_class),
            ))
        }
        _ => req.cpu_class = Some(l.cpu_class),
    }
    req.substrate = s.substrate;
    req.image = ImageRef::Stack(s.image.clone());
    let mut env = s.env.clone();
    env.extend(std::mem::take(&mut req.env));
    req.env = env;
    req.workdir = req.workdir.or_else(|| s.workdir.clone());
    req.user = req.user.or_else(|| s.user.clone());
    if req.network.is_none() {
        req.network = s.network.clone();
    }
    req.pty |= s.pty;
    Ok(req)
}

impl Snapshots {
    /// `POST /v1/sandboxes/{id}/snapshot` by `caller`: saves sandbox `id` of `sandboxes`.
    pub async fn snapshot_as(
        &self,
        sandboxes: &Manager,
        caller: &Caller,
        id: &SandboxId,
        req: CreateSnapshotRequest,
    ) -> Result<SnapshotInfo, NodeError> {
        req.validate()?;
        sandboxes.authorize(caller, id)?;
        let sb = sandboxes.lookup(id)?;
        let _busy = ActivityGuard::new(sb.clone());
        // No pause, resume, fork or delete of the sandbox meanwhile.
        let _lifecycle = sb.lifecycle.lock().await;
        let (instance, sinfo) = sb.live_instance()?;
        let snaps = self;
        if snaps.count() >= MAX_SNAPSHOTS {
            return Err(NodeError::Api(ApiError::new(
                ErrorCode::LimitExceeded,
                format!("this node keeps at most {MAX_SNAPSHOTS} snapshots: delete some first"),
            )));
        }
        let sid = SnapshotId::generate(&sandboxes.config().node);
        let dir = snaps.state.root.join(sid.as_str());
        std::fs::create_dir_all(&dir).map_err(|e| {
            NodeError::Api(ApiError::internal(format!(
                "cannot create {}: {e}",
                dir.display()
            )))
        })?;
        let seq = sb.log.last_seq();
        let started_ms = now_ms();
        let t0 = std::time::Instant::now();
        let saved = match sb
            .runtime
            .save_snapshot(&instance, &dir.join("data"), &holder(sid.as_str()))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(match e {
                    warren_runtime::RuntimeError::Unsupported(why) => {
                        NodeError::Api(ApiError::new(
                            ErrorCode::InvalidState,
                            format!("{why}: snapshot container, microvm and vm sandboxes"),
                        ))
                    }
                    e => NodeError::runtime(id, e),
                });
            }
        };
        let info = SnapshotInfo {
            id: sid.to_string(),
            sandbox: id.to_string(),
            sandbox_seq: seq,
            substrate: sinfo.substrate,
            image: sinfo.image.clone(),
            limits: sinfo.limits.clone(),
            env: sinfo.env.clone(),
            workdir: sinfo.workdir.clone(),
            user: sinfo.user.clone(),
            network: sinfo.network.clone(),
            labels: req.labels,
            processes: saved.processes,
            size_bytes: saved.size_bytes,
            created_at_ms: now_ms(),
            tenant: sinfo.tenant.clone(),
            pty: sinfo.pty,
        };
        let stored = Stored {
            format: FORMAT,
            info: info.clone(),
            record: saved.record.clone(),
        };
        if let Err(e) = write_durably(&dir, &stored) {
            sb.runtime
                .remove_snapshot(&dir.join("data"), &holder(sid.as_str()))
                .await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(NodeError::Api(ApiError::internal(format!(
                "cannot record snapshot {sid}: {e}"
            ))));
        }
        snaps.map().insert(
            sid.to_string(),
            Arc::new(Held {
                info: info.clone(),
                record: saved.record,
                dir,
                in_use: tokio::sync::RwLock::new(()),
            }),
        );
        sandboxes
            .log_lifecycle(
                &sb,
                TrajectoryCall::Snapshot {
                    snapshot: sid.to_string(),
                },
                started_ms,
            )
            .await;
        info!(sandbox = %id, snapshot = %sid, ms = t0.elapsed().as_millis() as u64, bytes = info.size_bytes, "snapshot saved");
        Ok(info)
    }

    /// `GET /v1/snapshots`: what `caller` may see, oldest first.
    pub fn list_as(&self, caller: &Caller) -> Vec<SnapshotInfo> {
        self.map()
            .values()
            .filter(|h| caller.sees(h.info.tenant.as_deref()))
            .map(|h| h.info.clone())
            .collect()
    }

    /// `GET /v1/snapshots/{id}`.
    pub fn info_as(&self, caller: &Caller, id: &str) -> Result<SnapshotInfo, NodeError> {
        Ok(self.get(caller, id)?.info.clone())
    }

    /// `DELETE /v1/snapshots/{id}`: waits for creates from it that are under way. Sandboxes
    /// made from it are not affected.
    pub async fn delete_as(
        &self,
        sandboxes: &Manager,
        caller: &Caller,
        id: &str,
    ) -> Result<(), NodeError> {
        let held = self.get(caller, id)?;
        let _alone = held.in_use.write().await;
        // Another delete may have won while this one waited.
        if self.map().remove(id).is_none() {
            return Err(not_found(id));
        }
        // Unrecorded first: a crash from here on leaves a directory the next start removes.
        let _ = std::fs::remove_file(held.dir.join("snapshot.json"));
        match sandboxes.substrates().runtime_for(held.info.substrate) {
            Ok(rt) => rt.remove_snapshot(&held.data(), &holder(id)).await,
            Err(e) => warn!(snapshot = id, error = %e, "no runtime for the snapshot's substrate"),
        }
        if let Err(e) = std::fs::remove_dir_all(&held.dir) {
            warn!(snapshot = id, error = %e, "cannot remove a snapshot's directory");
        }
        info!(snapshot = id, "snapshot deleted");
        Ok(())
    }

    /// Removes the directories of saves a crash cut off (and what `runtimes` kept of them).
    pub(crate) async fn remove_leftovers(&self, runtimes: &[Arc<dyn warren_runtime::Runtime>]) {
        let leftovers = std::mem::take(&mut *self.state.leftovers.lock().expect("leftovers lock"));
        for dir in leftovers {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for rt in runtimes {
                rt.remove_snapshot(&dir.join("data"), &holder(&name)).await;
            }
            let _ = std::fs::remove_dir_all(&dir);
            warn!(dir = %dir.display(), "removed a snapshot whose save was cut off");
        }
    }
}

/// Writes `snapshot.json` and syncs it and its directory.
fn write_durably(dir: &Path, stored: &Stored) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join("snapshot.json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(stored).expect("snapshot serializes"))?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("snapshot.json"))?;
    std::fs::File::open(dir)?.sync_all()
}

/// A create from a snapshot holds it shared until the sandbox has started.
pub(crate) struct FromSnapshot {
    pub held: Arc<Held>,
}

impl FromSnapshot {
    /// Starts `spec` from the snapshot; a spec it cannot take is `invalid_request`.
    pub async fn restore(
        &self,
        runtime: &Arc<dyn warren_runtime::Runtime>,
        spec: &warren_runtime::SandboxSpec,
    ) -> Result<Arc<dyn warren_runtime::Instance>, NodeError> {
        let _shared = self.held.in_use.read().await;
        if !self.held.dir.join("snapshot.json").exists() {
            return Err(not_found(&self.held.info.id));
        }
        runtime
            .restore_snapshot(&self.held.data(), &self.held.record, spec)
            .await
            .map_err(|e| match e {
                warren_runtime::RuntimeError::Unsupported(why) => {
                    NodeError::Api(ApiError::invalid(why.to_string()))
                }
                source => NodeError::CreateFailed { source },
            })
    }

    /// The first entry of the new sandbox's trajectory.
    pub fn origin(&self) -> TrajectoryCall {
        TrajectoryCall::ForkedFrom {
            parent: self.held.info.sandbox.clone(),
            parent_seq: self.held.info.sandbox_seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::{Limits, Substrate};

    fn snap() -> SnapshotInfo {
        SnapshotInfo {
            id: "n1-snap-01jd0m7x4e8k0k9yq1w2e3r4t5".into(),
            sandbox: "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".into(),
            sandbox_seq: 7,
            substrate: Substrate::Microvm,
            image: vec!["default".into()],
            limits: Limits {
                memory_mb: 256,
                ..Limits::default()
            },
            env: [("A".to_string(), "1".to_string())].into(),
            workdir: Some("/root".into()),
            user: None,
            network: Default::default(),
            labels: Default::default(),
            processes: true,
            size_bytes: 1,
            created_at_ms: 0,
            tenant: None,
            pty: false,
        }
    }

    #[test]
    fn a_request_takes_the_snapshots_shape_and_may_not_change_it() {
        let req = CreateSandboxRequest {
            env: [("B".to_string(), "2".to_string())].into(),
            memory_mb: Some(256),
            ..Default::default()
        };
        let r = fill(&snap(), req).unwrap();
        assert_eq!(r.substrate, Substrate::Microvm);
        assert_eq!(r.image.refs(), vec!["default".to_string()]);
        assert_eq!(r.memory_mb, Some(256));
        assert_eq!(r.cpus, Some(Limits::default().cpus));
        assert_eq!(r.workdir.as_deref(), Some("/root"));
        assert_eq!(r.env.len(), 2);
        for bad in [
            CreateSandboxRequest {
                memory_mb: Some(512),
                ..Default::default()
            },
            CreateSandboxRequest {
                substrate: Substrate::Vm,
                ..Default::default()
            },
            CreateSandboxRequest {
                image: ImageRef::Name("other".into()),
                ..Default::default()
            },
            CreateSandboxRequest {
                cpu_class: Some(warren_types::CpuClass::BestEffort),
                ..Default::default()
            },
        ] {
            let e = fill(&snap(), bad.clone()).expect_err("refused");
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{bad:?}");
        }
    }
}
