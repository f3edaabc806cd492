//! Idempotency keys, TTL and label filters.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use warren_client::{CreateSandboxRequest, ErrorCode, SandboxState};

use crate::common::{raw_request, wait_for, Daemon};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_idempotency_key_returns_the_same_sandbox() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let req = CreateSandboxRequest {
        idempotency_key: Some("episode-42".into()),
        labels: labels(&[("k", "v")]),
        ..Default::default()
    };
    let first = c.create(&req).await.unwrap();
    let second = c.create(&req).await.unwrap();
    assert_eq!(first.id, second.id);
    assert_eq!(second.idempotency_key.as_deref(), Some("episode-42"));
    // Concurrent repeats also get the one sandbox.
    let repeats = futures::future::join_all((0..8).map(|_| c.create(&req))).await;
    for r in repeats {
        assert_eq!(r.unwrap().id, first.id);
    }
    assert_eq!(d.list().await.len(), 1);
    // The repeat answers 200, a new sandbox 201.
    let body = serde_json::to_vec(&req).unwrap();
    let (status, _, body) = raw_request(
        &d.socket,
        "POST",
        "/v1/sandboxes",
        Some("application/json"),
        body,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let other = serde_json::to_vec(&CreateSandboxRequest::default()).unwrap();
    let (status, _, body) = raw_request(
        &d.socket,
        "POST",
        "/v1/sandboxes",
        Some("application/json"),
        other,
    )
    .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    // The same key with a different request is a conflict.
    let mut changed = req.clone();
    changed.memory_mb = Some(256);
    let e = c.create(&changed).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    assert_eq!(d.list().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_ttl_expires() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let keeper = d.sandbox().await;
    let started = Instant::now();
    let info = d
        .create(&CreateSandboxRequest {
            ttl_secs: Some(2),
            ..Default::default()
        })
        .await;
    assert!(info.expires_at_ms.is_some(), "{info:?}");
    assert_eq!(d.sh_ok(&info.id, "echo alive").await, "alive\n");
    let gone = wait_for(Duration::from_secs(10), || async {
        match d.client().get(&info.id).await {
            Err(e) if e.is_not_found() => Some(started.elapsed()),
            Ok(i) if i.state.is_final() => Some(started.elapsed()),
            _ => None,
        }
    })
    .await
    .unwrap_or_else(|| panic!("a ttl_secs=2 sandbox is still running after 10 s"));
    println!("ttl_secs=2 sandbox ended after {gone:?}");
    assert!(gone >= Duration::from_millis(1900), "ended early: {gone:?}");
    assert!(gone <= Duration::from_secs(6), "ended late: {gone:?}");
    let running = d
        .client()
        .list(&BTreeMap::new(), Some(SandboxState::Running))
        .await
        .unwrap();
    assert!(running.iter().all(|s| s.id != info.id));
    let cg = wait_for(Duration::from_secs(5), || async {
        d.cgroup_dirs(&info.id).is_empty().then_some(())
    })
    .await;
    assert!(cg.is_some(), "the expired sandbox keeps its cgroups");
    // Sandboxes without a TTL are untouched.
    assert_eq!(d.sh_ok(&keeper, "echo still").await, "still\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_labels_filter_the_list() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let mut made = BTreeMap::new();
    for (name, l) in [
        ("a1", labels(&[("team", "a"), ("n", "1")])),
        ("a2", labels(&[("team", "a"), ("n", "2")])),
        ("b1", labels(&[("team", "b"), ("n", "1")])),
        ("none", BTreeMap::new()),
    ] {
        let info = d
            .create(&CreateSandboxRequest {
                labels: l.clone(),
                ..Default::default()
            })
            .await;
        assert_eq!(info.labels, l);
        made.insert(name, info.id);
    }
    let ids_for = |q: &[(&str, &str)]| {
        let q = labels(q);
        async move {
            let mut ids: Vec<String> = c
                .list(&q, None)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let sorted = |names: &[&str]| {
        let mut v: Vec<String> = names.iter().map(|n| made[n].clone()).collect();
        v.sort();
        v
    };
    assert_eq!(ids_for(&[("team", "a")]).await, sorted(&["a1", "a2"]));
    assert_eq!(ids_for(&[("team", "a"), ("n", "2")]).await, sorted(&["a2"]));
    assert_eq!(ids_for(&[("n", "1")]).await, sorted(&["a1", "b1"]));
    assert_eq!(ids_for(&[("team", "c")]).await, Vec::<String>::new());
    assert_eq!(ids_for(&[]).await, sorted(&["a1", "a2", "b1", "none"]));
    // State filter.
    let running = c
        .list(&labels(&[("team", "b")]), Some(SandboxState::Running))
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    let stopped = c
        .list(&BTreeMap::new(), Some(SandboxState::Stopped))
        .await
        .unwrap();
    assert!(stopped.is_empty(), "{stopped:?}");
    c.delete(&made["a1"]).await.unwrap();
    assert_eq!(ids_for(&[("team", "a")]).await, sorted(&["a2"]));
}

/// `warrend --socket-group G`: the API socket belongs to group G (mode 0660), so an operator
/// can give users access without root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_socket_group_owns_the_socket() {
    use std::os::unix::fs::MetadataExt;
    let Some(d) = Daemon::start_with(|_| vec!["--socket-group".into(), "daemon".into()]).await
    else {
        return;
    };
    let md = std::fs::metadata(&d.socket).unwrap();
    let daemon = nix::unistd::Group::from_name("daemon").unwrap().unwrap();
    assert_eq!(md.gid(), daemon.gid.as_raw());
    assert_eq!(md.mode() & 0o777, 0o660);

    // A user outside the group is told it is a permission problem and how to grant access,
    // not that the daemon is not running.
    use std::os::unix::process::CommandExt as _;
    let out = std::process::Command::new(crate::common::bin_dir().join("warren"))
        .args(["--url", &format!("unix://{}", d.socket.display()), "health"])
        .uid(65534)
        .gid(65534)
        .env_remove("WARREN_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--socket-group") && err.contains("usermod"),
        "{err}"
    );
    assert!(!err.contains("is warrend running"), "{err}");
}

/// Without `--default-ttl` a node gives sandboxes created without a ttl a day, and says so
/// in its health; a trainer that died leaves nothing behind for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_node_has_a_default_lifetime() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let h = d.client().health().await.unwrap();
    assert_eq!(h.extra["defaults"]["ttl_secs"], 86_400, "{h:?}");
    let sb = d.create(&CreateSandboxRequest::default()).await;
    assert_eq!(sb.expires_at_ms.unwrap() - sb.created_at_ms, 86_400_000);
    d.client().delete(&sb.id).await.unwrap();
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("deleted 1d after their creation"), "{log}");
}

