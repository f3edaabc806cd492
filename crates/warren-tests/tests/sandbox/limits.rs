//! Resource limits hold: memory, pids, output size, disk size and time.

use std::time::{Duration, Instant};

use warren_client::{CreateSandboxRequest, ExecRequest};

use crate::common::{wait_for, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_memory_hog_is_oom_killed() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            ..Default::default()
        })
        .await
        .id;
    let mut req = ExecRequest::argv(["python3", "-c", "a=bytearray(400*2**20)"]);
    req.timeout_secs = Some(60.0);
    let r = d.exec(&id, &req).await;
    assert!(!r.timed_out, "the memory hog ran into the timeout: {r:?}");
    assert!(
        r.signal == Some(9) || r.exit_code.is_some_and(|c| c != 0),
        "a 400 MiB allocation succeeded under a 128 MiB limit: {r:?}"
    );
    if r.signal == Some(9) {
        assert!(
            r.oom_killed,
            "killed by the OOM killer, not marked so: {r:?}"
        );
    } else {
        println!(
            "note: the memory hog was not killed by SIGKILL but exited with {:?}: {}",
            r.exit_code, r.stderr
        );
    }
    // A SIGKILL from anyone else is not the OOM killer's.
    let k = d
        .exec(&id, &ExecRequest::argv(["sh", "-c", "kill -9 $$"]))
        .await;
    assert_eq!(k.signal, Some(9), "{k:?}");
    assert!(
        !k.oom_killed,
        "a plain SIGKILL marked as an OOM kill: {k:?}"
    );
    // The sandbox survives its process being OOM-killed.
    assert_eq!(d.sh_ok(&id, "echo alive").await, "alive\n");
}

