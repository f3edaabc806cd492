//! Creating a container sandbox: the start-up handshake with its agent.

use std::time::Duration;
use tokio::net::UnixStream;
use warren_proto::{ContainerInit, Frame, FunctionInit, Init, InitReply, Kind, PROTOCOL_VERSION};
use warren_sys::ns::IdRange;

use super::record::{ContainerRecord, RECORD_VERSION};
use super::{destroy, Container, ContainerRuntime};
use crate::agent::AgentConn;
use crate::cgroup::CgroupSet;
use crate::procfs::start_time;
use crate::{RuntimeError, SandboxSpec, StartCause};

/// Longest a start-up step may take before the sandbox is declared failed.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// Memory a container's cgroup holds for its agent beyond the sandbox's `memory_mb`.
pub const AGENT_MEMORY_MB: u64 = 32;

pub async fn create(
    rt: &ContainerRuntime,
    spec: &SandboxSpec,
    function: Option<FunctionInit>,
) -> Result<Container, RuntimeError> {
    // Resolve the image first: an unknown image fails before anything exists. The layers are
    // leased to the sandbox in the same step, so no collection removes them while it lives.
    let t_image = std::time::Instant::now();
    let layers = crate::leases::acquire(&rt.images, &spec.id, &spec.image).await?;
    // Pinned from here on: the node's layer cache must not evict them while they are mounted.
    let pins = warren_image::LayerPins::new(&rt.images, &layers);
    let resolved = t_image.elapsed();
    let t0 = std::time::Instant::now();
    let cgroups = rt.hierarchy.set_for(spec.id.as_str());
    // The agent's own memory is on top of the sandbox's: the writable layer (at most
    // `memory_mb`) and the commands can use all of `memory_mb`, and the agent (which the OOM
    // killer never picks) still has room to serve.
    let mut limits = spec.limits.clone();
    limits.memory_mb += AGENT_MEMORY_MB;
    // Commands (not a function's calls, whose cells are the agent's clones) get a leaf of
    // their own limited to the sandbox's memory.
    let leaf = function.is_none();
    let made = cgroups.create(&limits).and_then(|()| {
        if leaf {
            cgroups.create_commands_leaf(spec.limits.memory_mb)
        } else {
            Ok(())
        }
    });
    if let Err(e) = made {
        let _ = cgroups.remove().await;
        crate::leases::release(&rt.images, &spec.id).await;
        return Err(e);
    }
    let t_cg = t0.elapsed();
    // Its own host id range from the node's pool (given back if the start fails).
    let ids = match &rt.ids {
        Some(p) => match p.take() {
            Ok(base) => Some(base),
            Err(e) => {
                let _ = destroy::kill_and_remove(&cgroups).await;
                crate::leases::release(&rt.images, &spec.id).await;
                return Err(e);
            }
        },
        None => None,
    };
    let id_base = ids.unwrap_or(rt.cfg.id_base);
    let free_ids = || {
        if let (Some(p), Some(b)) = (&rt.ids, ids) {
            p.free(b);
        }
    };
    // A writable layer on disk: the sandbox's own subvolume with its quota, made before the
    // agent builds its root in it. A function container's calls keep theirs in memory.
    let writable = match writable_layer(rt, spec, function.is_some(), id_base).await {
        Ok(w) => w,
        Err(e) => {
            let _ = destroy::kill_and_remove(&cgroups).await;
            crate::leases::release(&rt.images, &spec.id).await;
            free_ids();
            return Err(e);
        }
    };
    let own = Own {
        function,
        writable_dir: writable.clone(),
        id_base: ids,
    };
    match start(rt, spec, &cgroups, &layers, t0, pins, own).await {
        Ok(mut c) => {
            tracing::debug!(sandbox = %spec.id, cgroups_us = t_cg.as_micros() as u64, total_us = t0.elapsed().as_micros() as u64, "container created");
            // `start` measured the layer mounts (image) and the agent's start-up.
            for (phase, d) in c.phases.iter_mut() {
                if *phase == "image" {
                    *d += resolved;
                }
            }
            c.phases.push(("cgroups", t_cg));
            Ok(c)
        }
        Err(e) => {
            if let Err(ce) = destroy::kill_and_remove(&cgroups).await {
                tracing::error!(sandbox = %spec.id, error = %ce, "cleanup after failed start");
            }
            if let (Some(w), Some(_)) = (&rt.writable, &writable) {
                destroy::remove_writable(w, &spec.id).await;
            }
            crate::leases::release(&rt.images, &spec.id).await;
            free_ids();
            Err(e.into_start_failure())
        }
    }
}

