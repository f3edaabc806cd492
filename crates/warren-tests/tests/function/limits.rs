//! Timeouts and output caps of calls; bad requests answer typed errors.

use std::time::{Duration, Instant};
use warren_client::ErrorCode;

use crate::common::Daemon;
use crate::{call, sh, sh_ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_everything_the_call_started() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = sh("echo started; (setsid sleep 60 &); sleep 60");
    r.timeout_secs = Some(0.5);
    let t = Instant::now();
    let out = call(&d, &r).await;
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout, "started\n");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // The pool goes on serving.
    assert_eq!(sh_ok(&d, "echo next").await, "next\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_and_returned_files_are_capped() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = sh("head -c 300000 /dev/zero | tr '\\0' a; head -c 5000 /dev/zero >&2; head -c 9000 /dev/zero > /tmp/big");
    r.max_output_bytes = Some(1000);
    r.max_file_bytes = Some(100);
    r.return_files = vec!["/tmp/big".into()];
    let out = call(&d, &r).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated && out.stderr_truncated);
    assert_eq!((out.stdout_bytes, out.stderr_bytes), (300_000, 5000));
    assert_eq!(out.files[0].size, 9000);
    assert!(out.files[0].truncated);
    assert_eq!(out.files[0].content.len(), 100);
}

/// Asked-back files that are not regular files are refused, not read: a FIFO (the call ended,
/// so nothing will ever write it) blocked the cell's open for ever, so the call never
/// answered and its container was never given back; /dev/zero came back as `cap` zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_files_that_are_fifos_or_devices_are_refused() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = sh("mkfifo /tmp/fifo; ln -s /tmp/fifo /tmp/link; echo ok > /tmp/ok");
    r.return_files = vec![
        "/tmp/fifo".into(),
        "/tmp/link".into(),
        "/dev/zero".into(),
        "/tmp/ok".into(),
    ];
    let out = call(&d, &r).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    for f in &out.files[..3] {
        assert!(
            f.error
                .as_deref()
                .is_some_and(|e| e.contains("not a regular file")),
            "{f:?}"
        );
        assert!(f.content.is_empty(), "{f:?}");
    }
    assert_eq!(out.files[3].content, "ok\n");
    // The pool goes on serving.
    assert_eq!(sh_ok(&d, "echo next").await, "next\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_answer_typed_errors() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let mut r = sh("true");
    r.files = vec![warren_client::CallFile {
        path: "relative".into(),
        content: String::new(),
        ..Default::default()
    }];
    let e = c.call(&r).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(ErrorCode::InvalidPath | ErrorCode::InvalidRequest)
        ),
        "{e}"
    );
    let mut r = sh("true");
    r.image = warren_client::ImageRef::Name("no-such-image".into());
    let e = c.call(&r).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    let mut r = sh("true");
    r.cwd = Some("/no/such/dir".into());
    let e = c.call(&r).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    // A missing program is a result (like a shell), not an API error.
    let out = call(&d, &warren_client::CallRequest::argv(["/no/such/program"])).await;
    assert_eq!(out.exit_code, Some(127));
    assert_eq!(sh_ok(&d, "echo fine").await, "fine\n");
}

/// `se.slice` (ns) from a `/proc/<pid>/sched`; `None` on kernels without EEVDF's custom slices.
fn slice_of(sched: &str) -> Option<u64> {
    let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// A call's command gets what a sandbox's command gets: every CPU of the node's mask (the
/// cell starts it on its own CPU and widens the mask after) and the kernel's default time
/// slice (not the cell's short one), whether it starts through a pre-exec hook (another user)
/// or without one (root), from its first instruction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_command_gets_every_cpu_and_the_default_time_slice() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap()
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    let default = slice_of(&std::fs::read_to_string("/proc/self/sched").unwrap());
    // Many times each: a mask or slice set after the start raced the command (it won now
    // and then, on a loaded host).
    let users = [None, Some("nobody")];
    for user in users.into_iter().flat_map(|u| std::iter::repeat_n(u, 20)) {
        let mut r = sh("grep Cpus_allowed_list: /proc/self/status; cat /proc/self/sched");
        r.user = user.map(String::from);
        let out = call(&d, &r).await;
        assert_eq!(out.exit_code, Some(0), "{user:?}: {out:?}");
        let cpus = out.stdout.lines().next().unwrap_or_default();
        assert_eq!(
            cpus.split(':').nth(1).map(str::trim),
            Some(mask.as_str()),
            "{user:?}: the command's CPUs"
        );
        match default {
            Some(ns) => assert_eq!(
                slice_of(&out.stdout),
                Some(ns),
                "{user:?}: the command's slice (the kernel's default)"
            ),
            None => println!("note: this kernel shows no se.slice; time slices are not checked"),
        }
    }
}

/// A call's command is the OOM killer's first choice (`oom_score_adj` 1000), as a sandbox's
/// commands are: never its call environment or the container's agent (on a host where the
/// daemon may protect the agent, every environment is a copy of it and starts protected).
/// For root's commands, another user's, and the warm interpreter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_command_is_the_oom_killers_first_choice() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // The cell raises a command's score just after starting it (a child of the non-dumpable
    // cell cannot write its own /proc file before it has exec'd): the shell waits (bounded)
    // until the score is set instead of racing that write, and prints 0 if it never is.
    for user in [None, Some("nobody")] {
        let mut r = sh("for i in $(seq 100); do s=$(cat /proc/$$/oom_score_adj); \
             [ \"$s\" = 1000 ] && break; sleep 0.02; done; echo \"$s\"");
        r.user = user.map(String::from);
        let out = call(&d, &r).await;
        assert_eq!(out.exit_code, Some(0), "{user:?}: {out:?}");
        assert_eq!(out.stdout.trim(), "1000", "{user:?}: {out:?}");
    }
    let mut warm = warren_client::CallRequest::argv([
        "python3",
        "-c",
        "print(open('/proc/self/oom_score_adj').read().strip())",
    ]);
    warm.interpreter = Some("python3".into());
    // The first call of a new pool may start cold; later ones take a warm interpreter.
    for _ in 0..3 {
        let out = call(&d, &warm).await;
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        assert_eq!(out.stdout.trim(), "1000", "warm python3: {out:?}");
    }
}
