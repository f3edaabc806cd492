//! Re-attaching to a running container after a daemon restart.
//!
//! The agent, on losing its daemon, parks the daemon's end of a fresh socketpair on
//! [`warren_proto::RECONNECT_FD`]; we take it with `pidfd_getfd` (which needs ptrace rights
//! over the non-dumpable agent: root of the host has them, nothing inside the sandbox does).

use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use warren_proto::{Frame, Init, InitReply, Kind, PROTOCOL_VERSION, RECONNECT_FD};

use super::record::{ContainerRecord, RECORD_VERSION};
use super::{Container, ContainerRuntime};
use crate::agent::AgentConn;
use crate::procfs::start_time;
use crate::{AdoptError, RuntimeError, SandboxSpec};

pub async fn adopt(
    rt: &ContainerRuntime,
    spec: &SandboxSpec,
    record: &serde_json::Value,
) -> Result<Container, RuntimeError> {
    let rec: ContainerRecord =
        serde_json::from_value(record.clone()).map_err(AdoptError::BadRecord)?;
    if rec.version != RECORD_VERSION {
        return Err(AdoptError::RecordVersion {
            found: rec.version,
            reads: RECORD_VERSION,
        }
        .into());
    }
    if start_time(rec.agent_pid) != Some(rec.agent_start_time) {
        return Err(AdoptError::NotRunning {
            what: "the sandbox's agent",
        }
        .into());
    }
    let cgroups = rt.hierarchy.set_for(spec.id.as_str());
    if !cgroups.contains(rec.agent_pid) {
        return Err(AdoptError::NotInCgroup { what: "the agent" }.into());
    }
    // A paused sandbox's agent is frozen and cannot answer: thaw it for the handshake and
    // freeze it again afterwards.
    let was_frozen = cgroups.is_frozen();
    if was_frozen {
        cgroups.freeze(false).await?;
    }
    let result = reconnect(&rec).await;
    if was_frozen {
        cgroups.freeze(true).await?;
    }
    let stream = result?;
    // Its writable layer on disk counts against the node's space again, under its quota.
    let writable = match (&rec.writable_dir, &rt.writable) {
        (Some(_), Some(w)) => {
            let (w2, id, bytes) = (w.clone(), spec.id.to_string(), spec.limits.disk_mb << 20);
            tokio::task::spawn_blocking(move || w2.adopt(&id, bytes))
                .await
                .map_err(AdoptError::WritableLayerTask)?
                .map_err(|e| AdoptError::WritableLayer(Box::new(e)))?;
            Some(w.clone())
        }
        (Some(d), None) => return Err(AdoptError::NoWritableStore { dir: d.clone() }.into()),
        _ => None,
    };
    // Its host id range is taken again before any create could be given it (last: a
    // failed adoption must not hold it).
    if let Some(base) = rec.id_base {
        match &rt.ids {
            Some(p) => p.adopt(base)?,
            None => return Err(AdoptError::NoIdPool { base }.into()),
        }
    }
    // Sandboxes started before layers were leased get their lease now.
    crate::leases::lease(&rt.images, &spec.id, &rec.layers).await;
    let ids = rec.id_base.and(rt.ids.clone());
    Ok(Container {
        id: spec.id.clone(),
        agent: AgentConn::new(stream),
        cgroups,
        _pins: warren_image::LayerPins::new(&rt.images, &rec.layers),
        record: rec,
        paused: was_frozen.into(),
        images: rt.images.clone(),
        phases: Vec::new(),
        // Looked at again (and mounted if missing) by the first terminal.
        devpts: tokio::sync::Mutex::new(false),
        agent_bin: rt.cfg.agent_bin.clone(),
        writable,
        ids,
    })
}

async fn reconnect(rec: &ContainerRecord) -> Result<UnixStream, RuntimeError> {
    let pidfd = warren_sys::pidfd::open(rec.agent_pid)?;
    let started = Instant::now();
    let fd = loop {
        match warren_sys::pidfd::get_fd(&pidfd, RECONNECT_FD) {
            Ok(fd) => break fd,
            Err(e) if started.elapsed() > Duration::from_secs(3) => {
                return Err(AdoptError::NoReconnectSocket(e).into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let std_stream = std::os::unix::net::UnixStream::from(fd);
    std_stream
        .set_nonblocking(true)
        .map_err(|e| RuntimeError::io("reconnect socket", e))?;
    let mut stream =
        UnixStream::from_std(std_stream).map_err(|e| RuntimeError::io("reconnect socket", e))?;
    Frame::json(
        0,
        Kind::Init,
        &Init::Hello {
            version: PROTOCOL_VERSION,
            hostname: None,
        },
    )
    .write_async(&mut stream)
    .await
    .map_err(AdoptError::Frame)?;
    let reply = tokio::time::timeout(Duration::from_secs(3), Frame::read_async(&mut stream))
        .await
        .map_err(|_| AdoptError::NoAnswer { who: "agent" })?
        .map_err(AdoptError::Frame)?;
    match reply.parse::<InitReply>() {
        Ok(InitReply::Ready { .. }) => {}
        other => {
            return Err(AdoptError::UnexpectedAnswer {
                answer: format!("{other:?}"),
            }
            .into())
        }
    }
    Ok(stream)
}