/// `warrend --default-ttl/--max-ttl/--default-exec-timeout`: reported by health, applied to
/// creates and commands, and a lifetime can be extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_node_defaults_for_long_runs() {
    let Some(d) = Daemon::start_with(|_| {
        [
            "--default-ttl",
            "10m",
            "--max-ttl",
            "1h",
            "--default-exec-timeout",
            "1s",
        ]
        .map(String::from)
        .to_vec()
    })
    .await
    else {
        return;
    };
    let h = d.client().health().await.unwrap();
    assert_eq!(h.extra["defaults"]["ttl_secs"], 600, "{h:?}");
    assert_eq!(h.extra["defaults"]["max_ttl_secs"], 3600);
    let sb = d.create(&CreateSandboxRequest::default()).await;
    assert_eq!(sb.expires_at_ms.unwrap() - sb.created_at_ms, 600_000);
    // A command without a timeout gets the node's.
    let r = d.sh(&sb.id, "sleep 30").await;
    assert!(r.timed_out, "{r:?}");
    let info = d.client().extend(&sb.id, 3000).await.unwrap();
    assert!(info.expires_at_ms.unwrap() > sb.expires_at_ms.unwrap());
    let e = d.client().extend(&sb.id, 7200).await.unwrap_err();
    assert!(e.to_string().contains("3600"), "{e}");
    d.client().delete(&sb.id).await.unwrap();
}
