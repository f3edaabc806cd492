//! Trajectories that outlive their node: nodes ship them to a shared trajectory store
//! (`--trajectory-store`, a directory here). A node killed with SIGKILL mid-episode leaves
//! its sandbox's trajectory in the store, complete up to the last answered step, and a
//! gateway (while the node is unreachable, then lost) and the other node answer it from
//! there; a deleted sandbox's trajectory is sealed and read the same way. Another tenant
//! reads none of it. A sandbox of a killed node, or a deleted one, revives on another node
//! from the store, through a gateway too.

use std::path::PathBuf;
use std::time::Duration;

use sha2::Digest;
use warren_client::{Client, CreateSandboxRequest, ExecRequest};
use warren_types::{NodeState, TrajectoryEntry, TrajectoryResult};

use crate::common::{test_root, CALL_TIMEOUT};
use crate::harness::{Cluster, GatewayProc};

const ALPHA: &str = "trajectory-alpha-token-0123456789";
const BETA: &str = "trajectory-beta-token-0123456789";
/// An administrator (the cluster view is theirs only).
const OPS: &str = "trajectory-ops-token-0123456789";

/// The store directory and the auth file, removed when the test ends.
struct Files {
    store: PathBuf,
    auth: PathBuf,
}

impl Files {
    /// What every node of these tests is started with: the shared store and the tenants.
    fn node_args(&self) -> Vec<String> {
        vec![
            "--trajectory-store".to_string(),
            self.store.display().to_string(),
            "--auth".to_string(),
            self.auth.display().to_string(),
        ]
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.store);
        let _ = std::fs::remove_file(&self.auth);
    }
}

fn files() -> Files {
    let sha = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let tag = format!("{}-{nanos}", std::process::id());
    std::fs::create_dir_all(test_root()).unwrap();
    let f = Files {
        store: test_root().join(format!("trajectory-store-{tag}")),
        auth: test_root().join(format!("trajectory-auth-{tag}.toml")),
    };
    std::fs::create_dir_all(&f.store).unwrap();
    std::fs::write(
        &f.auth,
        format!(
            "[[tenant]]\nname = \"alpha\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n\n\
             [[tenant]]\nname = \"beta\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n\n\
             [[tenant]]\nname = \"ops\"\nrole = \"admin\"\ntoken_sha256 = [\"{}\"]\n",
            sha(ALPHA),
            sha(BETA),
            sha(OPS)
        ),
    )
    .unwrap();
    f
}

fn client(port: u16, token: &str) -> Client {
    Client::builder()
        .url(format!("http://127.0.0.1:{port}"))
        .token(token)
        .request_timeout(Some(CALL_TIMEOUT))
        .build()
        .unwrap()
}

fn stdout(e: &TrajectoryEntry) -> String {
    match &e.result {
        Some(TrajectoryResult::Exec(o)) => o.result.stdout.clone(),
        _ => String::new(),
    }
}

/// Checks a trajectory read back: seqs 1.. without a gap or a repeat, and every step of
/// `steps` with its output.
fn check(entries: &[TrajectoryEntry], steps: &[(u64, String)], what: &str) {
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=entries.len() as u64).collect();
    assert_eq!(seqs, want, "{what}: seqs");
    for (step, out) in steps {
        let e = entries
            .iter()
            .find(|e| e.step == Some(*step))
            .unwrap_or_else(|| panic!("{what}: step {step} is missing"));
        assert_eq!(&stdout(e), out, "{what}: output of step {step}");
    }
}

