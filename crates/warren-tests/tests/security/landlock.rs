//! Landlock: the sandbox's domain refuses device nodes with EACCES (its own answer, before
//! any capability check), keeps signals and abstract unix sockets inside the sandbox, and
//! leaves ordinary work alone. Skipped where the kernel has no Landlock (ABI < 6 for scopes).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::Scene;

async fn abi(s: &Scene) -> u64 {
    let h = s.d.client().health().await.unwrap();
    let sec = h.extra.get("security").cloned().unwrap_or_default();
    assert_eq!(
        sec["landlock"]["enabled"],
        serde_json::json!(sec["landlock"]["abi"].as_u64().unwrap_or(0) > 0)
    );
    sec["landlock"]["abi"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_refuses_device_nodes_and_allows_ordinary_work() {
    let Some(s) = Scene::new().await else { return };
    let abi = abi(&s).await;
    if abi == 0 {
        println!("SKIP: the kernel has no Landlock");
        return;
    }
    let h = s.d.client().health().await.unwrap();
    let enforced = h.extra["security"]["landlock"]["enforced"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(enforced.contains("no device nodes"), "{enforced}");
    // EACCES is Landlock's answer; without it the same call fails later with EPERM.
    let out = s
        .py("import os, stat\ntry:\n    os.mknod('/tmp/null2', stat.S_IFCHR | 0o666, os.makedev(1, 3)); print('made')\nexcept OSError as e:\n    print(e.errno)")
        .await;
    assert_eq!(out.trim(), libc_eacces(), "mknod answer: {out}");
    // Ordinary work: write the workspace and /tmp, create a new top-level directory and
    // write into it, build and run a program, install into /usr/local.
    s.sh_ok_stdout(
        "mkdir -p /work && echo hi > /work/f && mkdir /app && echo x > /app/y && \
         printf '#!/bin/sh\\necho built\\n' > /tmp/prog && chmod +x /tmp/prog && /tmp/prog && \
         cp /tmp/prog /usr/local/bin/prog && prog && echo x > /dev/null && : > /dev/null",
    )
    .await;
    s.assert_unaffected().await;
}

fn libc_eacces() -> &'static str {
    "13"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_scopes_signals_and_abstract_sockets_to_the_sandbox() {
    let Some(s) = Scene::new().await else { return };
    if abi(&s).await < 6 {
        println!("SKIP: Landlock ABI < 6 has no signal or abstract-socket scoping");
        return;
    }
    let agent =
        *s.d.sandbox_pids(&s.a)
            .iter()
            .min()
            .expect("the agent's pid");
    // A process outside the sandbox's domain but inside its pid and network namespaces,
    // running as the very uid sandbox root maps to: only Landlock can keep them apart.
    let name = format!("warren-sec-{}", s.d.node);
    // The host uid of the sandbox's root: the agent runs as it (each sandbox has a range
    // of its own).
    let status = std::fs::read_to_string(format!("/proc/{agent}/status")).unwrap();
    let host_root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the agent's uid")
        .to_string();
    let outsider = Command::new("nsenter")
        .args(["-t", &agent.to_string(), "-p", "-n", "-S", &host_root, "-G", &host_root, "--"])
        .args([
            "python3",
            "-c",
            &format!(
                "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0{name}')\ns.listen(8)\nprint('ready', flush=True)\ntime.sleep(30)"
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut outsider) = outsider else {
        crate::common::skip("nsenter is not available");
        return;
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = s
        .py(&format!(
            r#"
import os, socket, errno, signal
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
target = [p for p in pids if p != os.getpid() and b"{name}" in open(f"/proc/{{p}}/cmdline", "rb").read()]
res = []
for p in target:
    try:
        os.kill(p, signal.SIGTERM); res.append("signalled")
    except OSError as e:
        res.append("kill:" + errno.errorcode[e.errno])
c = socket.socket(socket.AF_UNIX)
try:
    c.connect("\0{name}"); res.append("connected")
except OSError as e:
    res.append("connect:" + errno.errorcode[e.errno])
print(len(target), " ".join(res))
"#
        ))
        .await;
    let still_running = outsider.try_wait().unwrap().is_none();
    let _ = outsider.kill();
    let _ = outsider.wait();
    assert_eq!(out.trim(), "1 kill:EPERM connect:EPERM", "scoping: {out}");
    assert!(
        still_running,
        "the outside process was killed from the sandbox"
    );
    s.assert_unaffected().await;
}