/// Makes the sandbox's directory on the node's writable-layer file system when its layer
/// lives on disk; `None` when it lives in memory.
async fn writable_layer(
    rt: &ContainerRuntime,
    spec: &SandboxSpec,
    function: bool,
    owner: u32,
) -> Result<Option<std::path::PathBuf>, RuntimeError> {
    if function || spec.limits.disk_medium != warren_types::DiskMedium::Disk {
        return Ok(None);
    }
    let Some(w) = rt.writable.clone() else {
        return Err(crate::Unsupported::NoDiskMedium.into());
    };
    let id = spec.id.to_string();
    let bytes = spec.limits.disk_mb << 20;
    let dir = tokio::task::spawn_blocking(move || w.prepare(&id, bytes, owner))
        .await
        .map_err(|e| StartCause::task("writable layer", e))??;
    Ok(Some(dir))
}

async fn recv(stream: &mut UnixStream, what: &str) -> Result<InitReply, RuntimeError> {
    let f = tokio::time::timeout(STEP_TIMEOUT, Frame::read_async(stream))
        .await
        .map_err(|_| StartCause::AgentTimeout {
            step: what.to_string(),
            log: String::new(),
        })?
        .map_err(|e| StartCause::AgentIo {
            step: what.to_string(),
            source: e,
            log: String::new(),
        })?;
    match f
        .parse::<InitReply>()
        .map_err(|e| RuntimeError::Protocol(e.into()))?
    {
        InitReply::Failed { message } => Err(StartCause::AgentRefused { message }.into()),
        r => Ok(r),
    }
}

async fn send(stream: &mut UnixStream, msg: &Init) -> Result<(), RuntimeError> {
    Frame::json(0, Kind::Init, msg)
        .write_async(stream)
        .await
        .map_err(|e| {
            StartCause::AgentIo {
                step: "init".into(),
                source: e,
                log: String::new(),
            }
            .into()
        })
}

/// What a sandbox's start gets beyond its spec.
struct Own {
    /// Set for a function container.
    function: Option<FunctionInit>,
    /// Its directory on the node's writable-layer file system (layer on disk).
    writable_dir: Option<std::path::PathBuf>,
    /// Its host id range from the node's pool (`None`: the shared `id_base`).
    id_base: Option<u32>,
}

