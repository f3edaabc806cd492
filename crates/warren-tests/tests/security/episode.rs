//! A sandbox against its own episode: running out of memory never costs it its agent, and a
//! command can be made to take everything it started with it.

use std::time::Duration;

use warren_client::{CreateSandboxRequest, ErrorCode, ExecRequest};

use crate::common::wait_for;
use crate::Scene;

/// Processes in the sandbox other than PID 1 and the counting program itself.
const OTHERS: &str = "import os\n\
    me = os.getpid()\n\
    print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, me)))";

async fn others(s: &Scene) -> String {
    s.py(OTHERS).await.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_memory_never_kills_the_agent() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        memory_mb: Some(64),
        disk_mb: Some(64),
        disk_medium: Some(warren_types::DiskMedium::Memory),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    // The agent is never the OOM killer's choice; what it starts is the first one. The agent
    // raises a command's score as soon as the command runs (a child of the non-dumpable agent
    // cannot write its own score before exec), so what the command forks from then on
    // inherits it.
    let adj = s
        .sh_ok_stdout("sleep 0.1; cat /proc/1/oom_score_adj /proc/$$/oom_score_adj")
        .await;
    let adj: Vec<i32> = adj.split_whitespace().map(|a| a.parse().unwrap()).collect();
    assert!(
        adj[0] <= 0 && adj[1] == 1000,
        "oom_score_adj agent/command: {adj:?}"
    );
    // Fill the in-memory writable layer to its limit: the writer gets ENOSPC or is killed...
    let mut fill = ExecRequest::shell("dd if=/dev/zero of=/fill bs=1M count=200 2>&1; sync");
    fill.timeout_secs = Some(60.0);
    let r = s.d.exec(&s.a, &fill).await;
    assert!(!r.timed_out, "{r:?}");
    // ...and the sandbox keeps serving with its memory full of files.
    for _ in 0..5 {
        let r = s.d.exec(&s.a, &ExecRequest::argv(["true"])).await;
        assert!(r.success() || r.oom_killed, "{r:?}");
    }
    // A process that needs more memory than is left is the one killed, and says so.
    let mut hog = ExecRequest::argv([
        "python3",
        "-c",
        "b=[]\nwhile True: b.append(bytearray(8*2**20))",
    ]);
    hog.timeout_secs = Some(60.0);
    let r = s.d.exec(&s.a, &hog).await;
    assert_eq!(r.signal, Some(9), "{r:?}");
    assert!(r.oom_killed, "an OOM kill is not reported as one: {r:?}");
    // Free the layer: the sandbox is whole again.
    s.sh_ok_stdout("rm -f /fill").await;
    let info = s.d.client().get(&s.a).await.unwrap();
    assert_eq!(format!("{:?}", info.state), "Running");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_layer_larger_than_memory_is_refused() {
    let Some(s) = Scene::new().await else { return };
    let e =
        s.d.client()
            .create(&CreateSandboxRequest {
                memory_mb: Some(64),
                disk_mb: Some(1024),
                disk_medium: Some(warren_types::DiskMedium::Memory),
                ..Default::default()
            })
            .await
            .expect_err("a 1 GiB in-memory layer under 64 MiB of memory was accepted");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_tree_ends_everything_a_command_started() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        pids: Some(64),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    // A background process started earlier is not the command's: it survives.
    let keep =
        s.d.client()
            .spawn(&s.a, &ExecRequest::argv(["sleep", "600"]))
            .await
            .unwrap();
    let kept = format!("[{}]", keep.pid);
    // Without the option, what a command leaves behind keeps running (documented default).
    let left = ExecRequest::shell("sleep 1000 >/dev/null 2>&1 &");
    s.d.exec(&s.a, &left).await;
    assert_ne!(
        others(&s).await,
        kept,
        "the background job did not outlive its exec"
    );
    s.py("import os\n\
         for p in filter(str.isdigit, os.listdir('/proc')):\n\
         \x20   try:\n\
         \x20       if open('/proc/%s/cmdline' % p, 'rb').read() == b'sleep\\x001000\\x00':\n\
         \x20           os.kill(int(p), 9)\n\
         \x20   except OSError:\n\
         \x20       pass\n")
        .await;

    // Background jobs, a new session and a double fork: all gone when the exec returns.
    let mut req = ExecRequest::shell(
        "sleep 1001 >/dev/null 2>&1 & setsid sleep 1002 >/dev/null 2>&1 & \
         (sleep 1003 >/dev/null 2>&1 &) ; echo started",
    );
    req.kill_tree = true;
    let r = s.d.exec(&s.a, &req).await;
    assert_eq!(r.stdout.trim(), "started");
    let settled = wait_for(Duration::from_secs(10), || async {
        (others(&s).await == kept).then_some(())
    })
    .await;
    assert!(settled.is_some(), "left behind: {}", others(&s).await);

    // A fork bomb whose exec returned at once: with kill_tree the sandbox is back to its
    // background process alone, not stuck at its pid limit.
    let mut bomb = ExecRequest::argv(["bash", "-c", ":(){ :|:& };:"]);
    bomb.kill_tree = true;
    bomb.timeout_secs = Some(30.0);
    let r = s.d.exec(&s.a, &bomb).await;
    assert!(!r.timed_out, "{r:?}");
    let settled = wait_for(Duration::from_secs(20), || async {
        let r =
            s.d.exec(&s.a, &ExecRequest::argv(["python3", "-c", OTHERS]))
                .await;
        (r.success() && r.stdout.trim() == kept).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the bomb outlived its exec");
    s.assert_unaffected().await;
}
