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

pub async fn pause(c: &Container) -> Result<PauseStats, RuntimeError> {
    let t0 = Instant::now();
    let before = c.cgroups.memory_bytes();
    c.cgroups.freeze(true).await?;
    c.paused.store(true, std::sync::atomic::Ordering::SeqCst);
    let cg = c.cgroups.clone();
    tokio::task::spawn_blocking(move || {
        cg.page_out();
    })
    .await
    .map_err(|e| RuntimeError::io("page-out task", std::io::Error::other(e.to_string())))?;
    let after = c.cgroups.memory_bytes();
    let note = (crate::cgroup::swap_total_bytes() == 0).then(|| {
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
