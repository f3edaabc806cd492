//! Re-attaching to a running VM after a daemon restart: QEMU keeps running on its own; its
//! agent socket accepts the new daemon, which greets the agent with `Init::Hello`.

use std::time::Duration;
use tokio::net::UnixStream;
use warren_proto::{Frame, Init, InitReply, Kind, PROTOCOL_VERSION};

use super::record::{MachineKey, VmRecord, RECORD_VERSION};
use super::{create, qemu, qmp::Qmp, Vm, VmRuntime};
use crate::agent::AgentConn;
use crate::procfs::start_time;
use crate::{AdoptError, RuntimeError, SandboxSpec};

pub async fn adopt(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    record: &serde_json::Value,
) -> Result<Vm, RuntimeError> {
    let bad = |e: serde_json::Error| RuntimeError::Adopt(AdoptError::BadRecord(e));
    let rec: VmRecord =
        serde_json::from_value(record.get("vm").cloned().unwrap_or_default()).map_err(bad)?;
    let key: MachineKey =
        serde_json::from_value(record.get("machine").cloned().unwrap_or_default()).map_err(bad)?;
    if rec.version != RECORD_VERSION {
        return Err(AdoptError::RecordVersion {
            found: rec.version,
            reads: RECORD_VERSION,
        }
        .into());
    }
    if start_time(rec.qemu_pid) != Some(rec.qemu_start_time) {
        return Err(AdoptError::NotRunning {
            what: "the VM's QEMU",
        }
        .into());
    }
    let cgroups = rt.hierarchy.set_for(spec.id.as_str());
    if !cgroups.contains(rec.qemu_pid) {
        return Err(AdoptError::NotInCgroup { what: "QEMU" }.into());
    }
    // QEMU is no child of this daemon: its exit status is not known here.
    let (exited, death) = create::watch_exit(rec.qemu_pid, None, rec.dir.clone())?;
    let qmp = Qmp::connect(&qemu::qmp_socket(&rec.dir), Duration::from_secs(3)).await?;
    let paused = qmp.status().await? == "paused";
    if paused {
        qmp.cont().await?;
    }
    let stream = reconnect(&qemu::agent_socket(&rec.dir)).await;
    if paused {
        qmp.stop().await?;
    }
    let stream = stream?;
    // VMs started before layers were leased get their lease now.
    crate::leases::lease(&rt.images, &spec.id, &rec.layers).await;
    Ok(Vm {
        id: spec.id.clone(),
        images: rt.images.clone(),
        agent: AgentConn::new(stream),
        qmp,
        cgroups,
        record: rec,
        key,
        // Only a template's VM has its RAM in a shared file, and it is never adopted.
        ram: super::memory::Ram::Anonymous,
        paused: paused.into(),
        exited,
        death,
        phases: Vec::new(),
    })
}

async fn reconnect(path: &std::path::Path) -> Result<UnixStream, RuntimeError> {
    let mut stream = UnixStream::connect(path)
        .await
        .map_err(AdoptError::AgentSocket)?;
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
    let ready = async {
        loop {
            let f = Frame::read_async(&mut stream)
                .await
                .map_err(AdoptError::Frame)?;
            if f.kind == Kind::Init {
                if let Ok(InitReply::Ready { .. }) = f.parse::<InitReply>() {
                    return Ok::<(), RuntimeError>(());
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ready)
        .await
        .map_err(|_| {
            RuntimeError::Adopt(AdoptError::NoAnswer {
                who: "the guest agent",
            })
        })??;
    Ok(stream)
}