/// The shipped log lags its calls by about a second at most.
const SHIP_WAIT: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trajectories_outlive_their_node_and_their_sandbox() {
    let f = files();
    let Some(mut c) = Cluster::start(2, 1, |_| f.node_args()).await else {
        return;
    };
    let gw = GatewayProc::start_with(
        &c.etcd.endpoints(),
        vec![
            "--trajectory-store".into(),
            f.store.display().to_string(),
            "--auth".into(),
            f.auth.display().to_string(),
        ],
        Some(ALPHA),
    )
    .await;
    let alpha = gw.client();
    let beta = client(gw.port, BETA);
    let req = CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    };

    // An episode: 20 steps, the last with output too large to be inline in its entry.
    let sb = alpha.create(&req).await.unwrap();
    let mut steps = Vec::new();
    for step in 1..=20u64 {
        let cmd = if step == 20 {
            "head -c 10000 /dev/zero | tr '\\0' x".to_string()
        } else {
            format!("echo step-{step}")
        };
        let r = alpha
            .exec(
                &sb.id,
                &ExecRequest {
                    step: Some(step),
                    ..ExecRequest::shell(cmd)
                },
            )
            .await
            .unwrap();
        steps.push((step, r.stdout));
    }
    assert_eq!(steps[19].1.len(), 10_000);
    tokio::time::sleep(SHIP_WAIT).await;
    let owner = c.owner(&sb.id);
    let other = 1 - owner;
    c.nodes[owner].kill9();

    // Segments named by their seqs, and the large output beside them by its digest.
    let segments: Vec<String> = std::fs::read_dir(f.store.join(format!("trajectories/{}", sb.id)))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        segments
            .iter()
            .any(|n| n.ends_with("00000000000000000020.jsonl")),
        "{segments:?}"
    );
    let digest = hex::encode(sha2::Sha256::digest(steps[19].1.as_bytes()));
    assert!(f
        .store
        .join(format!("trajectories/blobs/{digest}"))
        .is_file());
    println!("segments of {}: {segments:?}", sb.id);

    // The node does not answer: the gateway reads the store.
    let read = alpha.trajectory(&sb.id, None).await.unwrap();
    check(&read, &steps, "through the gateway, node unreachable");
    let tail = alpha.trajectory(&sb.id, Some(18)).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [18, 19, 20],
        "from_seq pages as on the node"
    );
    // The other node shares the store and answers it too.
    let on_other = client(c.node_ports[other], ALPHA);
    let read = on_other.trajectory(&sb.id, None).await.unwrap();
    check(&read, &steps, "from the other node");
    // Another tenant sees nothing, here or there.
    assert!(beta.trajectory(&sb.id, None).await.is_err());
    let err = client(c.node_ports[other], BETA)
        .trajectory(&sb.id, None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    // Once the node is lost (410), the same.
    c.wait_node(owner, NodeState::Lost, Duration::from_secs(60))
        .await;
    let read = alpha.trajectory(&sb.id, None).await.unwrap();
    check(&read, &steps, "through the gateway, node lost");

    // A deleted sandbox: its log is sealed in the store and read from there.
    let gone = on_other.create(&req).await.unwrap();
    let mut gone_steps = Vec::new();
    for step in 1..=3u64 {
        let r = on_other
            .exec(
                &gone.id,
                &ExecRequest {
                    step: Some(step),
                    ..ExecRequest::shell(format!("echo gone-{step}"))
                },
            )
            .await
            .unwrap();
        gone_steps.push((step, r.stdout));
    }
    on_other.delete(&gone.id).await.unwrap();
    let sealed = f
        .store
        .join(format!("trajectories/{}/sealed.json", gone.id));
    assert!(sealed.is_file(), "sealed when deleted");
    let read = alpha.trajectory(&gone.id, None).await.unwrap();
    check(&read, &gone_steps, "a deleted sandbox, through the gateway");
    let read = on_other.trajectory(&gone.id, None).await.unwrap();
    check(&read, &gone_steps, "a deleted sandbox, on its node");
    // The node's administrator (root on its socket) reads it too.
    let read = c.nodes[other]
        .client()
        .trajectory(&gone.id, None)
        .await
        .unwrap();
    check(
        &read,
        &gone_steps,
        "a deleted sandbox, on its node, as admin",
    );
    assert!(beta.trajectory(&gone.id, None).await.is_err());

    // The killed node comes back: it re-adopts the sandbox and ships on from where the
    // store is, without sending a step twice.
    c.nodes[owner].spawn().await;
    c.wait_node(owner, NodeState::Ready, Duration::from_secs(30))
        .await;
    let r = alpha
        .exec(
            &sb.id,
            &ExecRequest {
                step: Some(21),
                ..ExecRequest::shell("echo after")
            },
        )
        .await
        .unwrap();
    steps.push((21, r.stdout));
    tokio::time::sleep(SHIP_WAIT).await;
    let read = on_other.trajectory(&sb.id, None).await.unwrap();
    check(&read, &steps, "shipped on after the restart");
    drop(gw);
    drop(c);
}

