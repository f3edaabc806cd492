//! The Python zygote (warren-agent `zygote`): a pool with an interpreter forks each call's
//! Python from one started per container. Calls forked so see nothing of earlier ones, are
//! held to the same limits and restrictions as a Python the cell starts itself, answer
//! timeouts, memory blow-ups and syntax errors the same way, and a zygote that died is
//! replaced without a call failing.

use std::time::Duration;
use warren_client::{CallRequest, CallResult};

use crate::call;
use crate::common::{wait_for, Daemon};

/// A Python call on the pool's warm interpreter (`warm`) or started cold.
fn py(code: &str, warm: bool) -> CallRequest {
    let mut r = CallRequest::argv(["python3", "-c", code]);
    if warm {
        r.interpreter = Some("python3".into());
    }
    r.timeout_secs = Some(30.0);
    r
}

/// Prints the call's parent pid first: 0 when the zygote forked the call (its parent, the
/// zygote, is outside the cell's pid namespace), 1 when the cell started it.
const PARENT: &str = "import os; print(os.getppid())";

/// Whether host process `pid` runs the zygote's program (the zygote, or a fork of it).
fn runs_zygote_program(pid: u32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&cmd).contains("\n_warren_zygote(os, sys,")
}

/// Host pids of `node`'s zygote interpreters: processes running the zygote's program whose
/// parent does not (its forks, the calls' interpreters, run it too).
fn zygotes(node: &str) -> Vec<u32> {
    let group = format!("warren-{node}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if !cg.contains(&group) || !runs_zygote_program(pid) {
            continue;
        }
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse::<u32>().ok());
        if ppid.is_some_and(|p| !runs_zygote_program(p)) {
            out.push(pid);
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_calls_are_forked_and_see_nothing_of_earlier_ones() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let first = call(
        &d,
        &py(
            &format!(
                "{PARENT}
import sys, json
open('/tmp/zy', 'w').write('x')
os.environ['ZY'] = '1'
json.zy = 1
sys.modules['zy_marker'] = json
sys.zy = 1
os.dup2(os.open('/etc/hostname', os.O_RDONLY), 77)
if os.fork() == 0:
    os.setsid()
    import time
    time.sleep(1000)
print(os.readlink('/proc/self/ns/net'))"
            ),
            true,
        ),
    )
    .await;
    assert_eq!(first.exit_code, Some(0), "{first:?}");
    let lines: Vec<&str> = first.stdout.lines().collect();
    assert_eq!(lines[0], "0", "not forked by the zygote: {first:?}");
    let netns = lines[1].to_string();
    let look = format!(
        "{PARENT}
import sys, json
print(os.path.exists('/tmp/zy'), 'ZY' in os.environ, hasattr(json, 'zy'),
      'zy_marker' in sys.modules, hasattr(sys, 'zy'))
try:
    os.fstat(77)
    print('fd 77 open')
except OSError:
    print('no fd')
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])
print(os.readlink('/proc/self/ns/net'))"
    );
    // Until a call lands in the first call's container (the pool rotates them).
    let mut same = 0;
    for _ in 0..12 {
        let out = call(&d, &py(&look, true)).await;
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        let l: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(l[0], "0", "not forked by the zygote: {out:?}");
        assert_eq!(
            &l[1..4],
            ["False False False False False", "no fd", "True"],
            "a call saw an earlier call's state"
        );
        if l[4] == netns {
            same += 1;
        }
    }
    assert!(same >= 2, "no later call ran in the first call's container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_zygote_is_replaced_without_a_failed_call() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let r = py(&format!("{PARENT}; print(6 * 7)"), true);
    assert_eq!(call(&d, &r).await.stdout, "0\n42\n");
    let old = wait_for(Duration::from_secs(10), || async {
        let z = zygotes(&d.node);
        (!z.is_empty()).then_some(z)
    })
    .await
    .expect("a zygote runs");
    for pid in &old {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // The interpreters the dead zygotes forked for ready cells still answer; then new zygotes
    // fork again.
    let mut forked_again = false;
    for _ in 0..12 {
        let out = call(&d, &r).await;
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        assert!(out.stdout.ends_with("\n42\n"), "{out:?}");
        forked_again |= out.stdout.starts_with("0\n") && !zygotes(&d.node).is_empty();
    }
    assert!(forked_again, "no zygote forked after the old ones died");
    let now = zygotes(&d.node);
    assert!(
        now.iter().all(|p| !old.contains(p)),
        "{old:?} still running: {now:?}"
    );
}

/// A call's process reports its own exit code as it ends (see warren-agent `zygote`); a
/// child the program forks, which runs to the program's end first, reports nothing: the call
/// ends with its own process, output and exit code whole, forked or started cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_the_program_forks_does_not_end_the_call() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let code = "import os, sys, time
pid = os.fork()
if pid == 0:
    print('child', flush=True)
    sys.exit(0)
os.waitpid(pid, 0)
time.sleep(0.3)
print('parent')
sys.exit(7)";
    for warm in [true, false] {
        let out = call(&d, &py(code, warm)).await;
        assert_eq!(out.exit_code, Some(7), "warm {warm}: {out:?}");
        assert_eq!(out.stdout, "child\nparent\n", "warm {warm}: {out:?}");
    }
}

