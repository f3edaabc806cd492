//! Commands run in a leaf group of their own under the sandbox's: an OOM kill among them
//! takes a command, never the agent, however the memory is held (in a process, in a memfd
//! no process maps, in files of an in-memory layer), and the sandbox keeps answering.

use warren_client::{CreateSandboxRequest, ExecRequest, ExecResult};

use crate::common::Daemon;

/// The line of `/proc/<pid>/cgroup` (as the sandbox sees it) of the memory controller: the
/// v1 `memory` hierarchy, else the v2 one.
fn memory_line(cgroup: &str) -> String {
    let lines: Vec<&str> = cgroup.lines().collect();
    lines
        .iter()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .or_else(|| lines.iter().find(|l| l.starts_with("0::")))
        .map(|l| l.to_string())
        .unwrap_or_default()
}

fn killed_by_oom(what: &str, r: &ExecResult) {
    assert!(!r.timed_out, "{what} ran into the timeout: {r:?}");
    assert_eq!(r.signal, Some(9), "{what} was not killed: {r:?}");
    assert!(
        r.oom_killed,
        "{what}: an OOM kill not reported as one: {r:?}"
    );
}

async fn hog(d: &Daemon, id: &str, script: &str) -> ExecResult {
    let mut req = ExecRequest::argv(["python3", "-c", script]);
    req.timeout_secs = Some(60.0);
    d.exec(id, &req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_dies_in_the_commands_group_and_the_agent_keeps_answering() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(64),
            disk_mb: Some(64),
            disk_medium: Some(warren_types::DiskMedium::Memory),
            ..Default::default()
        })
        .await
        .id;
    // Where things run: the agent (PID 1) in the sandbox's group, a command in the leaf.
    let groups = d
        .sh_ok(&id, "cat /proc/1/cgroup; echo --; cat /proc/self/cgroup")
        .await;
    let (agent, command) = groups.split_once("--\n").expect("two cgroup files");
    let (agent, command) = (memory_line(agent), memory_line(command));
    assert!(
        command.ends_with("/commands"),
        "a command is not in the commands' group: {command:?} (agent: {agent:?})"
    );
    assert!(
        !agent.ends_with("/commands"),
        "the agent is in the commands' group: {agent:?}"
    );

    // Memory in the process: it is killed, and says so.
    killed_by_oom(
        "a 400 MiB allocation",
        &hog(&d, &id, "a = bytearray(400 * 2**20)").await,
    );
    assert_eq!(d.sh_ok(&id, "echo alive").await, "alive\n");

    // Memory in a memfd that no process maps (counted in no process's size).
    killed_by_oom(
        "a memfd writer",
        &hog(
            &d,
            &id,
            "import os\nf = os.memfd_create('x')\nb = b'x' * 2**20\nwhile True: os.write(f, b)",
        )
        .await,
    );
    assert_eq!(d.sh_ok(&id, "echo alive").await, "alive\n");

    // Memory in files of the in-memory layer (as large as the memory), which outlive their
    // writer: the writer is killed or the layer is full, the commands' group stays (nearly)
    // full, and the agent (outside it) still serves.
    let mut fill = ExecRequest::shell("head -c 100M /dev/zero > /fill");
    fill.timeout_secs = Some(60.0);
    let r = d.exec(&id, &fill).await;
    assert!(
        !r.timed_out && !r.success(),
        "100 MiB written into 64 MiB: {r:?}"
    );
    assert!(
        r.oom_killed || r.stderr.contains("No space left"),
        "the writer neither ran out of memory nor of space: {r:?}"
    );
    let size = d
        .client()
        .stat(&id, "/fill")
        .await
        .expect("stat by the agent")
        .size;
    assert!(size > 32 << 20, "the file holds {size} bytes");
    d.client()
        .remove(&id, "/fill", false)
        .await
        .expect("the agent removes the file");
    assert_eq!(d.sh_ok(&id, "echo alive").await, "alive\n");

    // No OOM kill ever happened outside the commands' group: the agent was never a candidate.
    for g in d.cgroup_dirs(&id) {
        let own = std::fs::read_to_string(g.join("memory.oom_control")).unwrap_or_default();
        if let Some(n) = own.lines().find_map(|l| l.strip_prefix("oom_kill ")) {
            assert_eq!(
                n.trim(),
                "0",
                "an OOM kill in the sandbox's own group: {own}"
            );
        }
    }
    d.client().delete(&id).await.unwrap();
}
