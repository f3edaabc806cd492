//! Function containers at the runtime level (root only): one fresh call environment per
//! call. Skips, saying why, when it cannot run here.

use bytes::Bytes;
use warren_proto::{ExecSpec, FunctionInit, InvokeFile, InvokeSpec};
use warren_runtime::container::ContainerRuntime;
use warren_runtime::{Runtime, SandboxSpec};
use warren_types::{Limits, NodeId, SandboxId};

mod common;

fn setup() -> Option<(ContainerRuntime, NodeId)> {
    common::container_runtime()
}

fn spec(node: &NodeId) -> SandboxSpec {
    SandboxSpec {
        id: SandboxId::generate(node),
        image: vec!["default".into()],
        limits: Limits {
            memory_mb: 256,
            ..Limits::default()
        },
        hostname: "sandbox".into(),
        labels: Default::default(),
        devpts: false,
        network: false,
        resolv_conf: None,
        on_netns: None,
    }
}

fn sh(cmd: &str) -> ExecSpec {
    ExecSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        output_cap: 1 << 20,
        ..Default::default()
    }
}

fn call(cmd: &str) -> InvokeSpec {
    InvokeSpec {
        exec: sh(cmd),
        collect_cap: 1 << 20,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_container_runs_each_call_in_a_fresh_environment() {
    let Some((rt, node)) = setup() else { return };
    let f = FunctionInit {
        interpreter: Some("python3".into()),
        preload: vec!["json".into()],
    };
    let sb = rt.create_function(&spec(&node), &f).await.expect("create");
    let a = sb.agent();
    // Files in, command, files out.
    let mut spec1 = call("cat /work/in.txt; echo made > /tmp/made; echo x > /dev/shm/x; (setsid sleep 1000 &) ; echo $$ > /work/pid; hostname");
    spec1.files = vec![InvokeFile {
        path: "/work/in.txt".into(),
        size: 3,
        mode: None,
    }];
    spec1.collect = vec!["/work/pid".into(), "/nope".into()];
    let o = a
        .invoke(spec1, Bytes::from_static(b"hi\n"))
        .await
        .expect("invoke");
    assert_eq!(
        o.exit.exit_code,
        Some(0),
        "{:?}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.starts_with("hi\n"), "{text}");
    assert_eq!(o.files.len(), 2);
    assert!(!o.files[0].data.is_empty());
    assert_eq!(o.files[1].error.as_deref(), Some("not found"));
    // The next call sees none of it.
    let o = a
        .invoke(call("ls /tmp /dev/shm /work 2>&1; ps -e -o pid=,comm= 2>/dev/null || ls /proc | grep -c '^[0-9]'"), Bytes::new())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        !text.contains("made") && !text.contains("sleep") && !text.contains("in.txt"),
        "{text}"
    );
    // Stdin, exit codes, timeouts.
    let mut s = call("cat; exit 7");
    s.exec.stdin = true;
    let o = a.invoke(s, Bytes::from_static(b"abc")).await.unwrap();
    assert_eq!(
        (o.stdout.as_slice(), o.exit.exit_code),
        (&b"abc"[..], Some(7))
    );
    let mut s = call("sleep 30");
    s.exec.timeout_ms = Some(200);
    let o = a.invoke(s, Bytes::new()).await.unwrap();
    assert!(o.exit.timed_out);
    // The warm interpreter.
    let o = a
        .invoke(
            InvokeSpec {
                exec: ExecSpec {
                    argv: vec![
                        "python3".into(),
                        "-c".into(),
                        "import sys; print(1, sys.argv); sys.exit(3)".into(),
                        "a".into(),
                    ],
                    output_cap: 1 << 20,
                    ..Default::default()
                },
                ..Default::default()
            },
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1 ['-c', 'a']\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.exit.exit_code, Some(3));
    sb.destroy().await.unwrap();

    // Without an interpreter, back to back (each call waits for the next environment).
    let sb = rt
        .create_function(&spec(&node), &FunctionInit::default())
        .await
        .expect("create");
    let t = std::time::Instant::now();
    let n = 100;
    for _ in 0..n {
        let o = sb.agent().invoke(call("true"), Bytes::new()).await.unwrap();
        assert_eq!(o.exit.exit_code, Some(0));
    }
    eprintln!("back-to-back call true: {:?} per call", t.elapsed() / n);
    let mut c = call("true");
    c.files = vec![InvokeFile {
        path: "/timings".into(),
        size: 0,
        mode: None,
    }];
    let t = std::time::Instant::now();
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let t1 = std::time::Instant::now();
        let mut c = c.clone();
        c.exec.argv = vec!["true".into()];
        let o = sb.agent().invoke(c, Bytes::new()).await.unwrap();
        eprintln!(
            "call true with a ready environment: {:?} (in the environment {} us) {}",
            t1.elapsed(),
            o.exit.duration_us,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = t;
    sb.destroy().await.unwrap();
    rt.shutdown();
}
