//! A sandbox whose agent dies (killed from the host) is marked failed with a reason, its
//! cgroups are removed, and the other sandboxes are not affected.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warren_client::{ErrorCode, SandboxState};

use crate::common::{wait_for, Daemon};

/// The host pid of the sandbox's PID 1 (the agent), found through its cgroup.
fn agent_pid(d: &Daemon, id: &str) -> u32 {
    for pid in d.sandbox_pids(id) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let nspid = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .unwrap_or("");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if nspid.split_whitespace().last() == Some("1")
            && String::from_utf8_lossy(&cmdline).contains("warren-agent")
        {
            return pid;
        }
    }
    panic!(
        "no warren-agent with PID 1 among the processes of {id}: {:?}",
        d.sandbox_pids(id)
    );
}

async fn expect_failed(d: &Daemon, id: &str) {
    let failed = wait_for(Duration::from_secs(10), || async {
        let info = d.client().get(id).await.ok()?;
        (info.state == SandboxState::Failed).then_some(info)
    })
    .await;
    let Some(info) = failed else {
        panic!(
            "{id} is not failed 10 s after its agent was killed: {:?}; log:\n{}",
            d.client().get(id).await,
            d.log_tail(20)
        )
    };
    assert!(
        info.reason.as_deref().is_some_and(|r| !r.is_empty()),
        "{id} failed without a reason: {info:?}"
    );
    println!("{id}: failed, reason: {:?}", info.reason);
    let gone = wait_for(Duration::from_secs(10), || async {
        d.cgroup_dirs(id).is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the cgroups of crashed {id} are still there: {:?}",
        d.cgroup_dirs(id)
    );
    // Calls on it fail cleanly.
    let e = d
        .client()
        .exec(id, &warren_client::ExecRequest::argv(["true"]))
        .await
        .expect_err("exec in a failed sandbox");
    assert!(
        matches!(
            e.code(),
            Some(ErrorCode::InvalidState | ErrorCode::SandboxLost | ErrorCode::NotFound)
        ),
        "exec in a failed sandbox: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_killed_agent_marks_the_sandbox_failed() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let victim = d.sandbox().await;
    let bystander = d.sandbox().await;
    d.client()
        .spawn(
            &victim,
            &warren_client::ExecRequest::argv(["sleep", "1000"]),
        )
        .await
        .unwrap();
    let agent = agent_pid(&d, &victim);
    kill(Pid::from_raw(agent as i32), Signal::SIGKILL).unwrap();
    expect_failed(&d, &victim).await;
    assert_eq!(d.sh_ok(&bystander, "echo fine").await, "fine\n");
    // A failed sandbox can be deleted and is then gone.
    match d.client().delete(&victim).await {
        Ok(()) => {}
        Err(e) => assert!(e.is_not_found(), "deleting a failed sandbox: {e}"),
    }
    let e = d.client().get(&victim).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(d.list().await.iter().all(|s| s.id != victim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_killed_cgroup_marks_the_sandbox_failed() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let victim = d.sandbox().await;
    let bystander = d.sandbox().await;
    let pids = d.sandbox_pids(&victim);
    assert!(!pids.is_empty(), "no processes in the cgroups of {victim}");
    for p in pids {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    expect_failed(&d, &victim).await;
    assert_eq!(d.sh_ok(&bystander, "echo fine").await, "fine\n");
    // The daemon keeps serving and creating.
    let fresh = d.sandbox().await;
    assert_eq!(d.sh_ok(&fresh, "echo new").await, "new\n");
}
