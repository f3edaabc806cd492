//! Runs after every other test of the run (the name sorts last) and checks that the run's
//! daemons left nothing on the host: no `warren-<node>` cgroups, no processes in them (agents
//! included), no daemon still running, and no new mounts except the shared read-only layer
//! mounts under `<image store>/mnt`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{image_store, node_cgroup_dirs, run_dir, should_skip, test_root};

/// How long to wait for the other tests of the run to finish.
const WAIT: Duration = Duration::from_secs(300);

/// Pids of this process and its ancestors.
fn ancestors() -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    let mut pid = std::process::id();
    while pid > 1 && out.insert(pid) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            break;
        };
        // The fields after the command name (which may hold spaces) start after ')'.
        let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
        pid = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
    }
    out
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// Other processes of this nextest run that belong to this package: its test processes and
/// the daemons they started (which inherit their environment).
fn run_processes() -> Vec<String> {
    let Ok(run) = std::env::var("NEXTEST_RUN_ID") else {
        return Vec::new();
    };
    let run = format!("NEXTEST_RUN_ID={run}");
    let package = format!("CARGO_PKG_NAME={}", env!("CARGO_PKG_NAME"));
    let mine = ancestors();
    pids()
        .into_iter()
        .filter(|p| !mine.contains(p))
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .map(|env| {
                    let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
                    vars.contains(&run.as_bytes()) && vars.contains(&package.as_bytes())
                })
                .unwrap_or(false)
        })
        .map(|p| format!("{p} {}", cmdline(p)))
        .collect()
}

/// The nodes registered in this run and the ones still marked running.
fn registered_nodes(run: &Path) -> (Vec<String>, Vec<String>) {
    let mut all = Vec::new();
    let mut running = Vec::new();
    if let Ok(rd) = std::fs::read_dir(run) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("mounts.") {
                continue;
            }
            if std::fs::read_to_string(e.path()).unwrap_or_default() == "running" {
                running.push(name.clone());
            }
            all.push(name);
        }
    }
    all.sort();
    running.sort();
    (all, running)
}

/// `(mount point, fstype, source, super options)` of each mount in a mountinfo table.
fn mounts(table: &str) -> BTreeSet<(String, String, String, String)> {
    table
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mp = pre.split(' ').nth(4)?.to_string();
            let mut post = post.split(' ');
            let fstype = post.next()?.to_string();
            let source = post.next().unwrap_or("").to_string();
            let opts = post.next().unwrap_or("").to_string();
            Some((mp, fstype, source, opts))
        })
        .collect()
}

/// Processes in the cgroups of `nodes`, or daemons of them.
fn leftover_processes(nodes: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for pid in pids() {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cmd = cmdline(pid);
        for node in nodes {
            let group = format!("/warren-{node}");
            let in_group = cg
                .lines()
                .any(|l| l.contains(&format!("{group}/")) || l.ends_with(&group));
            let is_daemon = cmd.contains("warrend") && cmd.contains(&format!("--node {node}"));
            if in_group || is_daemon {
                out.push(format!("process {pid} of node {node} is left: {cmd}"));
            }
        }
    }
    out
}

#[test]
fn zz_no_leftovers_after_the_suite() {
    if should_skip() {
        return;
    }
    let run = run_dir();
    let started = Instant::now();
    let mut failures = Vec::new();
    loop {
        let others = run_processes();
        let (_, running) = registered_nodes(&run);
        if others.is_empty() && running.is_empty() {
            break;
        }
        if started.elapsed() > WAIT {
            failures.push(format!(
                "after {WAIT:?} these are still running: processes {others:?}, daemons of nodes \
                 {running:?}"
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (nodes, _) = registered_nodes(&run);
    if nodes.is_empty() {
        println!(
            "SKIP: no test daemon ran in this run ({}); run the whole suite to check for leftovers",
            run.display()
        );
        return;
    }
    println!(
        "checking {} daemon(s) of this run (waited {:?})",
        nodes.len(),
        started.elapsed()
    );

    // Cgroups: neither sandbox groups nor the node's own parent groups.
    let mut empty_parents = Vec::new();
    for node in &nodes {
        let mut empty = Vec::new();
        for dir in node_cgroup_dirs(node) {
            if !dir.is_dir() {
                continue;
            }
            let subs: Vec<String> = std::fs::read_dir(&dir)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.path().is_dir())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            if subs.is_empty() {
                empty.push(dir.display().to_string());
                empty_parents.push(dir);
            } else {
                failures.push(format!(
                    "cgroup {} is left with sandbox groups {subs:?}",
                    dir.display()
                ));
            }
        }
        if !empty.is_empty() {
            failures.push(format!(
                "node {node}: empty groups left after its daemon stopped: {}",
                empty.join(" ")
            ));
        }
    }

    // Processes: anything in those cgroups (agents, sandbox processes), or a daemon of ours.
    // A process that is still exiting (a VMM unmapping guest memory after its group was
    // killed) is given a few seconds to go before it counts.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut left = leftover_processes(&nodes);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        left = leftover_processes(&nodes);
    }
    failures.extend(left);

    // Mounts: nothing new except the shared layer mounts under <image store>/mnt. Other
    // projects (or other Warren daemons) may mount things meanwhile; only mounts that can be
    // ours fail the test, the rest are printed.
    let store = format!("{}/", image_store().display());
    let allowed = format!("{store}mnt/");
    let root = format!("{}/", test_root().display());
    match std::fs::read_to_string(run.join("mounts.before")) {
        Ok(before) => {
            let before = mounts(&before);
            let now = mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
            for (mp, fstype, source, opts) in now.difference(&before) {
                if mp.starts_with(&allowed) {
                    continue;
                }
                let fields = [mp, source, opts];
                let ours = mp.starts_with(&store)
                    || fields.iter().any(|f| f.contains(&root))
                    || nodes
                        .iter()
                        .any(|n| fields.iter().any(|f| f.contains(n.as_str())))
                    || (fstype == "overlay" && fields.iter().any(|f| f.contains("warren")));
                let line = format!("mount {mp} ({fstype} from {source}, {opts}) is new");
                if ours {
                    failures.push(line);
                } else if fstype == "overlay" || fstype == "erofs" || mp.contains("warren") {
                    println!("note: {line}; it is not from this run's daemons");
                }
            }
        }
        Err(e) => failures.push(format!("no mount table snapshot of this run: {e}")),
    }

    // Leave the host clean for the next run: remove empty leftover groups (already reported).
    for dir in empty_parents {
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = std::fs::remove_dir_all(&run);

    assert!(
        failures.is_empty(),
        "the test daemons ({}) left {} item(s) behind:\n{}",
        nodes.join(", "),
        failures.len(),
        failures.join("\n")
    );
}