/// The files under /work of `id`: mode, kind and path of each, then sha256 of each file.
async fn tree(c: &Client, id: &str) -> String {
    let r = c
        .exec(
            id,
            &ExecRequest::shell(
                "cd /work && find . -exec stat -c '%a %F %n' {} + | sort && \
                 find . -type f -exec sha256sum {} + | sort",
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    r.stdout
}

/// A sandbox of a killed node revives on the other node from the store: asked of that node
/// directly, and through a gateway once the node is lost (the gateway places the revive on
/// a live node), as does a sandbox that was deleted on the lost node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_of_a_killed_node_revives_on_another_from_the_store() {
    let f = files();
    let Some(mut c) = Cluster::start(2, 1, |_| f.node_args()).await else {
        return;
    };
    let gw = GatewayProc::start_with(
        &c.etcd.endpoints(),
        vec![
            "--trajectory-store".into(),
            f.store.display().to_string(),
            "--auth".into(),
            f.auth.display().to_string(),
        ],
        Some(ALPHA),
    )
    .await;
    let req = CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    };
    let owner = 0;
    let other = 1;
    let alpha = client(c.node_ports[owner], ALPHA);
    let sb = alpha.create(&req).await.unwrap();
    let id = sb.id.as_str();
    let step = |cmd: &str, step: u64| ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    };
    // A deterministic episode: execs with steps, uploads (one too large to be inline),
    // mkdir, chmod, remove, and an exec fed on stdin.
    alpha
        .exec(
            id,
            &step(
                "mkdir -p /work/src && printf 'x = 1\\n' > /work/src/a.py",
                1,
            ),
        )
        .await
        .unwrap();
    alpha
        .write_file_bytes(id, "/work/src/main.py", Some(0o644), &b"print(45)\n"[..])
        .await
        .unwrap();
    alpha
        .write_file_bytes(id, "/work/big.bin", None, vec![7u8; 20_000])
        .await
        .unwrap();
    alpha
        .mkdir(id, "/work/tmp/deep", true, Some(0o700))
        .await
        .unwrap();
    alpha.chmod(id, "/work/src/main.py", 0o600).await.unwrap();
    alpha
        .write_file_bytes(id, "/work/tmp/scratch", None, &b"scratch"[..])
        .await
        .unwrap();
    alpha.remove(id, "/work/tmp", true).await.unwrap();
    let fed = ExecRequest {
        stdin: Some("line\n".repeat(2000)),
        ..step("cat > /work/fed.txt && wc -l < /work/fed.txt", 2)
    };
    assert_eq!(alpha.exec(id, &fed).await.unwrap().stdout.trim(), "2000");
    let expected = tree(&alpha, id).await;
    assert!(
        expected.contains("fed.txt") && !expected.contains("scratch"),
        "{expected}"
    );
    // A sandbox deleted on the node (its log sealed in the store).
    let gone = alpha.create(&req).await.unwrap();
    alpha
        .exec(
            &gone.id,
            &step("mkdir -p /work && echo gone > /work/gone.txt", 1),
        )
        .await
        .unwrap();
    alpha.delete(&gone.id).await.unwrap();
    tokio::time::sleep(SHIP_WAIT).await;
    c.nodes[owner].kill9();

    // The other node shares the store: it revives the sandbox from there.
    let on_other = client(c.node_ports[other], ALPHA);
    let beta = client(c.node_ports[other], BETA);
    let err = beta.revive(id, false).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let r = on_other
        .revive(id, false)
        .await
        .expect("revive from the store");
    assert_eq!(r.revived_from, sb.id);
    // 2 steps, 8 calls without a step (the tree listing included).
    assert_eq!((r.steps_replayed, r.last_step), (2, Some(2)), "{r:?}");
    assert_eq!(r.divergences, 0, "{r:?}");
    let new = r.sandbox.id.clone();
    assert_eq!(tree(&on_other, &new).await, expected);
    // The steps go on.
    let next = on_other.exec(&new, &step("echo on", 3)).await.unwrap();
    assert_eq!(next.stdout, "on\n");
    let repeated = on_other.exec(&new, &step("echo other", 2)).await;
    assert!(repeated.is_err(), "step 2 is logged already");
    on_other.delete(&new).await.unwrap();

    // Through a gateway, once the node is lost: placed on the live node, which revives from
    // the store; the deleted sandbox too. Another tenant finds neither.
    c.wait_node(owner, NodeState::Lost, Duration::from_secs(60))
        .await;
    let through = gw.client();
    let owner_id = c.nodes[owner].node.clone();
    let started = std::time::Instant::now();
    let ops = client(gw.port, OPS);
    while ops.cluster().await.map_or(true, |i| {
        !i.nodes
            .iter()
            .any(|n| n.id.as_str() == owner_id && n.state == NodeState::Lost)
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway never saw the node lost"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = through
        .revive(id, false)
        .await
        .expect("revive through the gateway");
    assert_eq!(r.revived_from, sb.id);
    assert_eq!((r.steps_replayed, r.divergences), (2, 0), "{r:?}");
    assert_eq!(c.owner(&r.sandbox.id), other, "placed on the live node");
    assert_eq!(tree(through, &r.sandbox.id).await, expected);
    through.delete(&r.sandbox.id).await.unwrap();
    let r = through
        .revive(&gone.id, false)
        .await
        .expect("revive of a deleted sandbox through the gateway");
    assert_eq!(c.owner(&r.sandbox.id), other);
    let cat = through
        .exec(&r.sandbox.id, &ExecRequest::shell("cat /work/gone.txt"))
        .await
        .unwrap();
    assert_eq!(cat.stdout, "gone\n");
    through.delete(&r.sandbox.id).await.unwrap();
    let err = client(gw.port, BETA).revive(id, false).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");

    // The killed node comes back: the old sandbox was revived elsewhere, so its node deletes
    // it before serving (fenced) and it runs nothing more.
    c.nodes[owner].spawn().await;
    c.wait_node(owner, NodeState::Ready, Duration::from_secs(30))
        .await;
    let err = alpha
        .exec(id, &ExecRequest::shell("echo back"))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "the revived original still runs: {err}");
    drop(gw);
    drop(c);
}
