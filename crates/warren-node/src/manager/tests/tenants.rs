//! Tenancy and quotas in the manager (fake runtime): ownership, per-tenant listings and keys,
//! exact quotas under concurrent creates, reservations given back, tenants surviving restarts.

use crate::testing::Calls as _;
use std::collections::BTreeMap;

use warren_types::{Caller, CreateSandboxRequest, ErrorCode, ForkRequest, Quotas, Role, SandboxId};

use crate::manager::ListFilter;
use crate::testing::{manager_in, manager_with};

fn user(name: &str, q: Quotas) -> Caller {
    Caller::tenant(name, Role::User, q)
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let (a, b) = (user("a", Quotas::default()), user("b", Quotas::default()));
    let sa = m
        .create_as(&a, CreateSandboxRequest::default())
        .await
        .unwrap();
    assert_eq!(sa.info.tenant.as_deref(), Some("a"));
    let id: SandboxId = sa.info.id.parse().unwrap();
    m.authorize(&a, &id).unwrap();
    m.authorize(&Caller::admin(), &id).unwrap();
    m.authorize(&Caller::tenant("ops", Role::Admin, Quotas::default()), &id)
        .unwrap();
    let foreign = m.authorize(&b, &id).unwrap_err().to_api();
    let unknown: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
    let missing = m.authorize(&b, &unknown).unwrap_err().to_api();
    assert_eq!(foreign.code, ErrorCode::NotFound);
    assert_eq!(
        foreign.message.replace(&id.to_string(), "ID"),
        missing.message.replace(&unknown.to_string(), "ID"),
        "a foreign sandbox reads exactly like a missing one"
    );
    // Listings are scoped by the caller's tenant.
    let scoped = |t: &str| ListFilter {
        tenant: Some(t.into()),
        ..Default::default()
    };
    assert_eq!(m.list(&scoped("a")).len(), 1);
    assert_eq!(m.list(&scoped("b")).len(), 0);
    assert_eq!(m.list(&ListFilter::default()).len(), 1);
    // A deleted sandbox's reason is told to its tenant only.
    m.delete(&id).await.unwrap();
    assert!(m
        .authorize(&a, &id)
        .unwrap_err()
        .to_api()
        .message
        .contains("deleted"));
    assert!(!m
        .authorize(&b, &id)
        .unwrap_err()
        .to_api()
        .message
        .contains("deleted"));
}

#[tokio::test]
async fn idempotency_keys_are_per_tenant_and_tenants_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let req = CreateSandboxRequest {
        idempotency_key: Some("k".into()),
        labels: BTreeMap::from([("run".into(), "1".into())]),
        ..Default::default()
    };
    let (a, b) = (user("a", Quotas::default()), user("b", Quotas::default()));
    let sa = m.create_as(&a, req.clone()).await.unwrap();
    let sb = m.create_as(&b, req.clone()).await.unwrap();
    let plain = m.create(req.clone()).await.unwrap();
    assert!(sa.created && sb.created && plain.created);
    assert_ne!(sa.info.id, sb.info.id);
    assert_ne!(sa.info.id, plain.info.id);
    let again = m.create_as(&a, req.clone()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.info.id, sa.info.id);
    m.shutdown();
    drop(m);

    let m = manager_with(dir.path(), rt, |_| {});
    m.recover().await.unwrap();
    let again = m.create_as(&b, req.clone()).await.unwrap();
    assert_eq!((again.created, again.info.id), (false, sb.info.id.clone()));
    let info = m.get(&sa.info.id.parse().unwrap()).unwrap();
    assert_eq!(info.tenant.as_deref(), Some("a"));
    assert_eq!(
        m.inner.tenants.usage("a").0,
        1,
        "adopted sandboxes count again"
    );
    // The key of a deleted sandbox is free again for its tenant only.
    m.delete(&sa.info.id.parse().unwrap()).await.unwrap();
    assert!(m.create_as(&a, req.clone()).await.unwrap().created);
    assert!(!m.create_as(&b, req).await.unwrap().created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_quota_holds_exactly_under_200_concurrent_creates() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let q = user(
        "q",
        Quotas {
            max_sandboxes: Some(7),
            ..Default::default()
        },
    );
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (m, q) = (m.clone(), q.clone());
            tokio::spawn(async move { m.create_as(&q, CreateSandboxRequest::default()).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                let e = e.to_api();
                assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
                assert!(e.message.contains("max_sandboxes"));
                assert!(e.retry_after.is_some());
            }
        }
    }
    assert_eq!(ok, 7);
    assert_eq!(m.count(), 7);
    assert_eq!(m.inner.tenants.usage("q").0, 7);
}

#[tokio::test]
async fn failed_creates_and_deletes_give_the_reservation_back() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let q = user(
        "q",
        Quotas {
            max_sandboxes: Some(2),
            max_memory_mb: Some(1024),
            ..Default::default()
        },
    );
    rt.fail_create
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..5 {
        assert!(m
            .create_as(&q, CreateSandboxRequest::default())
            .await
            .is_err());
    }
    assert_eq!(m.inner.tenants.usage("q"), (0, 0, 0.0, 0));
    rt.fail_create
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let s = m
        .create_as(&q, CreateSandboxRequest::default())
        .await
        .unwrap();
    assert_eq!(m.inner.tenants.usage("q"), (1, 512, 1.0, 0));
    // A fork of 2 would make 3: refused whole; a fork of 1 fits.
    let id: SandboxId = s.info.id.parse().unwrap();
    let two = ForkRequest {
        n: 2,
        labels: Default::default(),
    };
    let e = m.fork_as(&q, &id, two).await.unwrap_err().to_api();
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
    let one = ForkRequest {
        n: 1,
        labels: Default::default(),
    };
    let kids = m.fork_as(&q, &id, one).await.unwrap();
    assert_eq!(
        kids[0].tenant.as_deref(),
        Some("q"),
        "children belong to the parent's tenant"
    );
    assert_eq!(m.inner.tenants.usage("q"), (2, 1024, 2.0, 0));
    m.delete(&id).await.unwrap();
    assert_eq!(m.inner.tenants.usage("q"), (1, 512, 1.0, 0));
}
