//! Warm pools under stress: a crashed container is replaced, a saturated pool queues then
//! answers `busy` with `retry_after`, 200 concurrent callers all get their own answer,
//! a warm interpreter runs Python, and `substrate = "function"` sandboxes work.

use std::time::Duration;
use warren_client::{CallRequest, CreateSandboxRequest, ErrorCode, Substrate};

use crate::common::{node_cgroup_dirs, wait_for, Daemon};
use crate::{call, sh, sh_ok};

/// Host pids of the warm containers' agents (PID 1 of each container) of `node`: in each
/// container cgroup, the process that is PID 1 of the outermost namespace (each call
/// environment's init is PID 1 of a namespace one level deeper).
fn warm_agents(node: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for dir in node_cgroup_dirs(node) {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            let mut best: Option<(usize, u32)> = None;
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let nspid: Vec<&str> = status
                    .lines()
                    .find(|l| l.starts_with("NSpid:"))
                    .map(|l| l.split_whitespace().skip(1).collect())
                    .unwrap_or_default();
                if nspid.last() == Some(&"1") && best.is_none_or(|(n, _)| nspid.len() < n) {
                    best = Some((nspid.len(), pid));
                }
            }
            out.extend(best.map(|(_, p)| p));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_warm_container_is_replaced() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    sh_ok(&d, "true").await;
    let agents = wait_for(Duration::from_secs(10), || async {
        let a = warm_agents(&d.node);
        (a.len() >= 2).then_some(a)
    })
    .await
    .expect("two warm containers");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agents[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let refilled = wait_for(Duration::from_secs(10), || async {
        let info = d.client().function_pools().await.ok()?;
        let p = info.pools.first()?;
        (p.replaced >= 1 && p.idle >= 2).then_some(())
    })
    .await;
    assert!(
        refilled.is_some(),
        "{:?}",
        d.client().function_pools().await
    );
    for _ in 0..6 {
        assert_eq!(sh_ok(&d, "echo ok").await, "ok\n");
    }
    assert!(!warm_agents(&d.node).contains(&agents[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_queues_then_answers_busy() {
    let Some(d) = Daemon::start_with(|_| {
        [
            "--function-min-warm",
            "1",
            "--function-max-warm",
            "2",
            "--function-queue",
            "2",
            "--function-queue-timeout-ms",
            "1500",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    })
    .await
    else {
        return;
    };
    sh_ok(&d, "true").await;
    let mut calls = Vec::new();
    for _ in 0..8 {
        let c = d.client().clone();
        calls.push(tokio::spawn(async move {
            c.call(&sh("sleep 2; echo done")).await
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut ok = 0;
    let mut busy = 0;
    for t in calls {
        match t.await.unwrap() {
            Ok(r) => {
                assert_eq!(r.stdout, "done\n");
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Busy), "{e}");
                let warren_client::ClientError::Api { error, .. } = &e else {
                    panic!("{e:?}")
                };
                assert_eq!(error.retry_after, Some(1), "{e:?}");
                busy += 1;
            }
        }
    }
    // Two run, the rest wait 1.5 s at most or are refused at once: never more than the
    // pool's two containers, nobody waits forever.
    assert_eq!((ok, busy), (2, 6), "{ok} ok, {busy} busy");
    let p = d.client().function_pools().await.unwrap();
    assert!(p.pools[0].rejected >= 6, "{p:?}");
    assert!(
        p.pools[0].idle + p.pools[0].busy + p.pools[0].starting <= 2,
        "{p:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_callers() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let c = d.client().clone();
            tokio::spawn(async move {
                let mut r =
                    CallRequest::argv(["sh", "-c", "echo $N; echo $N > /tmp/n; cat /tmp/n"]);
                r.env.insert("N".into(), i.to_string());
                (i, c.call(&r).await)
            })
        })
        .collect();
    for t in calls {
        let (i, r) = t.await.unwrap();
        let r = r.unwrap_or_else(|e| panic!("call {i}: {e}"));
        assert_eq!(r.stdout, format!("{i}\n{i}\n"));
    }
    let p = d.client().function_pools().await.unwrap();
    assert_eq!(p.pools[0].calls, 200);
    assert!(p.pools[0].idle + p.pools[0].busy <= 32, "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_interpreter_runs_python() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = CallRequest::argv([
        "python3",
        "-c",
        "import sys, json; print(json.dumps(sys.argv)); print(sys.stdin.read()); sys.exit(4)",
        "x",
    ]);
    r.interpreter = Some("python3".into());
    r.preload = vec!["json".into()];
    r.stdin = Some("in".into());
    for _ in 0..4 {
        let out = call(&d, &r).await;
        assert_eq!(out.stdout, "[\"-c\", \"x\"]\nin\n", "{out:?}");
        assert_eq!(out.exit_code, Some(4));
    }
    // A script file, an exception, and a command the interpreter does not take.
    let mut s = CallRequest::argv(["python3", "/w/s.py"]);
    s.interpreter = Some("python3".into());
    s.files = vec![warren_client::CallFile {
        path: "/w/s.py".into(),
        content: "import os\nprint(__name__, os.getcwd())\nraise ValueError('boom')\n".into(),
        ..Default::default()
    }];
    s.cwd = Some("/tmp".into());
    let out = call(&d, &s).await;
    assert_eq!(out.stdout, "__main__ /tmp\n");
    assert!(out.stderr.contains("ValueError: boom"), "{out:?}");
    assert_eq!(out.exit_code, Some(1));
    let mut e = sh("echo plain");
    e.interpreter = Some("python3".into());
    assert_eq!(call(&d, &e).await.stdout, "plain\n");
    // One pool with the preloaded module, one without.
    let info = d.client().function_pools().await.unwrap();
    assert_eq!(info.pools.len(), 2, "{info:?}");
    assert!(info
        .pools
        .iter()
        .all(|p| p.interpreter.as_deref() == Some("python3")));
}

/// Python in a call loads the image's compiled modules instead of compiling them again: the
/// image keeps its files' times, against which Python checks its bytecode. (With times
/// flattened, every call recompiled each module it imported, several times the CPU.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_uses_the_images_compiled_modules() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let out = call(
        &d,
        &CallRequest::argv(["python3", "-v", "-c", "import json, enum"]),
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let stale: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("bytecode is stale"))
        .collect();
    assert!(stale.is_empty(), "recompiled: {stale:?}");
    assert!(
        out.stderr.contains("json/__pycache__/__init__.cpython"),
        "no bytecode of json was used: {}",
        out.stderr
    );
}

/// A preload that cannot be imported leaves the pool without a warm interpreter: its calls
/// start Python cold and still answer, with the import error nowhere in their output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_preload_falls_back_to_cold_starts() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = CallRequest::argv(["python3", "-c", "import sys; print(len(sys.modules) > 0)"]);
    r.interpreter = Some("python3".into());
    r.preload = vec!["warren_no_such_module".into()];
    for _ in 0..3 {
        let out = call(&d, &r).await;
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        assert_eq!(out.stdout, "True\n", "{out:?}");
        assert!(!out.stderr.contains("warren_no_such_module"), "{out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_sandbox_serves_the_uniform_api() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let info = d
        .create(&CreateSandboxRequest {
            substrate: Substrate::Function,
            ..Default::default()
        })
        .await;
    assert_eq!(info.substrate, Substrate::Function);
    assert_eq!(
        d.sh_ok(&info.id, "echo hi > /tmp/x; cat /tmp/x").await,
        "hi\n"
    );
    d.client().delete(&info.id).await.unwrap();
}