/// The same lines of `/proc/self/status` and the same answers to limits, for a forked Python
/// and one the cell starts: capabilities, `no_new_privs`, seccomp filters, CPUs and time
/// slice, OOM score, Landlock (a device node refused with EACCES), timeouts, memory
/// blow-ups and syntax errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_python_is_held_like_a_started_one() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let status = "import os, stat
keys = ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp',
        'Seccomp_filters', 'Uid', 'Cpus_allowed_list', 'se.slice')
for l in list(open('/proc/self/status')) + list(open('/proc/self/sched')):
    if l.split(':')[0].strip() in keys:
        print(' '.join(l.split()))
print(open('/proc/self/oom_score_adj').read().strip())
try:
    os.mknod('/tmp/c', 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    print('mknod ok')
except OSError as e:
    print('mknod', e.errno)";
    let timeout = "import time; print('started', flush=True); time.sleep(60)";
    let blow_up = "b = bytearray(1 << 30); print(len(b))";
    let syntax = "print(";
    type Shape = (Option<i32>, Option<i32>, bool, String);
    let shape = |r: &CallResult, err_tail: bool| -> Shape {
        let err = if err_tail {
            r.stderr.lines().last().unwrap_or_default().to_string()
        } else {
            String::new()
        };
        (
            r.exit_code,
            r.signal,
            r.timed_out,
            format!("{}|{err}", r.stdout),
        )
    };
    let mut answers: Vec<Vec<Shape>> = Vec::new();
    for warm in [false, true] {
        let mut got = Vec::new();
        let st = call(&d, &py(&format!("{PARENT}\n{status}"), warm)).await;
        assert_eq!(st.exit_code, Some(0), "{st:?}");
        let (parent, rest) = st.stdout.split_once('\n').unwrap();
        assert_eq!(parent, if warm { "0" } else { "1" }, "{st:?}");
        got.push((st.exit_code, st.signal, st.timed_out, rest.to_string()));
        let mut t = py(timeout, warm);
        t.timeout_secs = Some(0.5);
        got.push(shape(&call(&d, &t).await, false));
        let mut m = py(blow_up, warm);
        m.memory_mb = Some(256);
        got.push(shape(&call(&d, &m).await, false));
        got.push(shape(&call(&d, &py(syntax, warm)).await, true));
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1], "cold vs forked");
    let cold = &answers[0];
    assert!(cold[0].3.contains("NoNewPrivs: 1"), "{cold:?}");
    assert!(cold[0].3.contains("Seccomp: 2"), "{cold:?}");
    assert!(cold[0].3.contains("\n1000\n"), "{cold:?}");
    assert!(cold[1].2, "timed out: {cold:?}");
    assert_ne!(
        cold[2].0,
        Some(0),
        "a blow-up over the limit failed: {cold:?}"
    );
    assert!(cold[3].3.contains("SyntaxError"), "{cold:?}");
}

/// A call that signals its own process group (`kill -9 0`, `os.kill(0, 9)`) ends itself and
/// nothing else. The kernel finds a group's members across pid namespaces, and a call's
/// process was in the agent's group (a command the cell started) or the zygote's (a forked
/// Python): the signal killed the zygote and every other cell of the container. Landlock's
/// signal scope (Linux 6.12+) hid that; the daemon here runs without Landlock, as a node on
/// an older kernel does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_kills_its_process_group_kills_only_itself() {
    let Some(d) = Daemon::start_with(|_| {
        [
            "--no-landlock",
            "--function-min-warm",
            "1",
            "--function-max-warm",
            "1",
        ]
        .map(String::from)
        .to_vec()
    })
    .await
    else {
        return;
    };
    let warm = py(&format!("{PARENT}; print(6 * 7)"), true);
    assert_eq!(call(&d, &warm).await.stdout, "0\n42\n");
    let old = wait_for(Duration::from_secs(10), || async {
        let z = zygotes(&d.node);
        (!z.is_empty()).then_some(z)
    })
    .await
    .expect("a zygote runs");
    let mut shell = CallRequest::argv(["sh", "-c", "kill -9 0; echo survived"]);
    shell.interpreter = Some("python3".into());
    for r in [
        shell,
        py("import os; os.kill(0, 9); print('survived')", true),
    ] {
        let out = call(&d, &r).await;
        assert_eq!(out.signal, Some(9), "{out:?}");
        assert!(!out.stdout.contains("survived"), "{out:?}");
        // The pool's container and its zygote live on.
        assert_eq!(call(&d, &warm).await.stdout, "0\n42\n");
        assert_eq!(zygotes(&d.node), old, "the zygote was killed by a call");
    }
}