/// Reads `pids.current` of sandbox `id` from whichever hierarchy has it.
fn pids_current(d: &Daemon, id: &str) -> Option<u64> {
    d.cgroup_dirs(id)
        .iter()
        .find_map(|g| std::fs::read_to_string(g.join("pids.current")).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// `exec true` succeeds within 15 s (retrying while a bomb holds every pid).
async fn answers_true(d: &Daemon, id: &str) -> bool {
    wait_for(Duration::from_secs(15), || async {
        match d.client().exec(id, &ExecRequest::argv(["true"])).await {
            Ok(r) if r.success() => Some(()),
            _ => None,
        }
    })
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_fork_bomb_is_stopped_by_pids() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let limited = CreateSandboxRequest {
        pids: Some(64),
        ..Default::default()
    };
    let id = d.create(&limited).await.id;
    let mut req = ExecRequest::argv(["bash", "-c", ":(){ :|:& };:"]);
    req.timeout_secs = Some(5.0);
    let client = d.client().clone();
    let sid = id.clone();
    let started = Instant::now();
    let bomb = tokio::spawn(async move { client.exec(&sid, &req).await });

    // The host (and the daemon) stay responsive while the bomb runs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    let health = tokio::time::timeout(Duration::from_secs(5), d.client().health()).await;
    assert!(
        matches!(health, Ok(Ok(ref h)) if h.is_ok()),
        "the daemon did not answer /v1/health during the fork bomb: {health:?}"
    );
    println!("health during the fork bomb: {:?}", t.elapsed());
    if let Some(n) = pids_current(&d, &id) {
        assert!(n <= 64, "the sandbox has {n} tasks with pids=64");
    }
    let r = tokio::time::timeout(Duration::from_secs(60), bomb)
        .await
        .expect("the fork bomb exec did not return within 60 s")
        .unwrap();
    println!(
        "fork bomb exec returned after {:?}: {:?}",
        started.elapsed(),
        r.as_ref().map(|r| (r.exit_code, r.signal, r.timed_out))
    );
    if let Err(e) = r {
        // The sandbox may also be stopped as a whole; then it must say so.
        let info = d.client().get(&id).await.expect("get after the fork bomb");
        assert!(
            info.state.is_final(),
            "exec failed ({e}) but the sandbox is {:?}",
            info.state
        );
        return;
    }
    // The bomb's first shell exits at once; its orphans keep forking against the limit.
    // The sandbox must still answer.
    assert!(
        answers_true(&d, &id).await,
        "`exec true` keeps failing after the fork bomb; log:\n{}",
        d.log_tail(20)
    );
    if let Some(n) = pids_current(&d, &id) {
        assert!(n <= 64, "the sandbox has {n} tasks with pids=64");
        println!("tasks left by the fork bomb after its exec returned: {n}");
    }
    // Deleting a sandbox full of forking processes is quick and complete.
    let t = Instant::now();
    d.client()
        .delete(&id)
        .await
        .expect("deleting the bombed sandbox");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "delete took {:?}",
        t.elapsed()
    );
    assert!(
        d.cgroup_dirs(&id).is_empty(),
        "the bombed sandbox keeps its cgroups"
    );

    // With the bomb's first shell kept alive, the timeout fires and kills the whole tree.
    let id = d.create(&limited).await.id;
    let mut req = ExecRequest::argv(["bash", "-c", ":(){ :|:& };:; sleep 60"]);
    req.timeout_secs = Some(5.0);
    let r = tokio::time::timeout(Duration::from_secs(60), d.client().exec(&id, &req))
        .await
        .expect("the fork bomb exec did not return within 60 s")
        .expect("the fork bomb exec failed");
    assert!(r.timed_out, "{:?}", (r.exit_code, r.signal, r.timed_out));
    let gone = wait_for(Duration::from_secs(10), || async {
        let ps = d
            .client()
            .exec(&id, &ExecRequest::shell(crate::common::PS))
            .await
            .ok()?;
        (ps.success() && !ps.stdout.contains("bash")).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "fork bomb processes survive the timeout ({:?} tasks)",
        pids_current(&d, &id)
    );
    assert!(
        answers_true(&d, &id).await,
        "`exec true` fails after the bomb was killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_output_flood_is_truncated() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let mut req = ExecRequest::argv(["yes"]);
    req.timeout_secs = Some(2.0);
    req.max_output_bytes = Some(1 << 20);
    let started = Instant::now();
    let r = d.exec(&id, &req).await;
    let took = started.elapsed();
    assert!(
        r.timed_out,
        "yes was not stopped by the timeout: {:?}",
        r.exit_code
    );
    assert!(r.stdout_truncated, "stdout_truncated is false");
    assert!(
        r.stdout.len() as u64 <= 1 << 20,
        "stdout holds {} bytes with a 1 MiB cap",
        r.stdout.len()
    );
    assert!(
        r.stdout.len() as u64 >= 1 << 19,
        "stdout holds only {} bytes",
        r.stdout.len()
    );
    assert!(r.stdout.starts_with("y\ny\n"), "unexpected output start");
    assert!(
        r.stdout_bytes >= 1 << 20,
        "stdout_bytes = {} (the flood wrote more than the cap)",
        r.stdout_bytes
    );
    assert!(!r.stderr_truncated);
    assert!(took < Duration::from_secs(20), "the flood took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_disk_filler_is_stopped_by_the_disk_limit() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            disk_mb: Some(64),
            ..Default::default()
        })
        .await
        .id;
    let r = d.sh(&id, "dd if=/dev/zero of=/big bs=1M count=200").await;
    assert!(
        !r.success(),
        "writing 200 MiB with disk_mb=64 succeeded: {r:?}"
    );
    // ENOSPC from a layer in memory, EDQUOT from a quota group on disk.
    assert!(
        r.stderr.contains("No space left") || r.stderr.contains("Disk quota exceeded"),
        "dd did not fail with ENOSPC or EDQUOT: {}",
        r.stderr
    );
    let size: u64 = d
        .sh_ok(&id, "stat -c %s /big")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(size <= 64 << 20, "/big is {size} bytes with disk_mb=64");
    // The same limit holds for other directories of the writable layer.
    let r = d
        .sh(&id, "dd if=/dev/zero of=/tmp/more bs=1M count=100")
        .await;
    assert!(
        !r.success()
            && (r.stderr.contains("No space left") || r.stderr.contains("Disk quota exceeded")),
        "{r:?}"
    );
    // Freeing space makes the sandbox usable again.
    d.sh_ok(
        &id,
        "rm -f /big /tmp/more && echo ok > /after && cat /after",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_timeout_kills_grandchildren() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let mut req = ExecRequest::argv(["sh", "-c", "sleep 300 & sleep 300"]);
    req.timeout_secs = Some(1.0);
    let started = Instant::now();
    let r = d.exec(&id, &req).await;
    let took = started.elapsed();
    assert!(r.timed_out, "the exec did not time out: {r:?}");
    assert!(r.exit_code != Some(0), "{r:?}");
    assert!(
        took < Duration::from_secs(10),
        "the 1 s timeout took {took:?}"
    );
    let gone = wait_for(Duration::from_secs(3), || async {
        let ps = d.ps(&id).await;
        (!ps.contains("sleep")).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "sleep processes survive the timeout:\n{}",
        d.ps(&id).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_timeout_kills_detached_grandchildren() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    // A grandchild that left the session and was re-parented to PID 1.
    let mut req = ExecRequest::shell("(setsid sleep 301 &) ; sleep 302");
    req.timeout_secs = Some(1.0);
    let r = d.exec(&id, &req).await;
    assert!(r.timed_out, "{r:?}");
    let gone = wait_for(Duration::from_secs(3), || async {
        let ps = d.ps(&id).await;
        (!ps.contains("sleep")).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "a setsid grandchild survives the timeout:\n{}",
        d.ps(&id).await
    );
}

/// `se.slice` (ns) of a process from its `/proc/<pid>/sched`; `None` on kernels that do not
/// show it (before EEVDF's custom slices).
fn slice_of(sched: &str) -> Option<u64> {
    sched
        .lines()
        .find(|l| l.starts_with("se.slice"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// The daemon and the agent answer with a short time slice, so a neighbour's CPU hog does not
/// delay them by a whole slice; the sandbox's own commands run with the kernel's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_commands_get_the_default_time_slice_and_the_agent_a_short_one() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let ours = std::fs::read_to_string("/proc/self/sched").unwrap();
    let Some(default) = slice_of(&ours) else {
        println!("note: this kernel shows no se.slice; custom time slices are not checked");
        return;
    };
    let daemon = std::fs::read_to_string(format!("/proc/{}/sched", d.pid().unwrap())).unwrap();
    assert_eq!(slice_of(&daemon), Some(100_000), "the daemon's slice");
    let id = d.create(&CreateSandboxRequest::default()).await.id;
    let out = d
        .sh_ok(
            &id,
            "grep se.slice /proc/1/sched | tr -dc 0-9; echo; grep se.slice /proc/self/sched | tr -dc 0-9",
        )
        .await;
    let v: Vec<u64> = out.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(v[0], 100_000, "the agent's slice: {out}");
    assert_eq!(
        v[1], default,
        "a command's slice (the kernel's default): {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_a_container_bigger_than_the_host_is_refused_unless_the_node_overcommits() {
    let huge = CreateSandboxRequest {
        memory_mb: Some(200 * 1024),
        ..Default::default()
    };
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let e = d.client().create(&huge).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(warren_types::ErrorCode::InvalidRequest),
        "{e}"
    );
    assert!(e.to_string().contains("cannot fit this host"), "{e}");
    assert!(d.list().await.is_empty(), "a refused create left a sandbox");
    d.stop().await;
    // Deliberate overcommit: the node admits it (nothing is allocated up front).
    let Some(d) = Daemon::start_with(|_| vec!["--memory-overcommit".into()]).await else {
        return;
    };
    let id = d.create(&huge).await.id;
    assert_eq!(d.sh_ok(&id, "echo ok").await, "ok\n");
    d.client().delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_noisy_background_processes_cannot_fill_the_agent() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // 128 MiB for the commands; each process may keep 16 MiB per stream and prints 24 MiB,
    // so twelve of them would have the agent hold 192 MiB of output if each kept its cap
    // (the commands themselves are small: head and tr).
    let id = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            ..Default::default()
        })
        .await
        .id;
    let mut pids = Vec::new();
    for _ in 0..12 {
        let mut req = ExecRequest::shell("head -c 25165824 /dev/zero | tr '\\0' x");
        req.max_output_bytes = Some(16 << 20);
        pids.push(d.client().spawn(&id, &req).await.unwrap().pid);
    }
    let mut kept = 0u64;
    for pid in pids {
        let r = d
            .client()
            .wait_process(&id, pid, Some(Duration::from_secs(120)))
            .await
            .expect("the agent stopped answering while keeping background output");
        assert_eq!(r.exit_code, Some(0), "{:?}", r.stderr);
        assert_eq!(r.stdout_bytes, 24 << 20, "every byte is counted");
        kept += r.stdout.len() as u64;
        if (r.stdout.len() as u64) < r.stdout_bytes {
            assert!(r.stdout_truncated, "dropped output not marked");
        }
    }
    // All of it together stays within the agent's bound for background output.
    assert!(
        kept <= 16 << 20,
        "the agent kept {kept} bytes of background output"
    );
    assert_eq!(d.sh_ok(&id, "echo alive").await, "alive\n");
    let stats = d.client().stats(&id).await.unwrap();
    assert_eq!(
        stats.oom_kills.unwrap_or(0),
        0,
        "something was OOM-killed: {stats:?}"
    );
    d.client().delete(&id).await.unwrap();
}
