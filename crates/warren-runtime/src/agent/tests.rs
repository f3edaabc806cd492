//! The client against a scripted agent on the other end of a real socket pair: the one
//! collector with and without its hook, errors in the protocol's shape, a lost agent.

use super::*;
use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use warren_proto::{Call, ExecSpec, InvokeFile, InvokeSpec, Kind};

/// What the scripted agent answers on the first call's stream, after reading the call and
/// (when `input`) its stdin up to EOF; it returns the call and the stdin it got. With `hang_up`
/// it closes the connection after the script.
async fn agent(
    sock: UnixStream,
    input: bool,
    script: Vec<(Kind, Vec<u8>)>,
    hang_up: bool,
) -> (Call, Vec<u8>) {
    let (mut rd, mut wr) = sock.into_split();
    let call = Frame::read_async(&mut rd).await.expect("call frame");
    assert_eq!(call.kind, Kind::Call);
    let mut stdin = Vec::new();
    if input {
        loop {
            let f = Frame::read_async(&mut rd).await.expect("stdin frame");
            match f.kind {
                Kind::Stdin => stdin.extend_from_slice(&f.payload),
                Kind::Eof => break,
                other => panic!("unexpected {other:?} before EOF"),
            }
        }
    }
    let mut buf = BytesMut::new();
    for (kind, payload) in script {
        Frame::new(call.stream, kind, payload).encode_into(&mut buf);
    }
    wr.write_all(&buf).await.expect("agent writes");
    if !hang_up {
        // Keep the socket open until the client is done with it.
        while Frame::read_async(&mut rd).await.is_ok() {}
    }
    (call.parse().expect("a call"), stdin)
}

fn ev(e: Event) -> (Kind, Vec<u8>) {
    (Kind::Event, serde_json::to_vec(&e).expect("event json"))
}

fn exited(code: i32) -> Event {
    Event::Exited(ExitInfo {
        exit_code: Some(code),
        ..ExitInfo::default()
    })
}

fn pair() -> (AgentConn, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    (AgentConn::new(a), b)
}

#[tokio::test]
async fn exec_collects_both_streams_and_the_exit() {
    let (conn, peer) = pair();
    let script = vec![
        ev(Event::Started { pid: 7 }),
        (Kind::Stdout, b"out ".to_vec()),
        (Kind::Stderr, b"err".to_vec()),
        (Kind::Stdout, b"more".to_vec()),
        ev(exited(3)),
    ];
    let agent = tokio::spawn(agent(peer, true, script, false));
    let out = conn
        .exec(ExecSpec::default(), Some(Bytes::from_static(b"hello")))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"out more");
    assert_eq!(out.stderr, b"err");
    assert_eq!(out.exit.exit_code, Some(3));
    drop(conn);
    let (call, stdin) = agent.await.expect("agent");
    assert!(matches!(call, Call::Exec { spec } if spec.stdin && spec.window.is_none()));
    assert_eq!(stdin, b"hello");
}

#[tokio::test]
async fn invoke_takes_its_files_and_wait_through_the_hook() {
    use base64::Engine;
    let (conn, peer) = pair();
    let data = base64::engine::general_purpose::STANDARD.encode(b"result");
    let script = vec![
        ev(Event::Started { pid: 1 }),
        ev(Event::CellWaited { us: 42 }),
        (Kind::Stdout, b"printed".to_vec()),
        ev(Event::Collected {
            path: "/out.txt".into(),
            data,
            size: 6,
            truncated: false,
            error: None,
        }),
        ev(Event::Collected {
            path: "/missing".into(),
            data: String::new(),
            size: 0,
            truncated: false,
            error: Some("not found".into()),
        }),
        ev(exited(0)),
    ];
    let agent = tokio::spawn(agent(peer, true, script, false));
    let spec = InvokeSpec {
        files: vec![InvokeFile {
            path: "/in".into(),
            size: 2,
            ..InvokeFile::default()
        }],
        ..InvokeSpec::default()
    };
    let out = conn
        .invoke(spec, Bytes::from_static(b"abstdin"))
        .await
        .expect("invoke");
    assert_eq!(out.stdout, b"printed");
    assert_eq!(out.cell_wait_us, 42);
    assert_eq!(out.exit.exit_code, Some(0));
    assert_eq!(out.files.len(), 2);
    assert_eq!(out.files[0].data, b"result");
    assert_eq!(out.files[1].error.as_deref(), Some("not found"));
    drop(conn);
    let (_, stdin) = agent.await.expect("agent");
    assert_eq!(stdin, b"abstdin");
}

#[tokio::test]
async fn an_error_event_is_the_agents_typed_error() {
    let (conn, peer) = pair();
    let script = vec![ev(Event::error(ErrorCode::NotFound, "no such command"))];
    let agent = tokio::spawn(agent(peer, false, script, false));
    let err = conn.exec(ExecSpec::default(), None).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Agent { code: ErrorCode::NotFound, message } if message == "no such command"),
        "{err:?}"
    );
    drop(conn);
    agent.await.expect("agent");
}

#[tokio::test]
async fn a_command_refuses_a_function_calls_events() {
    let (conn, peer) = pair();
    let script = vec![ev(Event::CellWaited { us: 1 }), ev(exited(0))];
    let agent = tokio::spawn(agent(peer, false, script, false));
    let err = conn.exec(ExecSpec::default(), None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Protocol(_)), "{err:?}");
    drop(conn);
    agent.await.expect("agent");
}

#[tokio::test]
async fn a_held_step_disturbed_by_a_restart_says_so() {
    let (conn, peer) = pair();
    let script = vec![
        (Kind::Stdout, b"kept".to_vec()),
        ev(Event::HeldExited(ExitInfo {
            exit_code: Some(0),
            ..ExitInfo::default()
        })),
    ];
    let agent = tokio::spawn(agent(peer, false, script, false));
    let (out, disturbed) = conn.collect(9).await.expect("collect");
    assert!(disturbed);
    assert_eq!(out.stdout, b"kept");
    drop(conn);
    let (call, _) = agent.await.expect("agent");
    assert!(matches!(call, Call::Collect { step: 9 }));
}

#[tokio::test]
async fn an_agent_gone_mid_call_is_agent_lost() {
    let (conn, peer) = pair();
    let script = vec![(Kind::Stdout, b"partial".to_vec())];
    let agent = tokio::spawn(agent(peer, false, script, true));
    let err = conn.exec(ExecSpec::default(), None).await.unwrap_err();
    assert!(matches!(err, RuntimeError::AgentLost), "{err:?}");
    agent.await.expect("agent");
    conn.closed().await;
    assert!(conn.is_closed());
}
