//! Missing and wrong tokens are refused before anything happens; SIGHUP rotates tokens
//! without touching what is already running.

use futures::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warren_client::{CreateSandboxRequest, ErrorCode, ExecEvent, ExecRequest};

use crate::common::raw_request;
use crate::{auth_file, code, daemon, sha, tcp, TOKEN_A, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_wrong_tokens_get_401_and_nothing_is_done() {
    let Some((d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let id = tcp(port, Some(TOKEN_A))
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .id;
    for token in [None, Some("wrong-token"), Some("")] {
        let c = tcp(port, token);
        let e = c
            .create(&CreateSandboxRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{e}");
        assert_eq!(e.status(), Some(401));
        assert!(
            e.to_string().contains(&format!("127.0.0.1:{port}")),
            "names the daemon: {e}"
        );
        assert!(e.is_unauthorized());
        let r = c
            .exec(&id, &ExecRequest::shell("touch /tmp/should-not-exist"))
            .await;
        assert_eq!(code(r), ErrorCode::Unauthorized);
        assert_eq!(code(c.delete(&id).await), ErrorCode::Unauthorized);
        assert_eq!(
            code(c.list(&Default::default(), None).await),
            ErrorCode::Unauthorized
        );
        assert_eq!(
            code(c.pty(&id, "sh", 80, 24).await),
            ErrorCode::Unauthorized
        );
    }
    // Nothing happened: one sandbox (still there), nothing ran in it.
    let all = d.list().await;
    assert_eq!(all.len(), 1, "{all:?}");
    let r = d.sh(&id, "test -e /tmp/should-not-exist; echo $?").await;
    assert_eq!(r.stdout.trim(), "1", "a refused exec must not run");
    let log = d.client().trajectory(&id, None).await.unwrap();
    assert_eq!(
        log.iter()
            .filter(|e| matches!(e.call, warren_client::TrajectoryCall::Exec(_)))
            .count(),
        1,
        "only the check above is logged: {log:?}"
    );
    // Unknown routes do not tell an unauthenticated caller what exists.
    let c = tcp(port, None);
    let e = c.image("nope").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized));
    // Root on the Unix socket needs no token (the harness's own client).
    let (status, _, _) = raw_request(&d.socket, "GET", "/v1/sandboxes", None, "").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_tokens_and_open_streams_are_unaffected() {
    let Some((d, port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    let old = tcp(port, Some(TOKEN_A));
    let id = old
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .id;
    // A stream opened with the old token, still running when the token is revoked.
    let mut stream = old
        .exec_stream(
            &id,
            &ExecRequest::shell(
                "echo started; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished",
            ),
        )
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(&first, ExecEvent::Stdout { .. }), "{first:?}");

    // team-a's token is replaced by a new one.
    let new_token = "rotated-token-of-team-a";
    let rotated = auth_file("").replace(&sha(TOKEN_A), &sha(new_token));
    std::fs::write(d.dir.join("auth.toml"), rotated).unwrap();
    kill(Pid::from_raw(d.pid().unwrap() as i32), Signal::SIGHUP).unwrap();
    let refused = crate::common::wait_for(WAIT, || async {
        let r = tcp(port, Some(TOKEN_A)).get(&id).await;
        matches!(r, Err(e) if e.is_unauthorized()).then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "the old token is still accepted; log:\n{}",
        d.log_tail(20)
    );
    let new = tcp(port, Some(new_token));
    assert_eq!(
        new.get(&id).await.unwrap().id,
        id,
        "the new token is the same tenant"
    );

    // The stream opened before the rotation runs to its end.
    d.sh_ok(&id, "touch /tmp/go").await;
    let mut out = String::new();
    let mut exit = None;
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            ExecEvent::Stdout { data } => out.push_str(&data),
            ExecEvent::Exit { result } => exit = Some(result.exit_code),
            _ => {}
        }
    }
    assert!(out.contains("finished"), "{out:?}");
    assert_eq!(exit, Some(Some(0)));

    // A broken file is refused on SIGHUP and the tokens in force stay.
    std::fs::write(d.dir.join("auth.toml"), "not [ toml").unwrap();
    kill(Pid::from_raw(d.pid().unwrap() as i32), Signal::SIGHUP).unwrap();
    let logged = crate::common::wait_for(WAIT, || async {
        d.log_tail(50).contains("reload refused").then_some(())
    })
    .await;
    assert!(logged.is_some(), "log:\n{}", d.log_tail(20));
    new.get(&id).await.unwrap();
}

/// `curl` over the daemon's socket as the unprivileged user `nobody:nogroup`: the HTTP
/// status, or 0 when the connection itself was refused.
fn curl_as_nobody(socket: &std::path::Path, token: Option<&str>) -> u32 {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--unix-socket",
    ])
    .arg(socket)
    .uid(65534)
    .gid(65534);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd
        .arg("http://x/v1/sandboxes")
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_group_members_need_a_token() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some((d, _port)) =
        daemon(&auth_file(""), &["--socket-group".into(), "nogroup".into()]).await
    else {
        return;
    };
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 65534, "the socket belongs to the group");
    assert_eq!(
        curl_as_nobody(&d.socket, None),
        401,
        "a group member without a token"
    );
    assert_eq!(curl_as_nobody(&d.socket, Some("wrong")), 401);
    assert_eq!(curl_as_nobody(&d.socket, Some(TOKEN_A)), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_socket_group_only_root_connects() {
    let Some((d, _port)) = daemon(&auth_file(""), &[]).await else {
        return;
    };
    // The socket is root:root 0660: nobody cannot even connect, token or not.
    assert_eq!(curl_as_nobody(&d.socket, Some(TOKEN_A)), 0);
}
