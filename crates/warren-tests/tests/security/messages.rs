//! Message sizes: no request, answer or listing of any size ends the agent's connection.
//! Requests that can never run are refused at the API with a 4xx; large answers are split
//! across frames or paged; the sandbox stays `running` through all of it.

use std::collections::BTreeMap;

use warren_client::{CreateSandboxRequest, ErrorCode, ExecRequest};

use crate::Scene;

/// Around the protocol's frame payload (1 MiB): the request's encoded size crosses it.
const FRAME: usize = 1 << 20;

async fn assert_running(s: &Scene) {
    let info = s.d.client().get(&s.a).await.expect("the sandbox is gone");
    assert_eq!(
        format!("{:?}", info.state),
        "Running",
        "the sandbox is not running: {info:?}"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_any_size_are_refused_or_run_never_lost() {
    let Some(s) = Scene::new().await else { return };
    let c = s.d.client();
    // One argument the kernel can never take (>= 128 KiB): refused up front, whatever its
    // size relative to the frame limit.
    for n in [131_072, 1_048_000, FRAME - 64, FRAME, FRAME + 1, 1_100_000] {
        let e = c
            .exec(
                &s.a,
                &ExecRequest::argv(["true".to_string(), "x".repeat(n)]),
            )
            .await
            .expect_err("an argument the kernel cannot take ran");
        assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{n} bytes: {e}");
        assert_eq!(e.status(), Some(400));
    }
    let e = c
        .exec(
            &s.a,
            &ExecRequest::shell(format!("echo {}", "y".repeat(1_100_000))),
        )
        .await
        .expect_err("a 1.1 MB shell string ran");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    assert_running(&s).await;

    // The largest single argument runs.
    let r =
        s.d.exec(
            &s.a,
            &ExecRequest::argv([
                "sh".to_string(),
                "-c".into(),
                "echo ${#1}".into(),
                "_".into(),
                "z".repeat(131_071),
            ]),
        )
        .await;
    assert_eq!(r.stdout.trim(), "131071", "{r:?}");

    // Many arguments whose request crosses the frame limit (plain and with every byte
    // escaped in JSON) run: the request is split across frames.
    for n in (1040..1052).chain([1100]) {
        let mut argv = vec![
            "python3".to_string(),
            "-c".into(),
            "import sys; print(len(sys.argv) - 1, sum(map(len, sys.argv[1:])))".into(),
        ];
        argv.extend((0..n).map(|i| format!("{i:04}{}", "a".repeat(996))));
        let r = s.d.exec(&s.a, &ExecRequest::argv(argv)).await;
        assert_eq!(r.stdout.trim(), format!("{n} {}", n * 1000), "{r:?}");
    }
    let escaped = "\u{1}".repeat(100_000);
    let mut argv = vec![
        "python3".to_string(),
        "-c".into(),
        "import sys; print(sum(map(len, sys.argv[1:])))".into(),
    ];
    argv.extend(std::iter::repeat_n(escaped, 3));
    let r = s.d.exec(&s.a, &ExecRequest::argv(argv)).await;
    assert_eq!(r.stdout.trim(), "300000", "{r:?}");

    // An environment of 11,000 variables runs; one over the kernel's limit is refused.
    let mut req = ExecRequest::shell("env | grep -c '^W_'");
    req.env = (0..11_000)
        .map(|i| (format!("W_{i}"), "v".repeat(16)))
        .collect();
    let r = s.d.exec(&s.a, &req).await;
    assert_eq!(r.stdout.trim(), "11000", "{}", r.stderr);
    req.env = (0..40_000)
        .map(|i| (format!("W_{i}"), "v".repeat(64)))
        .collect();
    let e = c
        .exec(&s.a, &req)
        .await
        .expect_err("a 3 MB environment ran");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    assert_running(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_environment_that_no_command_could_take_is_refused_at_create() {
    let Some(s) = Scene::new().await else { return };
    let before = s.d.list().await.len();
    let env: BTreeMap<String, String> = (0..100_000)
        .map(|i| (format!("E{i}"), "1".to_string()))
        .collect();
    let e =
        s.d.client()
            .create(&CreateSandboxRequest {
                env,
                ..Default::default()
            })
            .await
            .expect_err("a sandbox with 100,000 variables was created");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    assert_eq!(s.d.list().await.len(), before, "something was created");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_the_sandbox_fills_is_listed_page_by_page() {
    let Some(s) = Scene::new().await else { return };
    // 20,000 names of 250 bytes: about 8 MB of listing, made by the sandbox itself; and
    // 3,000 names whose every byte is escaped in JSON.
    s.py("import os\n\
         os.makedirs('/tmp/big')\n\
         for i in range(20000):\n\
         \x20   open('/tmp/big/%05d' % i + 'n' * 245, 'w').close()\n\
         os.makedirs('/tmp/esc')\n\
         for i in range(3000):\n\
         \x20   open('/tmp/esc/%05d' % i + '\\x01' * 245, 'w').close()\n")
        .await;
    let c = s.d.client();
    let all = c.list_dir(&s.a, "/tmp/big").await.expect("listing failed");
    assert_eq!(all.len(), 20_000);
    assert!(
        all.windows(2).all(|w| w[0].name < w[1].name),
        "not in order"
    );
    assert!(all.iter().all(|e| e.name.len() == 250));
    let page = c
        .list_page(&s.a, "/tmp/big", None, Some(10_000))
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 10_000);
    let next = page.next.expect("a full page names the next one");
    let rest = c
        .list_page(&s.a, "/tmp/big", Some(&next), Some(10_000))
        .await
        .unwrap();
    assert_eq!(rest.entries.len(), 10_000);
    assert!(rest.entries[0].name > next);
    let esc = c.list_dir(&s.a, "/tmp/esc").await.expect("listing failed");
    assert_eq!(esc.len(), 3_000);
    let e = c
        .list_page(&s.a, "/tmp/big", None, Some(10_001))
        .await
        .expect_err("a page over the limit was served");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest));
    assert_running(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_for_the_protocol_is_an_error_not_a_lost_sandbox() {
    let Some(s) = Scene::new().await else { return };
    // 40 background processes with 1.9 MB of arguments each: their listing is larger than
    // any message the protocol carries.
    let mut sh = vec![
        "sh".to_string(),
        "-c".into(),
        "sleep 600".into(),
        "_".into(),
    ];
    sh.extend((0..19).map(|_| "p".repeat(100_000)));
    for _ in 0..40 {
        s.d.client()
            .spawn(&s.a, &ExecRequest::argv(sh.clone()))
            .await
            .expect("spawn failed");
    }
    match s.d.client().list_processes(&s.a).await {
        Ok(p) => assert_eq!(p.len(), 40),
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}"),
    }
    assert_running(&s).await;
}