async fn start(
    rt: &ContainerRuntime,
    spec: &SandboxSpec,
    cgroups: &CgroupSet,
    layers: &[String],
    t0: std::time::Instant,
    pins: warren_image::LayerPins,
    own: Own,
) -> Result<Container, RuntimeError> {
    let Own {
        function,
        writable_dir,
        id_base: pooled,
    } = own;
    let base = pooled.unwrap_or(rt.cfg.id_base);
    let t_mount = std::time::Instant::now();
    let lowerdirs = if pooled.is_some() {
        // A range of its own: each layer is mounted once per host (shared), and idmapped
        // to the sandbox's range as a detached mount handed to the agent after its maps are
        // written (`layer_trees`): same superblock, same page cache, no mount in the host's
        // table per sandbox.
        let mut plain = Vec::with_capacity(layers.len());
        for d in layers.iter().rev() {
            let images = rt.images.clone();
            let d = d.clone();
            let p = tokio::task::spawn_blocking(move || images.ensure_mounted(&d))
                .await
                .map_err(|e| StartCause::task("layer mount", e))??;
            plain.push(p.display().to_string());
        }
        plain
    } else {
        // Layers are mounted before the agent exists: its mount namespace is a copy of the
        // host's taken at `unshare`, and must already hold them.
        for d in layers {
            let images = rt.images.clone();
            let d = d.clone();
            let userns = rt
                .idmap
                .try_clone()
                .map_err(|e| RuntimeError::io("dup userns fd", e))?;
            tokio::task::spawn_blocking(move || images.ensure_idmapped(&d, base, &userns))
                .await
                .map_err(|e| StartCause::task("layer mount", e))??;
        }
        layers
            .iter()
            .rev()
            .map(|d| {
                rt.images
                    .idmapped_path(d, base)
                    .map(|p| p.display().to_string())
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    let mounted = t_mount.elapsed();
    let t_agent = std::time::Instant::now();
    let command_groups = cgroups.open_commands_leaf()?;
    let config = ContainerInit {
        command_groups: command_groups.len() as u8,
        lowerdirs: lowerdirs.clone(),
        disk_mb: spec.limits.disk_mb,
        writable_dir: writable_dir.as_ref().map(|d| d.display().to_string()),
        layer_trees: pooled.is_some(),
        hostname: spec.hostname.clone(),
        masked_paths: rt.cfg.masked_paths.clone(),
        readonly_paths: rt.cfg.readonly_paths.clone(),
        seccomp: rt.cfg.seccomp,
        function,
        landlock: rt.cfg.landlock,
        best_effort: spec.limits.cpu_class == warren_types::CpuClass::BestEffort,
        apparmor_profile: rt.cfg.apparmor_profile.clone(),
        sysfs: rt
            .sysfs
            .as_ref()
            .filter(|_| !spec.network)
            .map(|p| p.display().to_string()),
        devpts: spec.devpts,
        resolv_conf: spec.resolv_conf.clone(),
        owner_uid: rt
            .cfg
            .owner_uid_base
            .map(|base| super::owner_uid(base, spec.id.as_str())),
        user_limits: rt.cfg.user_limits.clone(),
    };
    let init = Init::Container {
        version: PROTOCOL_VERSION,
        config: Box::new(config),
    };
    // A parked agent (started ahead, waiting for its start-up message), else one started now.
    let (spare, mut parked) = rt.spares.take()?;
    let mut spare = Some(spare);
    let (mut stream, pid, t_spawned, t_added) = loop {
        let super::spares::Spare {
            pid: stage1,
            ctl: ours,
        } = match spare.take() {
            Some(s) => s,
            None => rt.spares.take_fresh()?,
        };
        let t_spawned = t_agent.elapsed();
        match unshare_agent(cgroups, stage1, ours, &init).await {
            Ok((stream, pid)) => break (stream, pid, t_spawned, t_agent.elapsed()),
            // A parked agent that died after it was looked at (killed from outside): its
            // start-up fails before it did anything; one started now takes its place.
            Err(e) if parked => {
                tracing::debug!(error = %e, agent = stage1, "a parked agent was gone; starting another");
                parked = false;
            }
            Err(e) => return Err(e),
        }
    };
    let t_spawn = t0.elapsed();
    let range = IdRange {
        inside: 0,
        outside: base,
        count: 65536,
    };
    warren_sys::ns::write_id_maps(pid, range, range)?;
    if pooled.is_some() {
        // The layers idmapped through the sandbox's own user namespace, passed just before
        // `Mapped` (the agent reads them first).
        let userns = warren_sys::ns::open_ns(pid, "user")?;
        let trees = lowerdirs
            .iter()
            .map(|p| warren_sys::mount::idmapped_tree(std::path::Path::new(p), &userns))
            .collect::<Result<Vec<_>, _>>()?;
        use std::os::fd::AsRawFd;
        let raw: Vec<i32> = trees.iter().map(|t| t.as_raw_fd()).collect();
        warren_sys::fd::send_fds(&stream, &raw)?;
    }
    if !command_groups.is_empty() {
        use std::os::fd::AsRawFd;
        let raw: Vec<i32> = command_groups.iter().map(|f| f.as_raw_fd()).collect();
        warren_sys::fd::send_fds(&stream, &raw)?;
    }
    drop(command_groups);
    let t_mapped = t0.elapsed();
    // The namespace exists now (the first stage made it with the others); the link can be
    // made while the agent forks and builds the root. Handed over before `Mapped`: until it
    // reads that, the first stage is there (it forks and exits soon after), so the hook can
    // always open the namespace through its pid.
    if let Some(hook) = &spec.on_netns {
        hook.call(pid);
    }
    send(&mut stream, &Init::Mapped).await?;
    let agent_pid = match recv(&mut stream, "fork").await? {
        InitReply::Child { pid } => pid,
        other => {
            return Err(RuntimeError::Protocol(crate::ProtocolError::Expected {
                expected: "Child",
                got: format!("{other:?}"),
            }))
        }
    };
    let t_child = t0.elapsed();
    // The OOM killer never picks the agent (needs CAP_SYS_RESOURCE; hosts without it keep the
    // default score): commands drop back to 0 before they start, and the agent has
    // `AGENT_MEMORY_MB` of its own beyond the sandbox's memory.
    if let Err(e) = std::fs::write(format!("/proc/{agent_pid}/oom_score_adj"), "-1000") {
        tracing::debug!(error = %e, "cannot lower the agent's OOM score (the commands' own cgroup still keeps OOM kills among them)");
    }
    match recv(&mut stream, "root filesystem").await? {
        InitReply::Ready { .. } => {}
        other => {
            return Err(RuntimeError::Protocol(crate::ProtocolError::Expected {
                expected: "Ready",
                got: format!("{other:?}"),
            }))
        }
    }
    tracing::debug!(
        sandbox = %spec.id,
        mount_us = mounted.as_micros() as u64,
        fork_us = t_spawned.as_micros() as u64,
        unshare_us = (t_added - t_spawned).as_micros() as u64,
        spawned_us = t_spawn.as_micros() as u64,
        mapped_us = t_mapped.as_micros() as u64,
        forked_us = t_child.as_micros() as u64,
        ready_us = t0.elapsed().as_micros() as u64,
        "container start-up phases"
    );
    let record = ContainerRecord {
        version: RECORD_VERSION,
        agent_pid,
        agent_start_time: start_time(agent_pid).unwrap_or(0),
        layers: layers.to_vec(),
        writable_dir: writable_dir.clone(),
        id_base: pooled,
    };
    Ok(Container {
        id: spec.id.clone(),
        agent: AgentConn::new(stream),
        cgroups: cgroups.clone(),
        _pins: pins,
        record,
        paused: Default::default(),
        images: rt.images.clone(),
        phases: vec![("image", mounted), ("agent", t_agent.elapsed())],
        devpts: tokio::sync::Mutex::new(spec.devpts),
        agent_bin: rt.cfg.agent_bin.clone(),
        writable: writable_dir.and(rt.writable.clone()),
        ids: pooled.and(rt.ids.clone()),
    })
}

/// Moves the first stage of an agent into the sandbox's cgroups (from then on they own it:
/// killing them kills it), sends its start-up message and reads the pid of the namespaces it
/// made.
async fn unshare_agent(
    cgroups: &CgroupSet,
    stage1: u32,
    ours: std::os::fd::OwnedFd,
    init: &Init,
) -> Result<(UnixStream, u32), RuntimeError> {
    cgroups.add_pid(stage1)?;
    let std_stream = std::os::unix::net::UnixStream::from(ours);
    std_stream
        .set_nonblocking(true)
        .map_err(|e| RuntimeError::io("control socket", e))?;
    let mut stream =
        UnixStream::from_std(std_stream).map_err(|e| RuntimeError::io("control socket", e))?;
    send(&mut stream, init).await?;
    match recv(&mut stream, "unshare").await? {
        InitReply::Unshared { pid } => Ok((stream, pid)),
        other => Err(RuntimeError::Protocol(crate::ProtocolError::Expected {
            expected: "Unshared",
            got: format!("{other:?}"),
        })),
    }
}
