//! Malformed and oversized API requests: typed 4xx answers, never a 5xx, nothing created.

use crate::common::raw_request;
use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_typed_errors() {
    let Some(s) = Scene::new().await else { return };
    let sock = s.d.socket.clone();
    let before = s.d.list().await.len();
    let sb = format!("/v1/sandboxes/{}", s.a);
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let huge = vec![b' '; 40 << 20];
    let long_id = format!("/v1/sandboxes/{}", "a".repeat(10_000));
    let json = Some("application/json");
    let cases: Vec<(&str, String, Option<&str>, Vec<u8>)> = vec![
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            deep.clone().into_bytes(),
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            format!("{{\"labels\":{deep}}}").into_bytes(),
        ),
        ("POST", "/v1/sandboxes".into(), json, huge),
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            b"{\"image\":\"\xff\xfe\"}".to_vec(),
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            b"{\"cpus\":1e999}".to_vec(),
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            b"{\"pids\":18446744073709551616}".to_vec(),
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            json,
            b"{\"cpu_class\":\"realtime\"}".to_vec(),
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            Some("text/plain"),
            b"{}".to_vec(),
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            b"{\"argv\":[]}".to_vec(),
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            b"{\"argv\":[\"a\\u0000b\"]}".to_vec(),
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            b"{\"shell\":\"true\",\"timeout_secs\":-1}".to_vec(),
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            b"{\"shell\":\"true\",\"max_output_bytes\":99999999999999}".to_vec(),
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            b"{\"shell\":\"true\",\"env\":{\"A=B\":\"c\"}}".to_vec(),
        ),
        ("GET", long_id, None, vec![]),
        (
            "GET",
            format!("{sb}/files?path={}", "%2F..".repeat(5000)),
            None,
            vec![],
        ),
        ("GET", format!("{sb}/files?path=%00"), None, vec![]),
        (
            "GET",
            format!("{sb}/files?path=/etc/passwd&path=/etc/shadow"),
            None,
            vec![],
        ),
        ("GET", format!("{sb}/files?path=%ZZ"), None, vec![]),
        ("GET", format!("{sb}/processes/-1"), None, vec![]),
        ("GET", format!("{sb}/processes/99999999999"), None, vec![]),
        ("DELETE", "/v1/sandboxes/..%2F..%2Fetc".into(), None, vec![]),
    ];
    for (method, path, ct, body) in cases {
        let shown = format!("{method} {}", &path[..path.len().min(80)]);
        let (status, ctype, resp) = raw_request(&sock, method, &path, ct, body).await;
        assert!(
            (400..500).contains(&status),
            "{shown}: status {status}: {}",
            String::from_utf8_lossy(&resp[..resp.len().min(300)])
        );
        if status != 404 && status != 405 {
            assert!(
                ctype.starts_with("application/json"),
                "{shown}: content type {ctype}"
            );
            let v: serde_json::Value =
                serde_json::from_slice(&resp).unwrap_or_else(|e| panic!("{shown}: not JSON ({e})"));
            assert!(
                v["error"]["code"].is_string(),
                "{shown}: no error code: {v}"
            );
        }
    }
    assert_eq!(
        s.d.list().await.len(),
        before,
        "a malformed request created a sandbox"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_can_never_fit_the_node_are_refused_before_anything_starts() {
    let Some(s) = Scene::new().await else { return };
    let sock = s.d.socket.clone();
    let before = s.d.list().await.len();
    let host_mb = warren_sys::meminfo::MemInfo::read().unwrap().total_mb();
    let cases = [
        // More memory than the host has (plus the VMM's share).
        format!(
            r#"{{"substrate":"microvm","memory_mb":{}}}"#,
            host_mb + 1024
        ),
        format!(r#"{{"substrate":"vm","memory_mb":{host_mb}}}"#),
        // A microVM with a network that still cannot fit: the refusal comes before the
        // namespace, the bridge or QEMU.
        format!(
            r#"{{"substrate":"microvm","memory_mb":{},"network":{{"mode":"allow","allow":[{{"cidr":"10.254.1.0/24","ports":443,"protocol":"tcp"}}]}}}}"#,
            host_mb + 1024
        ),
        // A writable layer in memory larger than the memory limit.
        r#"{"memory_mb":64,"disk_mb":4096,"disk_medium":"memory"}"#.to_string(),
    ];
    // The VM directory of this daemon: a VM that booted leaves its template there.
    let vm_dir = std::env::var_os("WARREN_VM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| s.d.state_dir.join("vm"));
    let templates = || std::fs::read_dir(vm_dir.join("templates")).map_or(0, |d| d.count());
    let made = templates();
    for body in cases {
        let (status, _, reply) = raw_request(
            &sock,
            "POST",
            "/v1/sandboxes",
            Some("application/json"),
            body.clone(),
        )
        .await;
        let reply = String::from_utf8_lossy(&reply);
        assert_eq!(status, 400, "{body}: {status} {reply}");
        assert!(reply.contains("invalid_request"), "{body}: {reply}");
        assert_eq!(
            templates(),
            made,
            "{body}: a VM was booted before the refusal"
        );
    }
    assert_eq!(s.d.list().await.len(), before, "something was created");
    s.assert_unaffected().await;
}
