//! Two daemons on one host and their sandbox address pools: the default pool follows the
//! node id, and a daemon whose pool is already in use on the host says so plainly instead of
//! failing its first policy with an internal error.

use warren_client::{ClientError, CreateSandboxRequest};
use warren_types::NetworkPolicy;

use crate::common::Daemon;

fn allow() -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "mode": "allow",
        "allow": [{"cidr": "10.254.77.0/24", "ports": 443, "protocol": "tcp"}]
    }))
    .unwrap()
}

fn with_network() -> CreateSandboxRequest {
    CreateSandboxRequest {
        network: allow(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_pools_are_reported_and_default_pools_differ() {
    // A private pool only this test uses, the same for both daemons.
    let pool = "10.197.42.0/24";
    let config = |dir: &std::path::Path| {
        let p = dir.join("net.toml");
        std::fs::write(&p, format!("pool = \"{pool}\"\n")).unwrap();
        vec!["--network-config".into(), p.display().to_string()]
    };
    let Some(a) = Daemon::start_with(config).await else {
        return;
    };
    let first = a.create(&with_network()).await;
    // The second daemon starts while the first one's link holds an address of the pool.
    let b = Daemon::start_with(config).await.expect("second daemon");
    match b.client().create(&with_network()).await {
        Err(ClientError::Api { error, .. }) => {
            assert!(
                error.message.contains("overlaps") && error.message.contains(pool),
                "{error:?}"
            );
        }
        other => panic!("a policy on an overlapping pool: {other:?}"),
    }
    // Policy none still works there, and the first daemon is unharmed.
    let plain = b.create(&CreateSandboxRequest::default()).await;
    b.client().delete(&plain.id).await.unwrap();
    let ip = a.sh_ok(&first.id, "cat /etc/resolv.conf").await;
    assert!(ip.contains("nameserver 10.197.42."), "{ip}");
    a.client().delete(&first.id).await.unwrap();

    // Without a configured pool, two node ids get two pools.
    let c = Daemon::start().await.expect("third daemon");
    let d = Daemon::start().await.expect("fourth daemon");
    let (pc, pd) = (
        warren_net::default_pool(&c.node),
        warren_net::default_pool(&d.node),
    );
    // 48 pools: two random node ids share one now and then; then there is nothing to see.
    if pc != pd {
        let sc = c.create(&with_network()).await;
        let sd = d.create(&with_network()).await;
        for (dm, s) in [(&c, &sc), (&d, &sd)] {
            dm.client().delete(&s.id).await.unwrap();
        }
    }
}

/// A create with a policy takes its link's addresses before the sandbox starts (its
/// resolv.conf is written as it starts): creates that fail give them back, so a small pool
/// still serves as many sandboxes as it has links, and refuses the next one plainly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_creates_give_their_link_back() {
    // A /28: four links.
    let config = |dir: &std::path::Path| {
        let p = dir.join("net.toml");
        std::fs::write(&p, "pool = \"10.197.43.0/28\"\n").unwrap();
        vec!["--network-config".into(), p.display().to_string()]
    };
    let Some(d) = Daemon::start_with(config).await else {
        return;
    };
    for _ in 0..6 {
        let bad = CreateSandboxRequest {
            image: warren_types::ImageRef::Name("no-such-image:1".into()),
            ..with_network()
        };
        assert!(d.client().create(&bad).await.is_err());
    }
    let mut made = Vec::new();
    for _ in 0..4 {
        let s = d.create(&with_network()).await;
        let conf = d.sh_ok(&s.id, "cat /etc/resolv.conf").await;
        assert!(conf.contains("nameserver 10.197.43."), "{conf}");
        made.push(s);
    }
    match d.client().create(&with_network()).await {
        Err(ClientError::Api { error, .. }) => {
            assert_eq!(error.code.as_str(), "limit_exceeded", "{error:?}");
        }
        other => panic!("a fifth link in a pool of four: {other:?}"),
    }
    for s in made {
        d.client().delete(&s.id).await.unwrap();
    }
    // Deleted sandboxes give theirs back too.
    let again = d.create(&with_network()).await;
    d.client().delete(&again.id).await.unwrap();
}
