//! Exit statuses of children in a process with one reaper.
//!
//! A daemon that is a child subreaper collects every child with one `waitpid(-1)` loop, so
//! `std::process::Command::output()` or `Child::wait()` would race that loop for the status
//! (and fail with ECHILD). Children whose status matters are spawned through this module: the
//! pid is registered under the same lock the reaper takes before it looks a reaped pid up
//! ([`deliver`]), so a child that exits at once is never missed. In a process without a reaper
//! ([`reaper_running`] is false) the functions fall back to the plain `std` calls.

use std::collections::HashMap;
use std::io::{Read, Seek};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

impl ChildExit {
    pub fn success(self) -> bool {
        self == ChildExit::Code(0)
    }

    /// The same status as a `std` exit status.
    pub fn to_std(self) -> std::process::ExitStatus {
        match self {
            ChildExit::Code(c) => std::process::ExitStatus::from_raw((c & 0xff) << 8),
            ChildExit::Signal(s) => std::process::ExitStatus::from_raw(s & 0x7f),
        }
    }
}

/// Where a registered child's exit goes.
pub type Waiter = Box<dyn FnOnce(ChildExit) + Send>;

static REAPING: AtomicBool = AtomicBool::new(false);

fn waiters() -> &'static Mutex<HashMap<i32, Waiter>> {
    static W: OnceLock<Mutex<HashMap<i32, Waiter>>> = OnceLock::new();
    W.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The registry, locked. Spawn and [`Registry::insert`] while holding it.
pub struct Registry(MutexGuard<'static, HashMap<i32, Waiter>>);

impl Registry {
    pub fn insert(&mut self, pid: u32, waiter: Waiter) {
        self.0.insert(pid as i32, waiter);
    }
}

/// Locks the registry (a reaped pid is looked up under the same lock).
pub fn registry() -> Registry {
    Registry(waiters().lock().unwrap_or_else(|p| p.into_inner()))
}

/// Marks this process as collecting its children with one reaper; returns false if it
/// already was.
pub fn claim_reaping() -> bool {
    !REAPING.swap(true, Ordering::SeqCst)
}

/// Whether a reaper collects this process's children.
pub fn reaper_running() -> bool {
    REAPING.load(Ordering::SeqCst)
}

/// Called by the reaper for every child it collected: hands the status to its waiter.
pub fn deliver(pid: i32, exit: ChildExit) {
    let waiter = waiters()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pid);
    if let Some(w) = waiter {
        w(exit);
    }
}

/// Like `Command::output()`, and safe in a process with a reaper. Standard input is
/// `/dev/null`; stdout and stderr are collected through anonymous memory files, so no
/// thread is needed to drain pipes.
pub fn output(cmd: &mut Command) -> std::io::Result<Output> {
    if !reaper_running() {
        return cmd.stdin(Stdio::null()).output();
    }
    check_runnable(cmd)?;
    let mut out = memfd("warren-child-stdout")?;
    let mut err = memfd("warren-child-stderr")?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(err.try_clone()?));
    let (tx, rx) = mpsc::channel();
    {
        let mut reg = registry();
        let child = cmd.spawn()?;
        reg.insert(
            child.id(),
            Box::new(move |exit| {
                let _ = tx.send(exit);
            }),
        );
        // `child` is dropped without waiting: the reaper collects it.
    }
    // The command holds the write ends; drop them so only the child keeps them open.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let exit = rx
        .recv()
        .map_err(|_| std::io::Error::other("the reaper stopped before the child ended"))?;
    Ok(Output {
        status: exit.to_std(),
        stdout: read_all(&mut out)?,
        stderr: read_all(&mut err)?,
    })
}

/// Refuses, before any fork, a command whose program cannot be started. After the failed
/// `execve` of a forked child the standard library waits for that child itself, and panics
/// when the wait fails, which it does when this process's reaper collected the child first.
/// (Its `posix_spawn` path does not wait; a command with a pre-exec hook, a user, a group or
/// a `PATH` of its own takes the fork path.) A program found here that still fails to start
/// (a bad interpreter, for one) keeps that narrow window.
pub fn check_runnable(cmd: &Command) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let program = Path::new(cmd.get_program());
    let found = if program.as_os_str().as_bytes().contains(&b'/') {
        match cmd.get_current_dir() {
            Some(d) if program.is_relative() => executable(&d.join(program)),
            _ => executable(program),
        }
    } else {
        // The child's `PATH` (its own if the command sets one), else the C library's default.
        let path = match cmd.get_envs().find(|(k, _)| *k == "PATH") {
            Some((_, v)) => v.map(|v| v.to_os_string()),
            None => std::env::var_os("PATH"),
        };
        let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
        std::env::split_paths(&path).any(|d| executable(&d.join(program)))
    };
    if found {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: no such program", program.display()),
        ))
    }
}

fn read_all(f: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    f.rewind()?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

fn memfd(name: &str) -> std::io::Result<std::fs::File> {
    let c = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_without_a_reaper_is_the_std_one() {
        let o = output(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"])).unwrap();
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");
        assert_eq!(o.status.code(), Some(3));
    }

    /// With a reaper collecting every child, a program that cannot be run is an error, never
    /// a panic: the standard library's own wait after a failed `execve` (its fork path, taken
    /// here for the `uid`) would find the child gone.
    #[test]
    fn a_missing_program_is_an_error_beside_a_reaper() {
        use std::os::unix::process::CommandExt;
        // The reaper takes every child of its process: the test runs alone in a process of
        // its own (this test binary again), whatever runs the tests.
        const ALONE: &str = "WARREN_SYS_TEST_REAPER_PROCESS";
        if std::env::var_os(ALONE).is_none() {
            let name = "children::tests::a_missing_program_is_an_error_beside_a_reaper";
            let o = Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(ALONE, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        assert!(claim_reaping());
        std::thread::spawn(|| loop {
            let mut status = 0;
            // SAFETY: waitpid writes only into `status`, a live local.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid > 0 {
                deliver(pid, ChildExit::Code(libc::WEXITSTATUS(status)));
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        for program in [
            "/nonexistent/tool",
            "no-such-tool-anywhere",
            "/proc/version",
            "/usr",
        ] {
            for _ in 0..50 {
                let e = output(Command::new(program).uid(uid)).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
                assert!(e.to_string().contains(program), "{e}");
            }
        }
        let o = output(Command::new("sh").uid(uid).args(["-c", "echo ok"])).unwrap();
        assert_eq!(o.stdout, b"ok\n");
        let o = output(Command::new("true").env("PATH", "/nonexistent:/usr/bin:/bin")).unwrap();
        assert!(o.status.success());
        let e = output(Command::new("true").env("PATH", "/nonexistent")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn statuses_convert_to_std() {
        assert_eq!(ChildExit::Code(7).to_std().code(), Some(7));
        assert_eq!(ChildExit::Signal(9).to_std().signal(), Some(9));
        assert!(ChildExit::Code(0).to_std().success());
    }
}
