//! A driver preempted in the middle of its creates: `warren create --idempotency-key K`
//! processes killed with SIGKILL while their sandboxes are being created; the restarted
//! driver repeats every create with the same key and gets each sandbox once, running, and can
//! exec in it at once (no `creating`, no `invalid_state`, no second sandbox).

use std::process::{Command, Stdio};
use std::time::Duration;

use warren_client::{CreateSandboxRequest, ExecRequest, SandboxState};

use crate::common::{bin_dir, Daemon};

const DRIVERS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_driver_resumes_its_creates_by_key() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let warren = bin_dir().join("warren");
    assert!(warren.is_file(), "{} is missing", warren.display());
    let key = |i: usize| format!("{}-episode-{i}", d.node);
    // The first driver: one process per create, all killed while the creates run.
    let mut children: Vec<_> = (0..DRIVERS)
        .map(|i| {
            Command::new(&warren)
                .arg("--url")
                .arg(format!("unix://{}", d.socket.display()))
                .args(["create", "--memory", "64M", "--idempotency-key", &key(i)])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("running warren create")
        })
        .collect();
    // Preempted while some of its sandboxes are still being created.
    let started = std::time::Instant::now();
    let creating = loop {
        let n = d
            .list()
            .await
            .iter()
            .filter(|s| s.state == SandboxState::Creating)
            .count();
        if n > 0 {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no create was ever seen in flight"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    println!("{creating} creates in flight when the driver was killed");
    for c in &mut children {
        let _ = c.kill();
    }
    for c in &mut children {
        let _ = c.wait();
    }

    // The restarted driver: the same keys, and at once an exec in each.
    let c = d.client();
    let mut ids = Vec::new();
    for i in 0..DRIVERS {
        let req = CreateSandboxRequest {
            memory_mb: Some(64),
            idempotency_key: Some(key(i)),
            ..Default::default()
        };
        let info = c.create(&req).await.expect("the repeated create");
        assert_eq!(
            info.state,
            SandboxState::Running,
            "a repeated create answers once the first one is done"
        );
        let r = c
            .exec(&info.id, &ExecRequest::shell("echo resumed"))
            .await
            .expect("an exec right after the repeated create");
        assert_eq!(r.stdout, "resumed\n");
        ids.push(info.id);
    }
    // One sandbox per key, whatever the first driver got to.
    let all = d.list().await;
    assert_eq!(all.len(), DRIVERS, "one sandbox per key: {all:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), DRIVERS);
}
