//! Pause and resume: freeze the sandbox's cgroup, then push its memory out of RAM.
//!
//! Freezing stops every process (the agent too) without them noticing. Memory is pushed out
//! with `process_madvise(MADV_PAGEOUT)` over all the processes' mappings, cut into pieces that
//! one thread per CPU takes in turn, then the cgroup is
//! asked to reclaim the rest (page cache, the tmpfs writable layer). Anonymous and tmpfs pages
//! can only leave RAM when the host has swap (zram or disk); without swap the pause still
//! freezes and drops what is reclaimable, and says what stayed.

use std::time::Instant;

use super::Container;
use crate::{PauseStats, RuntimeError};

fn swap_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("SwapTotal:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .unwrap_or(0)
        * 1024
}

/// Address ranges of every mapping of `pid`.
fn ranges(pid: u32) -> Vec<(usize, usize)> {
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
fn page_out(pids: &[u32]) {
    let procs: Vec<(std::os::fd::OwnedFd, Vec<(usize, usize)>)> = pids
        .iter()
        .filter_map(|&pid| Some((warren_sys::pidfd::open(pid).ok()?, ranges(pid))))
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

pub async fn pause(c: &Container) -> Result<PauseStats, RuntimeError> {
    let t0 = Instant::now();
    let before = c.cgroups.memory_bytes();
    c.cgroups.freeze(true).await?;
    c.paused.store(true, std::sync::atomic::Ordering::SeqCst);
    let cg = c.cgroups.clone();
    tokio::task::spawn_blocking(move || {
        page_out(&cg.pids());
        cg.reclaim();
    })
    .await
    .map_err(|e| RuntimeError::io("page-out task", std::io::Error::other(e.to_string())))?;
    let after = c.cgroups.memory_bytes();
    let note = (swap_total_bytes() == 0).then(|| {
        format!(
            "the host has no swap: {} MiB of anonymous memory and writable layer stay in RAM (frozen); set up zram or a swap file to push them out",
            after >> 20
        )
    });
    Ok(PauseStats {
        memory_before_bytes: before,
        memory_after_bytes: after,
        duration_ms: t0.elapsed().as_secs_f64() * 1000.0,
        note,
    })
}

pub async fn resume(c: &Container) -> Result<(), RuntimeError> {
    c.cgroups.freeze(false).await?;
    c.paused.store(false, std::sync::atomic::Ordering::SeqCst);
    Ok(())
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
