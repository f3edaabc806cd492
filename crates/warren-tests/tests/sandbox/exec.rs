//! The exec API: argv and shell forms, cwd, env, stdin, exit codes and signals, streamed
//! output, background processes and terminals.

use std::time::{Duration, Instant};

use futures::StreamExt;
use warren_client::{
    CreateSandboxRequest, ErrorCode, ExecEvent, ExecRequest, ProcessState, PtyEvent,
};

use crate::common::Daemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_argv_and_shell() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    // argv is passed as is: no word splitting, no expansion.
    let r = d
        .exec(&id, &ExecRequest::argv(["echo", "a  b", "$HOME", "*"]))
        .await;
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout, "a  b $HOME *\n");
    assert_eq!(r.stderr, "");
    assert!(!r.timed_out && !r.stdout_truncated);
    assert_eq!(r.stdout_bytes, r.stdout.len() as u64);
    // shell goes through /bin/sh -c.
    let r = d.sh(&id, "echo $((6 * 7)) | tr 4 x; echo oops >&2").await;
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout, "x2\n");
    assert_eq!(r.stderr, "oops\n");
    assert!(r.duration_ms > 0.0);
    // A missing program is an error result, not a broken call.
    match d
        .client()
        .exec(&id, &ExecRequest::argv(["/no/such/program"]))
        .await
    {
        Ok(r) => assert!(!r.success(), "{r:?}"),
        Err(e) => assert!(
            e.status().is_some_and(|s| (400..500).contains(&s)),
            "running a missing program: {e}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_cwd_env_stdin() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            env: [("FROM_SANDBOX".to_string(), "sb".to_string())].into(),
            workdir: Some("/workspace".into()),
            ..Default::default()
        })
        .await
        .id;
    // The sandbox's workdir and env apply by default.
    assert_eq!(d.sh_ok(&id, "pwd").await, "/workspace\n");
    assert_eq!(d.sh_ok(&id, "echo $FROM_SANDBOX").await, "sb\n");

    let mut req = ExecRequest::shell("pwd; echo \"$FOO|$FROM_SANDBOX\"; cat; cat");
    req.cwd = Some("/tmp".into());
    req.env = [
        ("FOO".to_string(), "bar baz".to_string()),
        ("FROM_SANDBOX".to_string(), "overridden".to_string()),
    ]
    .into();
    req.stdin = Some("line one\nline two\n".into());
    let r = d.exec(&id, &req).await;
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout, "/tmp\nbar baz|overridden\nline one\nline two\n");

    // Without stdin the command reads EOF at once (no hang).
    let mut req = ExecRequest::argv(["cat"]);
    req.timeout_secs = Some(10.0);
    let r = d.exec(&id, &req).await;
    assert!(r.success() && !r.timed_out, "{r:?}");
    assert_eq!(r.stdout, "");

    // A cwd that does not exist fails the command, not the daemon.
    let mut req = ExecRequest::argv(["pwd"]);
    req.cwd = Some("/does/not/exist".into());
    match d.client().exec(&id, &req).await {
        Ok(r) => assert!(!r.success(), "{r:?}"),
        Err(e) => assert!(
            e.status().is_some_and(|s| (400..500).contains(&s)),
            "exec in a missing cwd: {e}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_exit_code_and_signal() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let r = d.sh(&id, "exit 7").await;
    assert_eq!((r.exit_code, r.signal, r.timed_out), (Some(7), None, false));
    let r = d.sh(&id, "kill -TERM $$").await;
    assert_eq!((r.exit_code, r.signal), (None, Some(15)), "{r:?}");
    let r = d
        .exec(&id, &ExecRequest::argv(["sh", "-c", "kill -9 $$"]))
        .await;
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    let r = d.exec(&id, &ExecRequest::argv(["true"])).await;
    assert_eq!((r.exit_code, r.signal), (Some(0), None));
    // A timeout reports timed_out and no clean exit.
    let mut req = ExecRequest::argv(["sleep", "30"]);
    req.timeout_secs = Some(0.5);
    let started = Instant::now();
    let r = d.exec(&id, &req).await;
    assert!(r.timed_out && r.exit_code != Some(0), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stream_yields_chunks_then_exit() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let req =
        ExecRequest::shell("for i in 1 2 3; do echo out$i; sleep 0.3; done; echo err >&2; exit 3");
    let started = Instant::now();
    let mut stream = d
        .client()
        .exec_stream(&id, &req)
        .await
        .expect("starting a streamed exec");
    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut first_output = None;
    let mut chunks = 0;
    let mut result = None;
    while let Some(ev) = stream.next().await {
        let ev = ev.expect("reading the exec stream");
        assert!(result.is_none(), "an event after the exit event: {ev:?}");
        match ev {
            ExecEvent::Stdout { data } => {
                first_output.get_or_insert(started.elapsed());
                chunks += 1;
                stdout.push_str(&data);
            }
            ExecEvent::Stderr { data } => stderr.push_str(&data),
            ExecEvent::Exit { result: r } => result = Some((r, started.elapsed())),
            ExecEvent::Error { error } => panic!("the stream ended with an error: {error}"),
        }
    }
    let (r, ended) = result.expect("the stream had no exit event");
    assert_eq!(stdout, "out1\nout2\nout3\n");
    assert_eq!(stderr, "err\n");
    assert_eq!(r.exit_code, Some(3));
    assert!(
        chunks >= 2,
        "stdout came in {chunks} chunk(s), not as it was written"
    );
    let first = first_output.unwrap();
    assert!(
        ended - first >= Duration::from_millis(400),
        "the first output ({first:?}) came only at the end ({ended:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_background_processes() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let id = d.sandbox().await;

    let sleeper = c
        .spawn(&id, &ExecRequest::argv(["sleep", "300"]))
        .await
        .expect("starting sleep");
    assert_eq!(sleeper.state, ProcessState::Running);
    assert_eq!(sleeper.argv, ["sleep", "300"]);
    let worker = c
        .spawn(
            &id,
            &ExecRequest::shell("echo started; sleep 0.5; echo done; exit 4"),
        )
        .await
        .expect("starting the worker");

    let list = c.list_processes(&id).await.expect("listing processes");
    for p in [&sleeper, &worker] {
        assert!(
            list.iter().any(|q| q.pid == p.pid),
            "process {} is not listed: {list:?}",
            p.pid
        );
    }
    let got = c.get_process(&id, sleeper.pid).await.expect("get process");
    assert_eq!(got.state, ProcessState::Running);
    // It really runs in the sandbox.
    let ps = d.ps(&id).await;
    assert!(ps.contains("sleep 300"), "sleep is not running:\n{ps}");

    // Waiting with a short timeout answers `timeout` and leaves it running.
    let e = c
        .wait_process(&id, sleeper.pid, Some(Duration::from_millis(200)))
        .await
        .expect_err("waiting for sleep 300 returned");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert_eq!(
        c.get_process(&id, sleeper.pid).await.unwrap().state,
        ProcessState::Running
    );

    // The worker's output is kept until it is waited for.
    let r = c
        .wait_process(&id, worker.pid, Some(Duration::from_secs(20)))
        .await
        .expect("waiting for the worker");
    assert_eq!(r.exit_code, Some(4));
    assert_eq!(r.stdout, "started\ndone\n");

    // Kill (default SIGKILL), then wait reports the signal.
    c.kill_process(&id, sleeper.pid, None).await.expect("kill");
    let r = c
        .wait_process(&id, sleeper.pid, Some(Duration::from_secs(10)))
        .await
        .expect("waiting for the killed sleep");
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    let got = c.get_process(&id, sleeper.pid).await;
    match got {
        Ok(p) => assert_eq!(p.state, ProcessState::Exited),
        Err(e) => assert!(e.is_not_found(), "{e}"),
    }
    // Another signal by number.
    let p = c
        .spawn(&id, &ExecRequest::argv(["sleep", "300"]))
        .await
        .unwrap();
    c.kill_process(&id, p.pid, Some(15)).await.unwrap();
    let r = c
        .wait_process(&id, p.pid, Some(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(r.signal, Some(15), "{r:?}");
    // Unknown pids are 404.
    let e = c.get_process(&id, 999_999).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

/// Reads terminal events until the exit, collecting output. Panics after `limit`.
pub(crate) async fn read_until_exit(
    session: &mut warren_client::PtySession,
    limit: Duration,
) -> (String, Option<i32>, Option<i32>) {
    let mut out = Vec::new();
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, session.next_event())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no exit event within {limit:?}; output so far: {:?}",
                    String::from_utf8_lossy(&out)
                )
            })
            .expect("reading the terminal");
        match ev {
            Some(PtyEvent::Output(b)) => out.extend_from_slice(&b),
            Some(PtyEvent::Exit { exit_code, signal }) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    exit_code,
                    signal,
                )
            }
            None => panic!(
                "the terminal closed without an exit event; output: {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_pty_over_websocket() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let mut pty = d
        .client()
        .pty(&id, "/bin/bash", 80, 24)
        .await
        .expect("opening a terminal");
    pty.send(&b"echo hi\n"[..]).await.unwrap();
    pty.send(&b"exit\n"[..]).await.unwrap();
    let (out, code, signal) = read_until_exit(&mut pty, Duration::from_secs(20)).await;
    assert!(
        out.split(['\r', '\n']).any(|l| l == "hi"),
        "no line `hi` in the terminal output: {out:?}"
    );
    assert_eq!((code, signal), (Some(0), None), "output: {out:?}");

    // Resizes reach the terminal, and the exit code comes through.
    let mut pty = d
        .client()
        .pty(&id, "/bin/bash", 80, 24)
        .await
        .expect("opening a second terminal");
    pty.resize(100, 40).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    pty.send(&b"stty size; exit 3\n"[..]).await.unwrap();
    let (out, code, _) = read_until_exit(&mut pty, Duration::from_secs(20)).await;
    assert!(out.contains("40 100"), "stty size after a resize: {out:?}");
    assert_eq!(code, Some(3), "output: {out:?}");

    // A terminal on an unknown sandbox is refused with 404.
    let missing = crate::common::unknown_id(&d.node);
    let e = d
        .client()
        .pty(&missing, "/bin/sh", 80, 24)
        .await
        .expect_err("a terminal on a missing sandbox");
    assert!(e.is_not_found(), "{e}");
}

/// The default image's login profile (E2B's SDK runs every command as `bash -l -c CMD`) starts
/// no program when there is no terminal: bash answers its user id itself and `mesg n` runs only
/// for a terminal, where it still runs. Spies stand in front of `id` (on the caller's PATH: the
/// profile asks before it sets one) and `mesg` (on the PATH the profile sets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_login_profile_starts_no_program_without_a_terminal() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    d.sh_ok(&id, "mkdir -p /tmp/spy").await;
    for (path, real) in [
        ("/tmp/spy/id", "/usr/bin/id"),
        ("/usr/local/bin/mesg", "/usr/bin/mesg"),
    ] {
        let spy = format!("#!/bin/sh\necho \"$0\" >> /tmp/spy.log\nexec {real} \"$@\"\n");
        d.client()
            .write_file_bytes(&id, path, Some(0o755), spy.into_bytes())
            .await
            .unwrap();
    }
    let login = |cmd: &str| {
        ExecRequest::argv([
            "/usr/bin/env",
            "PATH=/tmp/spy:/usr/bin:/bin",
            "/bin/bash",
            "-l",
            "-c",
            cmd,
        ])
    };
    let r = d.exec(&id, &login("echo $PATH")).await;
    assert!(r.success(), "{r:?}");
    assert_eq!(
        r.stdout, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
        "root's PATH"
    );
    assert_eq!(
        d.sh_ok(&id, "cat /tmp/spy.log 2>/dev/null || true").await,
        ""
    );
    // The spies work: a login shell other than bash (dash) still asks `id`.
    let r = d
        .exec(
            &id,
            &ExecRequest::argv([
                "/usr/bin/env",
                "PATH=/tmp/spy:/usr/bin:/bin",
                "/bin/sh",
                "-l",
                "-c",
                "echo $PATH",
            ]),
        )
        .await;
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (
            Some(0),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        ),
        "{r:?}"
    );
    assert_eq!(
        d.sh_ok(&id, "cat /tmp/spy.log; rm /tmp/spy.log").await,
        "/tmp/spy/id\n"
    );
    // Another user gets the other PATH, still without `id`.
    let as_nobody = ExecRequest {
        user: Some("nobody".into()),
        cwd: Some("/tmp".into()),
        ..login("echo $PATH")
    };
    let r = d.exec(&id, &as_nobody).await;
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (
            Some(0),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games\n"
        ),
        "{r:?}"
    );
    assert_eq!(
        d.sh_ok(&id, "cat /tmp/spy.log 2>/dev/null || true").await,
        ""
    );
    // On a terminal (Warren's), `mesg n` runs as before.
    let mut pty = d
        .client()
        .pty(&id, "/bin/sh", 80, 24)
        .await
        .expect("opening a terminal");
    pty.send(&b"PATH=/tmp/spy:/usr/bin:/bin /bin/bash -l -c true; exit\n"[..])
        .await
        .unwrap();
    let (out, code, _) = read_until_exit(&mut pty, Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "output: {out:?}");
    assert_eq!(
        d.sh_ok(&id, "cat /tmp/spy.log").await,
        "/usr/local/bin/mesg\n"
    );
}
