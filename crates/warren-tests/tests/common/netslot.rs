//! Network-test slots: a slot `S` (1..=250) names the addresses `10.254.S.0/24` and the links
//! and namespaces of one test; a lock file held for the test's life keeps two tests (of any
//! binary) from taking the same slot. And two small runners of host tools (`ip`, `nft`, `podman`).

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

/// A slot `S` held (by an exclusive lock) for this test's addresses and names.
pub struct Slot {
    pub n: u8,
    _lock: nix::fcntl::Flock<File>,
}

/// Takes the first free slot.
pub fn take_slot() -> Slot {
    let dir = PathBuf::from("/tmp/warren-tests-net-slots");
    std::fs::create_dir_all(&dir).expect("slot dir");
    for n in 1..=250u8 {
        let f = File::create(dir.join(format!("{n}.lock"))).expect("slot file");
        if let Ok(lock) = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            return Slot { n, _lock: lock };
        }
    }
    panic!("no free network test slot");
}

/// Runs a host tool: whether it succeeded, and its stdout and stderr.
pub fn run(cmd: &str, args: &[&str]) -> (bool, String) {
    match Command::new(cmd).args(args).output() {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// Runs a host tool that must succeed.
pub fn must(cmd: &str, args: &[&str]) {
    let (ok, out) = run(cmd, args);
    assert!(ok, "{cmd} {args:?} failed: {out}");
}
