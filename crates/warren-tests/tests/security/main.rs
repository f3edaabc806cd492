//! The attack suite: what an agent under RL pressure (or a malicious image) might try, run
//! against real sandboxes through a real `warrend`. Every case asserts the specific denial,
//! then that the host and a neighbour sandbox are unaffected ([`Scene::assert_unaffected`]).
//! One file per attack family; `docs/threat-model.md` links each claim to its case.

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod api;
mod cpu;
mod devices;
mod episode;
mod files;
mod floods;
mod image;
mod kernel;
mod kernel_apis;
mod kernel_counts;
mod landlock;
mod messages;
mod mounts;
mod storage;

use std::time::Duration;

use common::Daemon;
use warren_client::{CreateSandboxRequest, ExecRequest, ExecResult};

/// A daemon with an attacker sandbox and a neighbour holding a secret marker file.
pub struct Scene {
    pub d: Daemon,
    /// Where the attack runs.
    pub a: String,
    /// The neighbour, which must stay unaffected.
    pub b: String,
    marker: String,
    host_hostname: String,
    host_marker: std::path::PathBuf,
}

impl Scene {
    pub async fn new() -> Option<Scene> {
        Self::with(CreateSandboxRequest::default()).await
    }

    /// The attacker sandbox is created with `req`; the neighbour with the defaults.
    pub async fn with(req: CreateSandboxRequest) -> Option<Scene> {
        let d = Daemon::start().await?;
        let a = d.create(&req).await.id;
        let b = d.sandbox().await;
        let marker = format!("neighbour-secret-{}", d.node);
        d.sh_ok(&b, &format!("echo {marker} > /tmp/marker")).await;
        let host_marker = std::env::temp_dir().join(format!("warren-sec-host-{}", d.node));
        std::fs::write(&host_marker, "host marker\n").unwrap();
        Some(Scene {
            host_hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
            d,
            a,
            b,
            marker,
            host_marker,
        })
    }

    /// Runs a shell command in the attacker sandbox.
    pub async fn sh(&self, cmd: &str) -> ExecResult {
        self.d.sh(&self.a, cmd).await
    }

    /// Runs a Python program in the attacker sandbox; it must exit 0; returns stdout.
    pub async fn py(&self, program: &str) -> String {
        py(&self.d, &self.a, program).await
    }

    /// The host and the neighbour are as before; the daemon answers; the attacker sandbox
    /// still answers too (containment does not cost the sandbox its agent).
    pub async fn assert_unaffected(&self) {
        self.assert_host_and_neighbour().await;
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            self.d.client().exec(&self.a, &ExecRequest::argv(["true"])),
        )
        .await
        .expect("the attacker sandbox's agent stopped answering");
        assert!(
            r.as_ref().is_ok_and(|r| r.success()),
            "the attacker sandbox's agent is gone: {r:?}"
        );
    }

    /// The host and the neighbour are as before and the daemon answers.
    pub async fn assert_host_and_neighbour(&self) {
        let health = tokio::time::timeout(Duration::from_secs(10), self.d.client().health())
            .await
            .expect("the daemon stopped answering")
            .expect("health failed");
        assert!(health.is_ok());
        let got = tokio::time::timeout(
            Duration::from_secs(30),
            self.d.sh_ok(&self.b, "cat /tmp/marker"),
        )
        .await
        .expect("the neighbour stopped answering");
        assert_eq!(got.trim(), self.marker, "the neighbour's file changed");
        assert_eq!(
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
            self.host_hostname,
            "the host's hostname changed"
        );
        assert_eq!(
            std::fs::read_to_string(&self.host_marker).unwrap(),
            "host marker\n",
            "a host file changed"
        );
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.host_marker);
    }
}

/// Runs `python3 -c program` in sandbox `id`; it must exit 0; returns stdout.
pub async fn py(d: &Daemon, id: &str, program: &str) -> String {
    let r = d
        .exec(id, &ExecRequest::argv(["python3", "-c", program]))
        .await;
    assert!(
        r.success(),
        "python failed: exit {:?}\nstdout: {}\nstderr: {}\nprogram:\n{program}",
        r.exit_code,
        r.stdout,
        r.stderr
    );
    r.stdout
}

/// Python prelude: `call(nr, *args)` makes a raw syscall and returns `(result, errno name)`.
pub const SYSCALL: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    e = ctypes.get_errno()
    return r, (errno.errorcode.get(e, str(e)) if r == -1 else "OK")
"#;

impl Scene {
    /// Runs a shell command in the attacker sandbox that must succeed; returns stdout.
    pub async fn sh_ok_stdout(&self, cmd: &str) -> String {
        self.d.sh_ok(&self.a, cmd).await
    }
}
