//! What `/proc` says: about a host process, for recognising one after a daemon restart, and
//! about the host's memory ([`MemInfo`], the one reader of `/proc/meminfo`).

/// Start time (field 22 of /proc/PID/stat, clock ticks since boot) of a process, so a
/// recycled pid is never mistaken for the process it once was.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The fields of `/proc/meminfo` (`Name:   123 kB`), each in KiB (the `HugePages_*` counts
/// are pages). Every part that asks about the host's memory reads it here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemInfo {
    fields: Vec<(String, u64)>,
}

impl MemInfo {
    /// Reads `/proc/meminfo` now.
    pub fn read() -> std::io::Result<MemInfo> {
        Ok(MemInfo::parse(&std::fs::read_to_string("/proc/meminfo")?))
    }

    /// Parses the text of `/proc/meminfo`; lines of another shape are skipped.
    pub fn parse(text: &str) -> MemInfo {
        let fields = text
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let value = rest.split_whitespace().next()?.parse().ok()?;
                Some((name.trim().to_string(), value))
            })
            .collect();
        MemInfo { fields }
    }

    /// Field `name` (e.g. `MemAvailable`), when the kernel reports it.
    pub fn kib(&self, name: &str) -> Option<u64> {
        self.fields
            .iter()
            .find_map(|(n, v)| (n == name).then_some(*v))
    }
}

#[cfg(test)]
mod tests {
    use super::MemInfo;

    #[test]
    fn meminfo_fields_are_read_by_name() {
        let m = MemInfo::parse(
            "MemTotal:        8000000 kB\nMemAvailable:    4000000 kB\nHugePages_Total:       0\nbad line\nSlab: x kB\n",
        );
        assert_eq!(m.kib("MemTotal"), Some(8_000_000));
        assert_eq!(m.kib("MemAvailable"), Some(4_000_000));
        assert_eq!(m.kib("HugePages_Total"), Some(0));
        assert_eq!(m.kib("Slab"), None, "a value that is not a number");
        assert_eq!(m.kib("Mem"), None, "names match whole");
        assert!(MemInfo::read().unwrap().kib("MemTotal").unwrap() > 0);
    }

    #[test]
    fn own_start_time_is_known_and_a_missing_pid_has_none() {
        assert!(super::start_time(std::process::id()).is_some());
        assert_eq!(super::start_time(u32::MAX), None);
    }
}
