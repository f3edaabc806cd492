//! Node-wide safe defaults: default and maximum lifetime, extending a lifetime, the default
//! exec timeout, and binary stdin.

use warren_types::{CreateSandboxRequest, ErrorCode, ExecRequest, OutputEncoding, SandboxId};

use crate::testing::manager_in;
use crate::testing::Calls as _;

fn id_of(info: &warren_types::SandboxInfo) -> SandboxId {
    info.id.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_and_maximum_lifetimes_apply_to_creates() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |c| {
        c.default_ttl_secs = Some(600);
        c.max_ttl_secs = Some(3600);
    });
    let c = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let ttl = c.expires_at_ms.unwrap() - c.created_at_ms;
    assert_eq!(ttl, 600_000);
    let asked = CreateSandboxRequest {
        ttl_secs: Some(1200),
        ..Default::default()
    };
    let c = m.create(asked).await.unwrap().info;
    assert_eq!(c.expires_at_ms.unwrap() - c.created_at_ms, 1_200_000);
    let over = CreateSandboxRequest {
        ttl_secs: Some(7200),
        ..Default::default()
    };
    let e = m.create(over).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    assert!(e.to_string().contains("3600"), "{e}");

    // Only a cap: sandboxes without a ttl get the cap.
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |c| c.max_ttl_secs = Some(60));
    let c = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    assert_eq!(c.expires_at_ms.unwrap() - c.created_at_ms, 60_000);
    // Neither: no expiry, as before.
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let c = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    assert_eq!(c.expires_at_ms, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_can_be_extended_within_the_cap_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = std::sync::Arc::new(crate::testing::FakeRuntime::default());
    let cfg = |c: &mut crate::NodeConfig| c.max_ttl_secs = Some(3600);
    let id = {
        let m = crate::testing::manager_with(dir.path(), rt.clone(), cfg);
        let req = CreateSandboxRequest {
            ttl_secs: Some(10),
            ..Default::default()
        };
        let id = id_of(&m.create(req).await.unwrap().info);
        let before = crate::manager::now_ms();
        let info = m.extend(&id, 1800).await.unwrap();
        let e = info.expires_at_ms.unwrap();
        assert!(e >= before + 1_800_000 && e <= crate::manager::now_ms() + 1_800_000);
        for bad in [0, 3601] {
            assert_eq!(
                m.extend(&id, bad).await.unwrap_err().code(),
                ErrorCode::InvalidRequest
            );
        }
        let unknown: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
        assert_eq!(
            m.extend(&unknown, 5).await.unwrap_err().code(),
            ErrorCode::NotFound
        );
        id
    };
    let m = crate::testing::manager_with(dir.path(), rt, cfg);
    m.recover().await.unwrap();
    let info = m.get(&id).unwrap();
    assert!(info.expires_at_ms.unwrap() > info.created_at_ms + 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exec_timeout_applies_when_a_request_names_none() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |c| c.default_exec_timeout_secs = Some(90.0));
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    let spec = |r: warren_types::ExecResult| -> warren_proto::ExecSpec {
        serde_json::from_str(&r.stdout).unwrap()
    };
    let r = m
        .procs()
        .exec(&id, ExecRequest::argv(["true"]))
        .await
        .unwrap();
    assert_eq!(spec(r).timeout_ms, Some(90_000));
    let mut own = ExecRequest::argv(["true"]);
    own.timeout_secs = Some(2.0);
    let r = m.procs().exec(&id, own).await.unwrap();
    assert_eq!(spec(r).timeout_ms, Some(2_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_may_be_any_bytes_in_base64() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = Some("/wAB".into()); // ff 00 01
    req.stdin_encoding = OutputEncoding::Base64;
    req.encoding = OutputEncoding::Base64;
    let r = m.procs().exec(&id, req).await.unwrap();
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(&r.stdout)
        .unwrap();
    // The fake agent echoes stdin after the spec it got.
    assert!(raw.ends_with(&[0xff, 0x00, 0x01]), "{raw:?}");
    let mut bad = ExecRequest::argv(["cat"]);
    bad.stdin = Some("not base64!".into());
    bad.stdin_encoding = OutputEncoding::Base64;
    assert_eq!(
        m.procs().exec(&id, bad).await.unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
}
