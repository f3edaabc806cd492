//! The web dashboard (`/ui`) in a real browser: Debian's headless `chromium` loads every page
//! from a live `warrend` holding a few sandboxes, the test reads the DOM the page drew (the
//! page marks itself drawn in `body[data-ready]` and shows script errors in `#errors`) and keeps
//! a screenshot of each page in `target/ui-screenshots/`.

#[path = "../common/browser.rs"]
mod browser;
#[path = "../common/mod.rs"]
mod common;

use warren_client::{CreateSandboxRequest, ExecRequest};

use browser::{assert_clean, chromium, count, free_port, load, text_of};
use common::{repo_root, skip, test_root, Daemon};

/// The chart `title`'s axis (its `data-ticks`, as drawn): at least two ticks from 0 up, each
/// in `unit`, no two alike.
fn axis_reads_well(dom: &str, title: &str, unit: &str) {
    let at = dom
        .find(&format!("data-chart=\"{title}\""))
        .unwrap_or_else(|| panic!("no chart {title}"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let ticks = tag
        .split("data-ticks=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap_or_else(|| panic!("chart {title} has no ticks: {tag}"));
    let ticks: Vec<&str> = ticks.split('|').collect();
    assert!(ticks.len() >= 2, "{title}: {ticks:?}");
    let values: Vec<f64> = ticks
        .iter()
        .map(|t| {
            let n = t
                .strip_suffix(unit)
                .unwrap_or_else(|| panic!("{title}: {t:?} not in {unit:?}"));
            n.parse().unwrap_or_else(|_| panic!("{title}: {t:?}"))
        })
        .collect();
    assert_eq!(values[0], 0.0, "{title}: {ticks:?}");
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{title}: {ticks:?}");
    let distinct: std::collections::BTreeSet<&&str> = ticks.iter().collect();
    assert_eq!(distinct.len(), ticks.len(), "{title}: {ticks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_page_loads_in_chromium_and_shows_the_node() {
    let browser = match chromium() {
        Ok(b) => b,
        Err(why) => return skip(why),
    };
    let port = free_port();
    let Some(d) =
        Daemon::start_with(|_| vec!["--listen".into(), format!("127.0.0.1:{port}")]).await
    else {
        return;
    };
    let c = d.client();
    let mut ids = Vec::new();
    for i in 0..3 {
        let req = CreateSandboxRequest {
            memory_mb: Some(128),
            labels: [
                ("suite".to_string(), "ui".to_string()),
                ("n".to_string(), i.to_string()),
            ]
            .into(),
            ..Default::default()
        };
        ids.push(d.create(&req).await.id);
    }
    let busy = &ids[0];
    d.sh_ok(busy, "echo hello-from-the-timeline; echo to-stderr >&2")
        .await;
    c.write_file_bytes(
        busy,
        "/root/ui-file.txt",
        None,
        &b"shown in the browser"[..],
    )
    .await
    .unwrap();
    // A terminal session: the timeline shows it as a transcript, typed input marked.
    let mut pty = c.pty(busy, "/bin/sh", 80, 24).await.unwrap();
    pty.send(&b"echo from-a-$((2*3))-terminal; exit\n"[..])
        .await
        .unwrap();
    while let Some(ev) = tokio::time::timeout(std::time::Duration::from_secs(20), pty.next_event())
        .await
        .expect("the terminal ends")
        .unwrap()
    {
        if matches!(ev, warren_client::PtyEvent::Exit { .. }) {
            break;
        }
    }
    drop(pty);
    common::wait_for(std::time::Duration::from_secs(10), || async {
        let log = c.trajectory(busy, None).await.unwrap();
        log.iter()
            .any(|e| e.call.kind() == "terminal")
            .then_some(())
    })
    .await
    .expect("the terminal is in the trajectory");
    let proc = c
        .spawn(
            busy,
            &ExecRequest {
                argv: Some(vec!["sleep".into(), "300".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    c.pause(&ids[2]).await.unwrap();
    let images = c.images().await.unwrap();
    assert!(!images.is_empty(), "the default image is registered");

    let shots = repo_root().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let profile = test_root().join(format!("{}-chromium", d.node));
    let base = format!("http://127.0.0.1:{port}/ui");
    let page = |hash: &str, name: &str| {
        let l = load(
            &browser,
            &profile,
            &format!("{base}#{hash}"),
            &shots.join(format!("{name}.png")),
        );
        let shot = shots.join(format!("{name}.png"));
        let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1000, "no screenshot of {name} at {}", shot.display());
        l
    };

    // Overview: counts by state and substrate, the node with its memory, both charts.
    let l = page("/", "overview");
    assert_clean("overview", &l);
    axis_reads_well(&l.dom, "Sandboxes", "");
    axis_reads_well(&l.dom, "Host CPU busy", " %");
    assert_eq!(text_of(&l.dom, "id=\"count-sandboxes\""), Some("3"));
    assert_eq!(text_of(&l.dom, "id=\"count-running\""), Some("2"));
    assert_eq!(text_of(&l.dom, "id=\"count-paused\""), Some("1"));
    assert!(
        l.dom.contains(&format!("data-node=\"{}\"", d.node)),
        "{}",
        l.dom
    );
    let by_substrate = l
        .dom
        .find("data-substrate=\"container\"")
        .expect("container row");
    assert!(l.dom[by_substrate..].contains("<td class=\"num\">3</td>"));
    assert!(count(&l.dom, "<canvas") >= 2);
    assert!(!text_of(&l.dom, "id=\"memory\"").unwrap().is_empty());
    // Live over the node's event stream, not by polling: its first load event was drawn.
    assert!(l.dom.contains("data-live=\"sse\""), "{}", l.dom);
    assert!(l.dom.contains("data-live-events=\""), "{}", l.dom);

    // The table: all three, then filtered by label, by state, and paged.
    let l = page("/sandboxes", "sandboxes");
    assert_clean("sandboxes", &l);
    assert!(l.dom.contains("data-live=\"sse\""), "{}", l.dom);
    for id in &ids {
        assert!(l.dom.contains(&format!("data-id=\"{id}\"")), "{id} listed");
    }
    let l = page("/sandboxes?label=suite%3Dui%2Cn%3D1", "sandboxes-label");
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 1, "{}", l.dom);
    assert!(l.dom.contains(&format!("data-id=\"{}\"", ids[1])));
    let l = page("/sandboxes?state=paused", "sandboxes-paused");
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 1);
    assert!(l.dom.contains(&format!("data-id=\"{}\"", ids[2])));
    let l = page("/sandboxes?substrate=microvm", "sandboxes-microvm");
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 0);
    let l = page("/sandboxes?limit=2", "sandboxes-paged");
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 2);
    assert!(l.dom.contains(&format!("data-id=\"{}\"", ids[0])));
    assert!(!l.dom.contains(&format!("data-id=\"{}\"", ids[2])));
    assert!(!l.dom.contains("id=\"next\" disabled"), "a next page");
    let l = page(
        &format!("/sandboxes?limit=2&after={}", ids[1]),
        "sandboxes-page2",
    );
    assert_clean("sandboxes", &l);
    assert_eq!(count(&l.dom, "<tr data-id="), 1);
    assert!(l.dom.contains(&format!("data-id=\"{}\"", ids[2])));
    assert!(l.dom.contains("id=\"next\" disabled"), "the last page");

    // One sandbox: its stats, processes, the timeline with outputs, the file browser.
    let l = page(&format!("/sandbox/{busy}?path=%2Froot"), "sandbox");
    assert_clean("sandbox", &l);
    assert!(text_of(&l.dom, "id=\"stat-memory\"")
        .unwrap()
        .contains("/ 128.0 MiB"));
    assert!(l.dom.contains(&format!("data-pid=\"{}\"", proc.pid)));
    assert!(l.dom.contains("sleep 300"));
    assert!(
        l.dom.contains("data-seq=\"1\" data-kind=\"exec\""),
        "{}",
        l.dom
    );
    assert!(l.dom.contains("hello-from-the-timeline"));
    assert!(l.dom.contains("<pre class=\"stderr\">to-stderr"));
    assert!(l.dom.contains("data-kind=\"write_file\""));
    assert!(l.dom.contains("data-kind=\"spawn\""));
    assert!(l.dom.contains("data-kind=\"terminal\""));
    assert!(l.dom.contains("<pre class=\"terminal\">"), "{}", l.dom);
    assert!(l.dom.contains("<span class=\"typed\""));
    assert!(l.dom.contains("from-a-6-terminal"));
    assert!(l.dom.contains("data-name=\"ui-file.txt\""), "{}", l.dom);
    assert_eq!(text_of(&l.dom, "id=\"cwd\""), Some("/root"));
    assert!(count(&l.dom, "<canvas") >= 2);
    // The charts' axes: ticks that read differently, in the chart's unit (an idle sandbox's
    // CPU once read 0.0 five times).
    for (chart, unit) in [("CPU", " %"), ("Memory", " MiB")] {
        axis_reads_well(&l.dom, chart, unit);
    }
    // A paused one: its page draws too, and offers resume.
    let l = page(&format!("/sandbox/{}", ids[2]), "sandbox-paused");
    assert_clean("sandbox", &l);
    assert!(l.dom.contains(">Resume</button>"));
    assert_eq!(
        c.get(&ids[2]).await.unwrap().state,
        warren_client::SandboxState::Paused,
        "looking at a paused sandbox leaves it paused"
    );

    // Images and pools, as the API lists them.
    let l = page("/images", "images");
    assert_clean("images", &l);
    for im in &images {
        assert!(
            l.dom.contains(&format!("data-ref=\"{}\"", im.reference)),
            "{} listed",
            im.reference
        );
    }
    let l = page("/pools", "pools");
    assert_clean("pools", &l);
    let pools = c.function_pools().await.unwrap();
    assert!(text_of(&l.dom, "id=\"pools-summary\"")
        .unwrap()
        .starts_with(&format!("{} pools", pools.pools.len())));

    // An unknown sandbox is an error the page shows (and the test sees).
    let l = page(
        &format!("/sandbox/{}", common::unknown_id(&d.node)),
        "missing",
    );
    assert!(l.dom.contains("class=\"api-error\""), "{}", l.dom);
    assert!(l.dom.contains("not_found"));
    let _ = std::fs::remove_dir_all(&profile);
}

/// A `user` token sees its tenant's sandboxes read-only (no pause, resume or delete); an
/// `admin` token is offered them. The token is handed over in the fragment, as a link from
/// `warren` or a runbook would, and leaves the address before the page fetches anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_token_sees_a_read_only_dashboard_and_an_admin_may_change() {
    let browser = match chromium() {
        Ok(b) => b,
        Err(why) => return skip(why),
    };
    const USER: &str = "ui-user-token-0123456789";
    const ADMIN: &str = "ui-admin-token-0123456789";
    let Some((d, port)) =
        Daemon::start_with_tenants(&[("team-ui", "user", USER), ("ops", "admin", ADMIN)]).await
    else {
        return;
    };
    let user = warren_client::Client::builder()
        .url(format!("http://127.0.0.1:{port}"))
        .token(USER)
        .request_timeout(Some(common::CALL_TIMEOUT))
        .build()
        .unwrap();
    let health = user.health().await.unwrap();
    assert_eq!(
        health.extra["caller"],
        serde_json::json!({"tenant": "team-ui", "role": "user"})
    );
    let sb = user
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            ..Default::default()
        })
        .await
        .unwrap();

    let shots = repo_root().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let base = format!("http://127.0.0.1:{port}/ui");
    let page = |token: &str, hash: &str, name: &str| {
        let profile = test_root().join(format!("{}-{name}-chromium", d.node));
        let l = load(
            &browser,
            &profile,
            &format!("{base}#{hash}?token={token}"),
            &shots.join(format!("{name}.png")),
        );
        let _ = std::fs::remove_dir_all(&profile);
        l
    };
    let l = page(USER, "/sandboxes", "readonly-sandboxes");
    assert_clean("sandboxes", &l);
    assert!(
        l.dom.contains(&format!("data-id=\"{}\"", sb.id)),
        "{}",
        l.dom
    );
    assert!(l.dom.contains("data-readonly"), "{}", l.dom);
    assert!(!l.dom.contains(">Delete</button>"), "{}", l.dom);
    assert!(!l.dom.contains(">Pause</button>"), "{}", l.dom);
    assert!(
        text_of(&l.dom, "id=\"server\"")
            .unwrap()
            .contains("team-ui (user)"),
        "{}",
        l.dom
    );
    let l = page(USER, &format!("/sandbox/{}", sb.id), "readonly-sandbox");
    assert_clean("sandbox", &l);
    assert!(l.dom.contains("data-readonly"), "{}", l.dom);
    assert!(!l.dom.contains(">Delete</button>"), "{}", l.dom);

    let l = page(ADMIN, "/sandboxes", "admin-sandboxes");
    assert_clean("sandboxes", &l);
    assert!(
        l.dom.contains(&format!("data-id=\"{}\"", sb.id)),
        "{}",
        l.dom
    );
    assert!(l.dom.contains(">Delete</button>"), "{}", l.dom);
    assert!(l.dom.contains(">Pause</button>"), "{}", l.dom);
    assert!(!l.dom.contains("data-readonly"), "{}", l.dom);
    user.delete(&sb.id).await.unwrap();
}
