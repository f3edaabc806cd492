//! A node cut off from etcd but still reached by its clients: its lease expires, a gateway
//! that cannot reach it either would call it lost and revive its sandboxes on another node
//! (here the revive is asked of the other node directly, as such a gateway would). From the
//! moment its lease may have expired, the cut-off node reads a sandbox's revive mark before
//! it runs anything in it: a revived sandbox answers 404 (and is deleted) instead of running
//! a step beside its copy, a sandbox nobody revived goes on serving. Once etcd is reachable
//! again the node registers again, without the original.
//!
//! The cut is a TCP proxy of the test's own between the node and etcd (loopback).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use warren_client::ExecRequest;

use crate::common::{assert_original_gone, shipped, test_root, wait_for, Daemon, StoreDir};
use crate::etcd::EtcdCluster;

fn step(cmd: &str, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

/// A loopback TCP proxy to `upstream` that can be cut (every connection dropped, new ones
/// closed at once) and mended.
struct Proxy {
    port: u16,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(watch::channel(false).0);
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    continue;
                };
                if *cuts.borrow() {
                    continue;
                }
                let mut gone = cuts.subscribe();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = gone.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { port, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set_cut(true);
        self.task.abort();
    }
}

/// Whether `node` is registered in `etcd` (its leased key is there).
fn registered(etcd: &EtcdCluster, node: &str) -> bool {
    etcd.ctl(&["get", &format!("/warren/nodes/{node}"), "--keys-only"])
        .is_some_and(|o| !o.trim().is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_etcd_runs_nothing_in_a_sandbox_revived_elsewhere() {
    if crate::common::should_skip() {
        return;
    }
    std::fs::create_dir_all(test_root()).unwrap();
    let Some(etcd) = EtcdCluster::start(&test_root(), 1) else {
        return;
    };
    let endpoint = etcd.endpoints();
    let proxy = Proxy::start(endpoint.trim_start_matches("http://").to_string()).await;
    let store = StoreDir::new("cutoff-store");
    let node_args = |etcd: String| {
        let shipping = store.args();
        move |_: &Path| {
            let port = crate::etcd::free_port();
            let mut args = vec![
                "--listen".to_string(),
                format!("127.0.0.1:{port}"),
                "--etcd".to_string(),
                etcd,
            ];
            args.extend(shipping);
            args
        }
    };
    // A reaches etcd through the proxy only; B directly.
    let Some(a) = Daemon::start_with(node_args(format!("http://127.0.0.1:{}", proxy.port))).await
    else {
        return;
    };
    let Some(b) = Daemon::start_with(node_args(endpoint.clone())).await else {
        return;
    };
    let up = wait_for(Duration::from_secs(30), || async {
        (registered(&etcd, &a.node) && registered(&etcd, &b.node)).then_some(())
    })
    .await;
    assert!(
        up.is_some(),
        "the nodes did not register:\n{}",
        a.log_tail(30)
    );

    let id = a.sandbox().await;
    let kept = a.sandbox().await;
    let r = a
        .exec(&id, &step("echo 1 >> /root/runs; wc -l < /root/runs", 1))
        .await;
    assert_eq!(r.stdout.trim(), "1", "{r:?}");
    let on_disk = wait_for(Duration::from_secs(30), || async {
        shipped(&store.0, &id, "/root/runs").then_some(())
    })
    .await;
    assert!(on_disk.is_some(), "step 1 of {id} was never shipped");
    let pids = a.sandbox_pids(&id);
    assert!(!pids.is_empty());

    // A is cut off from etcd: its lease expires there (B's lives on).
    proxy.set_cut(true);
    let expired = wait_for(Duration::from_secs(30), || async {
        (!registered(&etcd, &a.node)).then_some(())
    })
    .await;
    assert!(expired.is_some(), "the cut-off node's lease never expired");
    assert!(registered(&etcd, &b.node));

    // Called lost, its sandbox is revived on B; A is still reached by its clients.
    let revived = b.client().revive(&id, false).await.expect("revive");
    let new = revived.sandbox.id.clone();
    assert_eq!(revived.steps_replayed, 1, "{revived:?}");
    let e = a
        .client()
        .exec(&id, &step("echo 1 >> /root/runs", 2))
        .await
        .expect_err("a step of the original beside its copy");
    assert_eq!(e.status(), Some(404), "a step of the original answered {e}");
    assert!(e.to_string().contains(&new), "{e}");
    assert_original_gone(&a, &pids, Some(&new)).await;
    // A sandbox nobody revived goes on.
    let r = a.exec(&kept, &step("echo kept", 1)).await;
    assert_eq!(r.stdout, "kept\n", "{r:?}");

    // etcd is reachable again: A registers again, without the original; the copy goes on.
    proxy.set_cut(false);
    let back = wait_for(Duration::from_secs(30), || async {
        registered(&etcd, &a.node).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "A did not register again:\n{}",
        a.log_tail(30)
    );
    assert!(a.list().await.iter().all(|s| s.id != id));
    let r = b
        .exec(&new, &step("echo 1 >> /root/runs; wc -l < /root/runs", 2))
        .await;
    assert_eq!(r.stdout.trim(), "2", "{r:?}");
    a.client().delete(&kept).await.expect("deleting kept");
    b.client().delete(&new).await.expect("deleting the copy");
}
