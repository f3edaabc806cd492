//! Pause and resume of a VM: stop the vCPUs, then push the VMM's memory out of RAM through
//! the sandbox's cgroup, as for containers (`process_madvise(MADV_PAGEOUT)` over QEMU's
//! mappings, then the cgroup's reclaim).
//!
//! What leaves RAM: pages the guest wrote (anonymous copies, into swap: zram where
//! `scripts/setup-swap.sh` set it up), QEMU's own heap and translation cache, and file pages
//! charged to the sandbox. Guest memory the guest has freed costs next to nothing in zram:
//! the guest runs with `init_on_free=1`, so its free pages are zero-filled, which zram keeps
//! as a marker. Pages of the template's memory file that the guest never wrote are the
//! shared page cache of every VM of its shape and stay where they are. The QMP socket keeps
//! answering while paused (QEMU is not frozen), so resume is a `cont`; pages come back on
//! first touch.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Vm;
use crate::{PauseStats, RuntimeError};

pub async fn pause(vm: &Vm) -> Result<PauseStats, RuntimeError> {
    let t0 = Instant::now();
    let before = vm.cgroups.memory_bytes();
    vm.qmp.stop().await?;
    vm.paused.store(true, Ordering::SeqCst);
    let cg = vm.cgroups.clone();
    tokio::task::spawn_blocking(move || cg.page_out())
        .await
        .map_err(|e| RuntimeError::io("page-out task", std::io::Error::other(e.to_string())))?;
    let after = vm.cgroups.memory_bytes();
    let note = if crate::cgroup::swap_total_bytes() == 0 {
        format!(
            "vCPUs stopped; the host has no swap: {} MiB of guest and VMM memory stay in RAM; set up zram or a swap file to push them out",
            after >> 20
        )
    } else {
        "vCPUs stopped; guest and VMM memory pushed out to swap".to_string()
    };
    Ok(PauseStats {
        memory_before_bytes: before,
        memory_after_bytes: after,
        duration_ms: t0.elapsed().as_secs_f64() * 1e3,
        note: Some(note),
    })
}

pub async fn resume(vm: &Vm) -> Result<(), RuntimeError> {
    vm.qmp.cont().await?;
    vm.paused.store(false, Ordering::SeqCst);
    Ok(())
}
