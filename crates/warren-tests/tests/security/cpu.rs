//! The best-effort CPU class: its processes run under SCHED_IDLE and cannot leave it, its
//! cgroup has the lowest weight, and a latency-sensitive neighbour keeps answering while it
//! floods the CPU.

use std::time::{Duration, Instant};

use warren_client::{CpuClass, CreateSandboxRequest, ExecRequest};

use crate::Scene;

fn best_effort() -> CreateSandboxRequest {
    CreateSandboxRequest {
        cpu_class: Some(CpuClass::BestEffort),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_runs_idle_and_cannot_leave_it() {
    let Some(s) = Scene::with(best_effort()).await else {
        return;
    };
    let info = s.d.client().get(&s.a).await.unwrap();
    assert_eq!(info.limits.cpu_class, CpuClass::BestEffort);
    let prog = "import os\nprint(os.sched_getscheduler(0))\ntry:\n    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)); print('escaped')\nexcept OSError as e:\n    print('refused', e.errno)";
    let out = s.py(prog).await;
    assert_eq!(out.trim(), "5\nrefused 1", "best-effort sandbox: {out}");
    // The neighbour (normal class) runs under SCHED_OTHER.
    let out = crate::py(&s.d, &s.b, "import os\nprint(os.sched_getscheduler(0))").await;
    assert_eq!(out.trim(), "0");
    // The cgroup weight is the smallest.
    let weights: Vec<String> =
        s.d.cgroup_dirs(&s.a)
            .iter()
            .filter_map(|g| {
                std::fs::read_to_string(g.join("cpu.shares"))
                    .or_else(|_| std::fs::read_to_string(g.join("cpu.weight")))
                    .ok()
            })
            .map(|v| v.trim().to_string())
            .collect();
    assert!(
        weights.iter().any(|w| w == "2" || w == "1"),
        "no minimal cpu weight: {weights:?}"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_best_effort_neighbour_does_not_starve_a_normal_one() {
    let Some(s) = Scene::with(CreateSandboxRequest {
        cpu_class: Some(CpuClass::BestEffort),
        cpus: Some(4.0),
        pids: Some(128),
        ..Default::default()
    })
    .await
    else {
        return;
    };
    // Saturate every core from the best-effort sandbox, plus a fork bomb.
    let mut load = ExecRequest::shell(
        "for i in 1 2 3 4; do yes > /dev/null & done; b(){ b|b& }; b 2>/dev/null; sleep 20",
    );
    load.timeout_secs = Some(12.0);
    let client = s.d.client().clone();
    let a = s.a.clone();
    let flood = tokio::spawn(async move { client.exec(&a, &load).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The normal neighbour answers every call (no timing threshold: each must simply come
    // back; the benchmark `warren bench neighbour` measures the latency).
    let started = Instant::now();
    for _ in 0..10 {
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            s.d.client().exec(&s.b, &ExecRequest::argv(["true"])),
        )
        .await
        .expect("the neighbour did not answer within 30 s")
        .unwrap();
        assert!(r.success());
    }
    println!("10 neighbour execs under load took {:?}", started.elapsed());
    let _ = flood.await;
    s.assert_unaffected().await;
}
