//! A daemon restart (SIGTERM, then a new daemon on the same state) keeps every sandbox:
//! processes, files and background processes included.

use warren_client::{ExecRequest, ProcessState, SandboxState};

use crate::common::Daemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_live_sandboxes() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(d.sandbox().await);
    }
    let c = d.client().clone();
    let bg = c
        .spawn(&ids[0], &ExecRequest::argv(["sleep", "1000"]))
        .await
        .expect("starting sleep 1000");
    c.write_file_bytes(&ids[1], "/kept.txt", None, "still here\n")
        .await
        .unwrap();
    d.sh_ok(&ids[2], "echo in-layer > /root/note").await;
    let pids_before: Vec<Vec<u32>> = ids.iter().map(|id| d.sandbox_pids(id)).collect();

    for round in 1..=2 {
        d.restart().await;
        let c = d.client().clone();
        let list = d.list().await;
        for id in &ids {
            let info = list.iter().find(|s| &s.id == id).unwrap_or_else(|| {
                panic!("round {round}: {id} is not listed after a restart: {list:?}")
            });
            assert_eq!(
                info.state,
                SandboxState::Running,
                "round {round}: {id} after a restart: {info:?}"
            );
            assert_eq!(
                d.sh_ok(id, "echo ok").await,
                "ok\n",
                "round {round}: exec in {id}"
            );
        }
        assert_eq!(list.len(), 3, "round {round}: {list:?}");
        assert_eq!(
            &c.read_file_bytes(&ids[1], "/kept.txt").await.unwrap()[..],
            b"still here\n"
        );
        assert_eq!(d.sh_ok(&ids[2], "cat /root/note").await, "in-layer\n");
        let ps = d.ps(&ids[0]).await;
        assert!(
            ps.contains("sleep 1000"),
            "round {round}: the background process is gone:\n{ps}"
        );
        // The sandboxes were adopted, not re-created: same processes on the host.
        for (id, before) in ids.iter().zip(&pids_before) {
            let now = d.sandbox_pids(id);
            for p in before {
                assert!(
                    now.contains(p),
                    "round {round}: process {p} of {id} is gone (now {now:?})"
                );
            }
        }
        // The agent still knows its background process.
        let procs = c.list_processes(&ids[0]).await.expect("listing processes");
        let p = procs
            .iter()
            .find(|p| p.pid == bg.pid)
            .unwrap_or_else(|| panic!("round {round}: pid {} not listed: {procs:?}", bg.pid));
        assert_eq!(p.state, ProcessState::Running);
    }

    // And it can still be controlled.
    let c = d.client().clone();
    c.kill_process(&ids[0], bg.pid, None).await.unwrap();
    let r = c
        .wait_process(&ids[0], bg.pid, Some(std::time::Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(r.signal, Some(9), "{r:?}");
    // New sandboxes work next to the adopted ones.
    let fresh = d.sandbox().await;
    assert_eq!(d.sh_ok(&fresh, "echo new").await, "new\n");
}
