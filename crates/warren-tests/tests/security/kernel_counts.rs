//! Per-user kernel counts (`/proc/sys/user/*`) are each sandbox's own: a sandbox that
//! exhausts its inotify instances and watches leaves the neighbour and the host able to
//! watch. (The kernel charges such objects to the owner of the user namespace they are made
//! in; every sandbox's namespace is owned by a uid of its own.)

use std::time::Duration;

use common::Daemon;
use warren_client::ExecRequest;

use crate::{common, py};

/// The sandbox's per-namespace watch limit the daemon sets (`--sandbox-user-limit`).
const WATCHES: usize = 2000;

/// Opens inotify instances until refused, then adds watches on one of them (distinct files)
/// until refused; writes "instances error watches error" to /tmp/held and keeps it all.
const HOLD: &str = r#"
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
def err(): return errno.errorcode.get(ctypes.get_errno(), "?")
fds, ierr = [], "none"
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0: ierr = err(); break
    fds.append(fd)
n, werr = 0, "none"
os.makedirs("/tmp/w", exist_ok=True)
while fds and n < 100000:
    p = "/tmp/w/%d" % n
    open(p, "w").close()
    if libc.inotify_add_watch(fds[0], p.encode(), 2) < 0: werr = err(); break
    n += 1
with open("/tmp/held.tmp", "w") as f: f.write("%d %s %d %s" % (len(fds), ierr, n, werr))
os.rename("/tmp/held.tmp", "/tmp/held")
time.sleep(600)
"#;

/// Watching works: an instance and ten watches.
const WATCH: &str = r#"
import ctypes, os, sys
d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/v"
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
assert fd >= 0, "inotify_init1: errno %d" % ctypes.get_errno()
os.makedirs(d, exist_ok=True)
for i in range(10):
    p = "%s/%d" % (d, i)
    open(p, "w").close()
    assert libc.inotify_add_watch(fd, p.encode(), 2) >= 0, "add_watch: errno %d" % ctypes.get_errno()
print("watching")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inotify_exhaustion_in_one_sandbox_leaves_the_neighbour_and_the_host_able_to_watch() {
    let Some(d) = Daemon::start_with(|_| {
        vec![
            "--sandbox-user-limit".into(),
            format!("max_inotify_watches={WATCHES}"),
        ]
    })
    .await
    else {
        return;
    };
    let a = d.sandbox().await;
    let b = d.sandbox().await;
    d.client()
        .spawn(&a, &ExecRequest::argv(["python3", "-c", HOLD]))
        .await
        .unwrap();
    let held = common::wait_for(Duration::from_secs(60), || async {
        let r = d.sh(&a, "cat /tmp/held").await;
        r.success().then_some(r.stdout)
    })
    .await
    .expect("the holder did not report");
    let f: Vec<&str> = held.split_whitespace().collect();
    assert_eq!(f.len(), 4, "{held}");
    assert_eq!(
        f[1], "EMFILE",
        "instances were not refused by a count: {held}"
    );
    assert_eq!(
        f[3], "ENOSPC",
        "watches were not refused by a count: {held}"
    );
    let watches: usize = f[2].parse().unwrap();
    assert_eq!(
        watches, WATCHES,
        "the sandbox's own watch limit does not hold: {held}"
    );
    // The neighbour and the host watch as before, while A holds everything it could get.
    assert_eq!(py(&d, &b, WATCH).await.trim(), "watching");
    let dir = d.dir.join("host-watch");
    let out = std::process::Command::new("python3")
        .args(["-c", WATCH])
        .arg(&dir)
        .output()
        .expect("python3 on the host");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "watching",
        "the host's root cannot watch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    // And A itself still answers.
    assert_eq!(d.sh_ok(&a, "echo alive").await.trim(), "alive");
    d.client().delete(&a).await.unwrap();
    d.client().delete(&b).await.unwrap();
}
