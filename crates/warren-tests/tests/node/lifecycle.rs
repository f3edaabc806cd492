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
