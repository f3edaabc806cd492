//! The host's memory as `/proc/meminfo` reports it: the one reader of that file. Every part
//! that asks about the host's memory (admission, the VM runtime, the benches, the tests) reads
//! it here.

/// The fields of `/proc/meminfo` Warren reads, in KiB. `MemTotal` and `MemAvailable` are
/// always there (Linux ≥ 3.14); the others are `None` where the kernel does not report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total_kib: u64,
    pub available_kib: u64,
    pub slab_kib: Option<u64>,
    pub sunreclaim_kib: Option<u64>,
    pub kernel_stack_kib: Option<u64>,
    pub page_tables_kib: Option<u64>,
    pub percpu_kib: Option<u64>,
    pub anon_kib: Option<u64>,
    pub shmem_kib: Option<u64>,
    pub swap_total_kib: Option<u64>,
}

/// Why `/proc/meminfo` said nothing usable.
#[derive(Debug, thiserror::Error)]
pub enum MemInfoError {
    #[error("reading /proc/meminfo: {0}")]
    Read(#[source] std::io::Error),
    #[error("/proc/meminfo has no {0}")]
    Missing(&'static str),
}

impl MemInfo {
    /// Reads `/proc/meminfo` now.
    pub fn read() -> Result<MemInfo, MemInfoError> {
        let text = std::fs::read_to_string("/proc/meminfo").map_err(MemInfoError::Read)?;
        MemInfo::parse(&text)
    }

    /// Parses the text of `/proc/meminfo` (`Name:   123 kB` lines; others are skipped).
    pub fn parse(text: &str) -> Result<MemInfo, MemInfoError> {
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let (n, rest) = l.split_once(':')?;
                if n.trim() != name {
                    return None;
                }
                rest.split_whitespace().next()?.parse().ok()
            })
        };
        Ok(MemInfo {
            total_kib: field("MemTotal").ok_or(MemInfoError::Missing("MemTotal"))?,
            available_kib: field("MemAvailable").ok_or(MemInfoError::Missing("MemAvailable"))?,
            slab_kib: field("Slab"),
            sunreclaim_kib: field("SUnreclaim"),
            kernel_stack_kib: field("KernelStack"),
            page_tables_kib: field("PageTables"),
            percpu_kib: field("Percpu"),
            anon_kib: field("AnonPages"),
            shmem_kib: field("Shmem"),
            swap_total_kib: field("SwapTotal"),
        })
    }

    /// `MemTotal` in MiB.
    pub fn total_mb(&self) -> u64 {
        self.total_kib / 1024
    }

    /// `MemAvailable` in MiB.
    pub fn available_mb(&self) -> u64 {
        self.available_kib / 1024
    }

    /// Memory in use: `MemTotal - MemAvailable`, in KiB.
    pub fn used_kib(&self) -> u64 {
        self.total_kib.saturating_sub(self.available_kib)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_by_name() {
        let m = MemInfo::parse(
            "MemTotal:        8000000 kB\nMemAvailable:    4000000 kB\nHugePages_Total:       0\n\
             bad line\nSlab: x kB\nSUnreclaim: 100 kB\nSlabX: 5 kB\n",
        )
        .unwrap();
        assert_eq!((m.total_kib, m.available_kib), (8_000_000, 4_000_000));
        assert_eq!((m.total_mb(), m.available_mb()), (7812, 3906));
        assert_eq!(m.used_kib(), 4_000_000);
        assert_eq!(m.slab_kib, None, "a value that is not a number");
        assert_eq!(m.sunreclaim_kib, Some(100));
        assert_eq!(m.shmem_kib, None);
        assert!(matches!(
            MemInfo::parse("MemTotal: 5 kB\n"),
            Err(MemInfoError::Missing("MemAvailable"))
        ));
        assert!(MemInfo::parse("MemTotalX: 5 kB\nMemAvailable: 1 kB\n").is_err());
        assert!(MemInfo::read().unwrap().total_kib > 0);
    }
}
