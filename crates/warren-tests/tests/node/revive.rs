//! Revive with real sandboxes: a deterministic episode (exec, file writes, mkdir, chmod,
//! remove, with steps) revives into a sandbox with the same files, the steps go on where
//! they were, an episode that read `date` reports its step as the divergence, another
//! tenant's token cannot revive a sandbox, and a terminal session lands in the trajectory.

use std::time::Duration;
use warren_client::{ExecRequest, TrajectoryCall};
use warren_types::{TerminalStream, TrajectoryResult};

use crate::common::{raw_request, raw_request_with, wait_for, Daemon};

fn step(cmd: &str, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

/// A call of the file API with `?step=`: its status.
async fn file_call(
    d: &Daemon,
    method: &str,
    path_and_query: &str,
    ct: Option<&str>,
    body: &'static [u8],
) {
    let (status, _, body) = raw_request(&d.socket, method, path_and_query, ct, body).await;
    assert!(
        (200..300).contains(&status),
        "{method} {path_and_query}: {status} {}",
        String::from_utf8_lossy(&body)
    );
}

/// The files under /work: sha256, mode and path of each, sorted.
async fn files(d: &Daemon, id: &str) -> String {
    d.sh_ok(
        id,
        "cd /work && find . -exec stat -c '%a %F %n' {} + | sort && find . -type f -exec sha256sum {} + | sort",
    )
    .await
}

async fn episode(d: &Daemon, id: &str) {
    let sid = id;
    d.exec(
        sid,
        &step(
            "mkdir -p /work/src && cd /work && printf 'x = 1\\n' > src/a.py",
            1,
        ),
    )
    .await;
    file_call(
        d,
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/work/src/main.py&mode=420&step=2"),
        Some("application/octet-stream"),
        b"import a\nprint(sum(range(10)))\n",
    )
    .await;
    let r = d
        .exec(
            sid,
            &ExecRequest {
                cwd: Some("/work/src".into()),
                ..step("python3 -B main.py > out.txt && cat out.txt", 3)
            },
        )
        .await;
    assert_eq!(r.stdout, "45\n", "{r:?}");
    file_call(
        d,
        "POST",
        &format!("/v1/sandboxes/{id}/files/mkdir?step=4"),
        Some("application/json"),
        br#"{"path": "/work/tmp/deep", "parents": true, "mode": 448}"#,
    )
    .await;
    file_call(
        d,
        "POST",
        &format!("/v1/sandboxes/{id}/files/chmod?step=5"),
        Some("application/json"),
        br#"{"path": "/work/src/main.py", "mode": 384}"#,
    )
    .await;
    let fed = ExecRequest {
        stdin: Some("line one\nline two\n".into()),
        ..step("cat > /work/fed.txt && wc -l < /work/fed.txt", 6)
    };
    assert_eq!(d.exec(sid, &fed).await.stdout.trim(), "2");
    file_call(
        d,
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/work/tmp/scratch&step=7"),
        Some("application/octet-stream"),
        b"scratch",
    )
    .await;
    file_call(
        d,
        "DELETE",
        &format!("/v1/sandboxes/{id}/files?path=/work/tmp&recursive=true&step=8"),
        None,
        b"",
    )
    .await;
    d.exec(
        sid,
        &step(
            "cd /work && git init -q repo && ls repo/.git | sort > gitfiles",
            9,
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revived_sandbox_has_the_same_files_and_its_steps_go_on() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let old = d.sandbox().await;
    episode(&d, &old).await;
    let expected = files(&d, &old).await;
    assert!(
        expected.contains("main.py") && !expected.contains("scratch"),
        "{expected}"
    );

    let r = d.client().revive(&old, false).await.expect("revive");
    assert_eq!(r.revived_from, old);
    // The nine steps and the listing of the files (an exec without a step).
    assert_eq!((r.replayed, r.steps_replayed), (10, 9), "{r:?}");
    assert_eq!(r.divergences, 0, "{r:?}");
    assert_eq!(r.last_step, Some(9));
    assert!(r.duration_ms > 0.0 && r.recorded_ms > 0.0);
    let new = r.sandbox.id.clone();
    assert_ne!(new, old);
    assert_eq!(
        files(&d, &new).await,
        expected,
        "the same files, modes and content"
    );

    // The steps go on: an old step with the same request answers from the new log, a lower
    // step with another request conflicts, the next step runs.
    let other = step("python3 -B main.py > out.txt && cat out.txt", 3);
    let again = d.client().exec(&new, &other).await;
    // cwd differs from the logged request: another request under step 3.
    assert!(again.is_err(), "{again:?}");
    let same = d
        .exec(
            &new,
            &ExecRequest {
                cwd: Some("/work/src".into()),
                ..step("python3 -B main.py > out.txt && cat out.txt", 3)
            },
        )
        .await;
    assert!(same.replayed && same.stdout == "45\n", "{same:?}");
    let (status, headers, _) = raw_request_with(
        &d.socket,
        "POST",
        &format!("/v1/sandboxes/{new}/files/chmod?step=5"),
        Some("application/json"),
        &[],
        &br#"{"path": "/work/src/main.py", "mode": 384}"#[..],
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        headers.get("warren-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    let next = d.exec(&new, &step("echo next", 10)).await;
    assert!(!next.replayed && next.stdout == "next\n");

    // The original is untouched and goes on too; deleting it does not touch the new one.
    assert!(!d.exec(&old, &step("echo old", 10)).await.replayed);
    d.client().delete(&old).await.unwrap();
    assert_eq!(files(&d, &new).await, expected);
    // Its log went with it (no trajectory store on this node): revive is not_found.
    let gone = d.client().revive(&old, false).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    d.client().delete(&new).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revive_of_an_episode_that_read_the_clock_names_that_step() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let old = d.sandbox().await;
    d.exec(&old, &step("echo deterministic > /a", 1)).await;
    d.exec(&old, &step("date +%s%N | tee /t", 2)).await;
    d.exec(&old, &step("cat /a", 3)).await;

    let r = d.client().revive(&old, false).await.unwrap();
    assert_eq!(r.divergences, 1, "{r:?}");
    let first = r.first_divergence.clone().expect("a divergence");
    assert_eq!(
        (first.step, first.seq, first.kind.as_str()),
        (Some(2), 2, "exec")
    );
    assert_eq!(first.expected.exit_code, first.got.exit_code);
    assert_ne!(first.expected.stdout_sha256, first.got.stdout_sha256);
    assert!(
        !r.stopped && r.replayed == 3,
        "every step is replayed by default"
    );

    let stopped = d.client().revive(&old, true).await.unwrap();
    assert!(stopped.stopped && stopped.replayed == 2, "{stopped:?}");
    assert_eq!(stopped.last_step, Some(2));
    for id in [&old, &r.sandbox.id, &stopped.sandbox.id] {
        d.client().delete(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_token_cannot_revive_another_tenants_sandbox() {
    const A: &str = "revive-tenant-a-token-0123456789";
    const B: &str = "revive-tenant-b-token-0123456789";
    let Some((d, port)) =
        Daemon::start_with_tenants(&[("team-a", "user", A), ("team-b", "user", B)]).await
    else {
        return;
    };
    let client = |token: &str| {
        warren_client::Client::builder()
            .url(format!("http://127.0.0.1:{port}"))
            .token(token)
            .request_timeout(Some(crate::common::CALL_TIMEOUT))
            .build()
            .unwrap()
    };
    let (a, b) = (client(A), client(B));
    let sb = a
        .create(&warren_client::CreateSandboxRequest {
            memory_mb: Some(128),
            ..Default::default()
        })
        .await
        .unwrap();
    a.exec(&sb.id, &step("echo a > /f", 1)).await.unwrap();
    let refused = b.revive(&sb.id, false).await.unwrap_err();
    assert!(refused.is_not_found(), "{refused}");
    assert_eq!(d.list().await.len(), 1, "nothing was made for team-b");

    let r = a.revive(&sb.id, false).await.unwrap();
    assert_eq!(r.sandbox.tenant.as_deref(), Some("team-a"));
    assert_eq!(
        a.exec(&r.sandbox.id, &ExecRequest::shell("cat /f"))
            .await
            .unwrap()
            .stdout,
        "a\n"
    );
    for id in [&sb.id, &r.sandbox.id] {
        a.delete(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_session_is_in_the_trajectory() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let mut pty = d.client().pty(&id, "/bin/sh", 80, 24).await.unwrap();
    pty.send(&b"echo typed-$((6*7))\n"[..]).await.unwrap();
    pty.send(&b"exit 4\n"[..]).await.unwrap();
    let mut out = Vec::new();
    let code = loop {
        match tokio::time::timeout(Duration::from_secs(20), pty.next_event())
            .await
            .expect("an exit within 20 s")
            .unwrap()
        {
            Some(warren_client::PtyEvent::Output(b)) => out.extend_from_slice(&b),
            Some(warren_client::PtyEvent::Exit { exit_code, .. }) => break exit_code,
            None => break None,
        }
    };
    assert_eq!(code, Some(4));
    drop(pty);
    let log = wait_for(Duration::from_secs(10), || async {
        let log = d.client().trajectory(&id, None).await.unwrap();
        let ended = log
            .iter()
            .any(|e| matches!(&e.result, Some(TrajectoryResult::Terminal(t)) if t.ended));
        ended.then_some(log)
    })
    .await
    .expect("the session's last part is logged");
    let parts: Vec<_> = log
        .iter()
        .filter(|e| matches!(e.call, TrajectoryCall::Terminal { .. }))
        .collect();
    assert!(parts.iter().all(|e| e.step.is_none()));
    let mut typed = String::new();
    let mut printed = String::new();
    for e in &parts {
        let Some(TrajectoryResult::Terminal(t)) = &e.result else {
            panic!("a terminal entry without chunks: {e:?}")
        };
        for c in &t.chunks {
            assert_eq!(
                c.encoding,
                warren_client::OutputEncoding::Utf8,
                "text reads as text"
            );
            match c.stream {
                TerminalStream::Input => typed.push_str(&c.data),
                TerminalStream::Output => printed.push_str(&c.data),
            }
        }
    }
    let last = parts.last().unwrap();
    let Some(TrajectoryResult::Terminal(t)) = &last.result else {
        unreachable!()
    };
    assert_eq!((t.ended, t.exit_code), (true, Some(4)));
    assert!(matches!(&last.call, TrajectoryCall::Terminal { argv, .. } if argv == &["/bin/sh"]));
    assert_eq!(typed, "echo typed-$((6*7))\nexit 4\n");
    assert!(printed.contains("typed-42"), "{printed:?}");
    assert_eq!(
        printed.as_bytes(),
        &out[..],
        "the log holds what the client was sent"
    );

    // Revive skips terminals: a terminal is not a call that can be run again.
    let r = d.client().revive(&id, false).await.unwrap();
    assert_eq!((r.replayed, r.skipped), (0, parts.len() as u64));
    for s in [&id, &r.sandbox.id] {
        d.client().delete(s).await.unwrap();
    }
}
