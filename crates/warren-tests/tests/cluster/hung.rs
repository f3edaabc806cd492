//! A node that hangs (SIGSTOP: its kernel still takes connections, nothing answers): calls in
//! flight to it are not held forever but end once its lease expires (410 `sandbox_lost`); a
//! create with an idempotency key whose node hangs answers 503 `node_unreachable` instead of
//! making a second sandbox elsewhere; once the node goes on (SIGCONT) it registers again and
//! its sandbox and its key answer as before.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use warren_client::{CreateSandboxRequest, ErrorCode, ExecRequest};
use warren_types::NodeState;

use crate::harness::Cluster;

/// Lets the daemon go on if the test fails half-way, so it can be stopped and cleaned up.
struct Resume<'a>(&'a Cluster, usize);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.nodes[self.1].signal(Signal::SIGCONT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_ends_calls_in_flight_and_keeps_its_keys() {
    let Some(c) = Cluster::start(2, 2, |_| Vec::new()).await else {
        return;
    };
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let mut req = CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    };
    req.idempotency_key = Some(format!("hung-{run}"));
    let sb = c.gw(0).create(&req).await.unwrap();
    let victim = c.owner(&sb.id);
    // The same key through the other gateway: the same sandbox.
    assert_eq!(c.gw(1).create(&req).await.unwrap().id, sb.id);

    c.nodes[victim].signal(Signal::SIGSTOP);
    let _resume = Resume(&c, victim);
    let stopped = Instant::now();

    // A call and a keyed create in flight: both end when the lease expires, not never; the
    // create is not moved to the other node (it may have been made on this one).
    let limit = Duration::from_secs(30);
    let call = ExecRequest::shell("true");
    let (exec, create) = tokio::join!(
        tokio::time::timeout(limit, c.gw(0).exec(&sb.id, &call)),
        tokio::time::timeout(limit, c.gw(1).create(&req)),
    );
    println!(
        "calls to a hung node ended after {} ms",
        stopped.elapsed().as_millis()
    );
    let e = exec.expect("a call to a hung node ends").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SandboxLost), "{e}");
    let e = create
        .expect("a keyed create to a hung node ends")
        .expect_err("no second sandbox for the key on another node");
    assert_eq!(e.code(), Some(ErrorCode::NodeUnreachable), "{e}");

    // It goes on: registered again, its sandbox answers, the same one.
    c.nodes[victim].signal(Signal::SIGCONT);
    c.wait_node(victim, NodeState::Ready, Duration::from_secs(20))
        .await;
    let r = c
        .gw(1)
        .exec(&sb.id, &ExecRequest::shell("echo back"))
        .await
        .expect("the sandbox answers again");
    assert_eq!(r.stdout, "back\n");
    assert_eq!(c.gw(0).create(&req).await.unwrap().id, sb.id);
}
