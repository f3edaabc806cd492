//! Tenancy: another tenant's sandbox answers exactly like a missing one on every route;
//! listings, labels and idempotency keys are per tenant; admins see everything.

use std::collections::BTreeMap;

use futures::StreamExt;
use warren_client::{ClientError, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest};
use warren_types::NetworkPolicy;

use crate::common::unknown_id;
use crate::{auth_file, daemon, tcp, TOKEN_A, TOKEN_B, TOKEN_OPS};

/// The answer to `r` with the sandbox id made neutral, for comparing a foreign sandbox's
/// answer with a missing one's.
fn not_found<T: std::fmt::Debug>(what: &str, r: Result<T, ClientError>, id: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: another tenant's sandbox answered {v:?}"),
        Err(e) => {
            assert_eq!(e.code(), Some(ErrorCode::NotFound), "{what}: {e}");
            assert_eq!(e.status(), Some(404), "{what}: {e}");
            e.to_string().replace(id, "<id>")
        }
    }
}

/// Every route that names a sandbox, called by `c` on `id`; answers one line per route.
async fn every_route(c: &warren_client::Client, id: &str, pid: u32) -> Vec<String> {
    let fork: ForkRequest = serde_json::from_value(serde_json::json!({"n": 1})).unwrap();
    let sh = ExecRequest::shell("touch /tmp/intruder");
    let mut out = vec![
        not_found("get", c.get(id).await, id),
        not_found("pause", c.pause(id).await, id),
        not_found("resume", c.resume(id).await, id),
        not_found("fork", c.fork(id, &fork).await, id),
        not_found("trajectory", c.trajectory(id, None).await, id),
        not_found("get network", c.get_network(id).await, id),
        not_found(
            "set network",
            c.set_network(id, &NetworkPolicy::default()).await,
            id,
        ),
        not_found("exec", c.exec(id, &sh).await, id),
        not_found("spawn", c.spawn(id, &sh).await, id),
        not_found("list processes", c.list_processes(id).await, id),
        not_found("get process", c.get_process(id, pid).await, id),
        not_found("wait process", c.wait_process(id, pid, None).await, id),
        not_found("kill process", c.kill_process(id, pid, Some(9)).await, id),
        not_found("pty", c.pty(id, "sh", 80, 24).await, id),
        not_found(
            "read file",
            c.read_file_bytes(id, "/etc/hostname").await,
            id,
        ),
        not_found(
            "write file",
            c.write_file_bytes(id, "/tmp/intruder", None, bytes::Bytes::from_static(b"x"))
                .await,
            id,
        ),
        not_found(
            "remove file",
            c.remove(id, "/etc/hostname", false).await,
            id,
        ),
        not_found("stat", c.stat(id, "/etc").await, id),
        not_found("list dir", c.list_dir(id, "/").await, id),
        not_found(
            "mkdir",
            c.mkdir(id, "/tmp/intruder-dir", false, None).await,
            id,
        ),
        not_found("chmod", c.chmod(id, "/etc/hostname", 0o777).await, id),
        not_found("delete", c.delete(id).await, id),
    ];
    let stream = match c.exec_stream(id, &sh).await {
        Ok(mut s) => Err(format!("{:?}", s.next().await)),
        Err(e) => Ok(e),
    };
    match stream {
        Ok(e) => out.push(not_found::<()>("exec stream", Err(e), id)),
        Err(ev) => panic!("exec stream: another tenant's sandbox streamed {ev}"),
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_sandbox_is_404_on_every_route() {
    let Some((d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let (a, b) = (tcp(port, Some(TOKEN_A)), tcp(port, Some(TOKEN_B)));
    let info = a.create(&CreateSandboxRequest::default()).await.unwrap();
    assert_eq!(info.tenant.as_deref(), Some("team-a"));
    let id = info.id;
    let pid = a
        .spawn(&id, &ExecRequest::shell("sleep 600"))
        .await
        .unwrap()
        .pid;
    let before = a.trajectory(&id, None).await.unwrap().len();

    let foreign = every_route(&b, &id, pid).await;
    let missing_id = unknown_id(&d.node);
    let missing = every_route(&b, &missing_id, pid).await;
    assert_eq!(
        foreign, missing,
        "a foreign sandbox must answer exactly like a missing one"
    );

    // Nothing of it happened.
    let now = a.get(&id).await.unwrap();
    assert_eq!(now.state, warren_client::SandboxState::Running);
    assert_eq!(a.trajectory(&id, None).await.unwrap().len(), before);
    let r = a
        .exec(
            &id,
            &ExecRequest::shell("ls /tmp/intruder /tmp/intruder-dir 2>&1; cat /etc/hostname"),
        )
        .await
        .unwrap();
    assert!(r.stdout.contains("No such file"), "{r:?}");
    assert_eq!(
        a.get_process(&id, pid).await.unwrap().state,
        warren_client::ProcessState::Running
    );
    // The owner and an admin tenant reach it.
    let ops = tcp(port, Some(TOKEN_OPS));
    assert_eq!(
        ops.get(&id).await.unwrap().tenant.as_deref(),
        Some("team-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_labels_and_keys_are_per_tenant() {
    let Some((d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let (a, b, ops) = (
        tcp(port, Some(TOKEN_A)),
        tcp(port, Some(TOKEN_B)),
        tcp(port, Some(TOKEN_OPS)),
    );
    let labels: BTreeMap<String, String> = [("run".to_string(), "7".to_string())].into();
    let req = CreateSandboxRequest {
        labels: labels.clone(),
        idempotency_key: Some("step-1".into()),
        ..Default::default()
    };
    let sa = a.create(&req).await.unwrap();
    let sb = b.create(&req).await.unwrap();
    assert_ne!(
        sa.id, sb.id,
        "one idempotency key, two tenants, two sandboxes"
    );
    assert_eq!(
        a.create(&req).await.unwrap().id,
        sa.id,
        "the key still works per tenant"
    );
    let ids = |v: Vec<warren_client::SandboxInfo>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(a.list(&labels, None).await.unwrap()),
        vec![sa.id.clone()]
    );
    assert_eq!(
        ids(b.list(&BTreeMap::new(), None).await.unwrap()),
        vec![sb.id.clone()]
    );
    let mut all = ids(ops.list(&labels, None).await.unwrap());
    all.sort();
    let mut want = vec![sa.id.clone(), sb.id.clone()];
    want.sort();
    assert_eq!(all, want, "an admin tenant sees everything");
    assert_eq!(
        d.list().await.len(),
        2,
        "root on the socket sees everything"
    );

    // Node-wide operations need the admin role.
    for (what, r) in [
        ("gc", b.gc_images().await.map(|_| ())),
        (
            "delete image",
            b.delete_image("no-such-image-here").await.map(|_| ()),
        ),
        ("metrics", b.metrics().await.map(|_| ())),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{what}: {e}");
        assert_eq!(e.status(), Some(403));
    }
    ops.metrics().await.unwrap();
    // Images are readable by every tenant.
    b.image("default").await.unwrap();

    // A deleted sandbox's reason is told only to its own tenant.
    a.delete(&sa.id).await.unwrap();
    let own = a.get(&sa.id).await.unwrap_err().to_string();
    let other = b.get(&sa.id).await.unwrap_err().to_string();
    assert!(own.contains("deleted"), "{own}");
    assert!(!other.contains("deleted"), "{other}");
}

/// No answer to a tenant depends on what another tenant did: its health counts its own
/// sandboxes only and shows neither the node's load nor its state size (outputs are stored
/// once per content, so that size would tell whether another tenant printed the same bytes),
/// and an output another tenant printed before costs the same as a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_learns_nothing_of_anothers_outputs_or_counts() {
    let Some((_d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let (a, b, ops) = (
        tcp(port, Some(TOKEN_A)),
        tcp(port, Some(TOKEN_B)),
        tcp(port, Some(TOKEN_OPS)),
    );
    let req = CreateSandboxRequest::default();
    let (a1, a2) = (
        a.create(&req).await.unwrap().id,
        a.create(&req).await.unwrap().id,
    );
    let b1 = b.create(&req).await.unwrap().id;
    b.create(&req).await.unwrap();
    b.create(&req).await.unwrap();

    // B prints 256 KiB (kept as a blob, stored once per content).
    let print = |c: char| format!("head -c 262144 /dev/zero | tr '\\0' '{c}'");
    let out = b.exec(&b1, &ExecRequest::shell(print('x'))).await.unwrap();
    assert_eq!(out.stdout.len(), 262_144);

    let health = |h: warren_client::Health| serde_json::Value::Object(h.extra);
    let ha = health(a.health().await.unwrap());
    assert_eq!(ha["sandboxes"], 2, "{ha}");
    assert!(ha["state"].get("bytes").is_none(), "{ha}");
    assert!(ha["state"]["max_bytes"].is_u64(), "{ha}");
    assert!(ha.get("load").is_none(), "{ha}");
    let hops = health(ops.health().await.unwrap());
    assert_eq!(hops["sandboxes"], 5, "{hops}");
    assert!(hops["state"]["bytes"].is_u64(), "{hops}");
    assert!(hops["load"].is_object(), "{hops}");

    // A prints what B printed, then something nobody printed: the same cost either way.
    a.exec(&a1, &ExecRequest::shell(print('x'))).await.unwrap();
    a.exec(&a2, &ExecRequest::shell(print('y'))).await.unwrap();
    let cost = |s: warren_types::SandboxStats| s.trajectory_bytes;
    let (seen, new) = (
        cost(a.stats(&a1).await.unwrap()),
        cost(a.stats(&a2).await.unwrap()),
    );
    // Both count the whole output; only their entries' encodings (durations) may differ.
    assert!(
        seen >= 262_144 && new >= 262_144 && seen.abs_diff(new) < 1024,
        "an output another tenant printed costs {seen} bytes, a new one {new}"
    );
    let after = health(a.health().await.unwrap());
    assert!(after["state"].get("bytes").is_none(), "{after}");
}
