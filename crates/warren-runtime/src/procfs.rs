//! What `/proc` says: about a host process, for recognising one after a daemon restart, and
//! about the host's memory ([`MemInfo`], read by `warren_sys::meminfo`).

/// Start time (field 22 of /proc/PID/stat, clock ticks since boot) of a process, so a
/// recycled pid is never mistaken for the process it once was.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The host's memory: `warren_sys`'s reader of `/proc/meminfo`, here for the crates above.
pub use warren_sys::meminfo::{MemInfo, MemInfoError};

#[cfg(test)]
mod tests {
    #[test]
    fn own_start_time_is_known_and_a_missing_pid_has_none() {
        assert!(super::start_time(std::process::id()).is_some());
        assert_eq!(super::start_time(u32::MAX), None);
    }
}
