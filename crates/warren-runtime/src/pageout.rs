//! Pushing a sandbox's memory out of RAM: `process_madvise(MADV_PAGEOUT)` over every mapping
//! of its processes, cut into pieces that up to one thread per CPU takes in turn. The cost is
//! compressing each page (zram) or writing it (disk swap), which one thread does at one CPU's
//! speed, so a big heap is shared between threads too. Used by container and VM pause through
//! [`crate::cgroup::CgroupSet::page_out`].

/// Address ranges of every mapping of `pid`.
fn mapping_ranges(pid: u32) -> Vec<(usize, usize)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter(|l| !l.ends_with("[vsyscall]") && !l.ends_with("[vvar]") && !l.ends_with("[vdso]"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (b > a).then_some((a, b - a))
        })
        .collect()
}

/// Bytes of address space one page-out call covers at most: small enough that the work spreads
/// over the threads, large enough that a big heap takes a handful of calls.
const PIECE: usize = 32 << 20;

/// Most page-out threads.
const MAX_THREADS: usize = 4;

/// The mappings of the processes (by index) cut into pieces of at most [`PIECE`] bytes;
/// consecutive small mappings of one process share a piece (up to the kernel's 1,024 ranges per
/// call).
fn pieces(procs: &[Vec<(usize, usize)>]) -> Vec<(usize, Vec<(usize, usize)>)> {
    let mut out = Vec::new();
    for (i, ranges) in procs.iter().enumerate() {
        let mut cur: Vec<(usize, usize)> = Vec::new();
        let mut bytes = 0;
        for &(mut start, mut len) in ranges {
            while len > 0 {
                let take = len.min(PIECE - bytes);
                cur.push((start, take));
                bytes += take;
                start += take;
                len -= take;
                if bytes == PIECE || cur.len() == 1024 {
                    out.push((i, std::mem::take(&mut cur)));
                    bytes = 0;
                }
            }
        }
        if !cur.is_empty() {
            out.push((i, cur));
        }
    }
    out
}

/// Pushes the memory of `pids` out with `MADV_PAGEOUT`, on up to one thread per CPU: the cost
/// is compressing each page (zram) or writing it (disk swap), which one thread does at one
/// CPU's speed. Threads take the next piece as they finish one, so a single big heap is shared
/// too.
pub fn page_out(pids: &[u32]) {
    let procs: Vec<(std::os::fd::OwnedFd, Vec<(usize, usize)>)> = pids
        .iter()
        .filter_map(|&pid| Some((warren_sys::pidfd::open(pid).ok()?, mapping_ranges(pid))))
        .collect();
    let all = pieces(&procs.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
        .min(all.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || loop {
        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some((i, ranges)) = all.get(k) else {
            return;
        };
        if let Err(e) = warren_sys::process::process_madvise(
            &procs[*i].0,
            ranges,
            warren_sys::process::MADV_PAGEOUT,
        ) {
            tracing::debug!(pid = pids.get(*i), error = %e, "page-out");
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_heap_is_cut_and_small_mappings_share_a_piece() {
        let procs = vec![
            vec![
                (0x1000, 4096),
                (0x3000, 8192),
                (0x10_0000, 3 * PIECE + 4096),
            ],
            vec![(0x7000, 4096)],
        ];
        let p = pieces(&procs);
        // The two small mappings and the heap's first bytes, then whole pieces, then the rest.
        let bytes = |v: &Vec<(usize, usize)>| v.iter().map(|r| r.1).sum::<usize>();
        assert!(p.iter().all(|(_, r)| bytes(r) <= PIECE));
        let of = |i: usize| {
            p.iter()
                .filter(|(j, _)| *j == i)
                .map(|(_, r)| bytes(r))
                .sum::<usize>()
        };
        assert_eq!(of(0), 4096 + 8192 + 3 * PIECE + 4096);
        assert_eq!(of(1), 4096);
        assert_eq!(p.len(), 5, "{p:?}");
        // Contiguous cover of the heap, in order.
        let heap: Vec<_> = p
            .iter()
            .flat_map(|(_, r)| r.iter())
            .filter(|r| r.0 >= 0x10_0000)
            .collect();
        let mut at = 0x10_0000;
        for r in heap {
            assert_eq!(r.0, at);
            at += r.1;
        }
        assert_eq!(at, 0x10_0000 + 3 * PIECE + 4096);
    }

    #[test]
    fn many_small_mappings_stay_under_the_kernels_vector_limit() {
        let procs = vec![(0..3000).map(|i| (i * 8192, 4096)).collect::<Vec<_>>()];
        let p = pieces(&procs);
        assert!(p.iter().all(|(_, r)| r.len() <= 1024));
        assert_eq!(p.iter().map(|(_, r)| r.len()).sum::<usize>(), 3000);
    }
}
