//! A trajectory export streams a large output: exporting a sandbox whose log holds one
//! 60 MiB binary output grows the daemon's resident memory by at most 64 MiB (it took
//! several times the output's size when each line was built whole), and the export carries
//! every byte of it. Both where the export is read from: the node's own log (the output
//! streamed from its file) and the trajectory store once the sandbox is deleted (the output
//! read from the store by ranges). Shipping the output to the store takes as little: the
//! shipper reads it from its file and uploads it a part at a time (it read it whole).

use futures::StreamExt;
use sha2::Digest;
use std::time::Duration;
use warren_client::{CreateSandboxRequest, ExecRequest, OutputEncoding};
use warren_types::{ExecOutcome, TrajectoryResult};

use crate::common::{shipped, wait_for, Daemon, StoreDir};

const OUTPUT: usize = 60 << 20;
/// The most an export may grow the daemon by, in MiB.
const BOUND_MIB: u64 = 64;
/// The most shipping the output may grow the daemon by, in MiB: well under the output's
/// size (a part of the upload is 8 MiB).
const SHIP_BOUND_MIB: u64 = 32;

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A sandbox whose log holds one exec with a 60 MiB binary stdout.
async fn sandbox_with_a_large_output(d: &Daemon) -> String {
    let req = CreateSandboxRequest {
        trajectory_mb: Some(128),
        memory_mb: Some(512),
        ..Default::default()
    };
    let id = d.create(&req).await.id;
    let exec = ExecRequest {
        max_output_bytes: Some(64 << 20),
        encoding: OutputEncoding::Base64,
        ..ExecRequest::shell(format!("head -c {OUTPUT} /dev/urandom"))
    };
    let r = d.exec(&id, &exec).await;
    assert!(r.success(), "{:?} {}", r.exit_code, r.stderr);
    assert_eq!(r.stdout_bytes, OUTPUT as u64);
    id
}

/// Exports `id` through `d`: how much the daemon's resident memory grew at its peak (MiB),
/// what it held before (MiB), and the large exec as exported, checked whole.
async fn export(d: &Daemon, id: &str) -> (u64, u64) {
    // The peak from here on: reset the daemon's high-water mark to what it holds now.
    let pid = d.pid().unwrap();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM");
    let (before, _) = memory(pid);
    let mut entries = Box::pin(d.client().trajectory_stream(id, None).await.unwrap());
    let mut found: Option<ExecOutcome> = None;
    while let Some(e) = entries.next().await {
        let e = e.unwrap();
        if let Some(TrajectoryResult::Exec(o)) = &e.result {
            if o.result.stdout_bytes == OUTPUT as u64 {
                found = Some(o.clone());
            }
        }
    }
    let (_, peak) = memory(pid);
    let o = found.expect("the export holds the output");
    assert_eq!(o.result.encoding, OutputEncoding::Base64);
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&o.result.stdout)
        .unwrap();
    assert_eq!(bytes.len(), OUTPUT);
    assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), o.stdout_sha256);
    (peak.saturating_sub(before) / 1024, before / 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporting_a_60_mib_output_keeps_the_daemon_small() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = sandbox_with_a_large_output(&d).await;
    let (grown_mib, before_mib) = export(&d, &id).await;
    assert!(
        grown_mib <= BOUND_MIB,
        "the export grew the daemon by {grown_mib} MiB (from {before_mib} MiB)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporting_a_60_mib_output_from_the_store_keeps_the_daemon_small() {
    let store = StoreDir::new("export-store");
    let args = store.args();
    let Some(d) = Daemon::start_with(|_| args).await else {
        return;
    };
    let id = sandbox_with_a_large_output(&d).await;
    // The same run's baseline: the export from the node's own log.
    let (own_mib, _) = export(&d, &id).await;
    // Once the entry is shipped, the sandbox goes: its export is read from the store.
    let on_disk = wait_for(Duration::from_secs(60), || async {
        shipped(&store.0, &id, "stdout_blob").then_some(())
    })
    .await;
    assert!(
        on_disk.is_some(),
        "the large output of {id} was never shipped"
    );
    d.client().delete(&id).await.expect("deleting the sandbox");
    assert!(d.list().await.iter().all(|s| s.id != id));
    let (stored_mib, before_mib) = export(&d, &id).await;
    eprintln!(
        "export of a {} MiB binary output: daemon grew {own_mib} MiB from its own log, \
         {stored_mib} MiB from the trajectory store",
        OUTPUT >> 20
    );
    assert!(
        stored_mib <= BOUND_MIB,
        "the export from the store grew the daemon by {stored_mib} MiB (from {before_mib} MiB; \
         {own_mib} MiB from its own log)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipping_a_60_mib_output_keeps_the_daemon_small() {
    let store = StoreDir::new("ship-store");
    // Outputs cannot be uploaded until the test has measured what the daemon holds: a file
    // stands where their folder goes (records and segments still can be written; the
    // segment naming the output waits for it).
    let blocker = store.0.join("trajectories").join("blobs");
    std::fs::create_dir_all(store.0.join("trajectories")).unwrap();
    std::fs::write(&blocker, b"not yet").unwrap();
    let args = store.args();
    let Some(d) = Daemon::start_with(|_| args).await else {
        return;
    };
    let id = sandbox_with_a_large_output(&d).await;
    assert!(
        !shipped(&store.0, &id, "stdout_blob"),
        "the segment was shipped before its output"
    );
    let pid = d.pid().unwrap();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM");
    let (before, _) = memory(pid);
    std::fs::remove_file(&blocker).unwrap();
    let on_disk = wait_for(Duration::from_secs(90), || async {
        shipped(&store.0, &id, "stdout_blob").then_some(())
    })
    .await;
    let (_, peak) = memory(pid);
    assert!(
        on_disk.is_some(),
        "the large output of {id} was never shipped"
    );
    // The output is in the store whole, under its digest.
    let blobs: Vec<_> = std::fs::read_dir(&blocker)
        .expect("the store's outputs")
        .flatten()
        .filter(|e| e.metadata().is_ok_and(|m| m.len() == OUTPUT as u64))
        .collect();
    assert_eq!(blobs.len(), 1, "one output of {OUTPUT} bytes in the store");
    let bytes = std::fs::read(blobs[0].path()).unwrap();
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&bytes)),
        blobs[0].file_name().to_string_lossy()
    );
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "shipping a {} MiB binary output grew the daemon by {grown_mib} MiB (from {} MiB)",
        OUTPUT >> 20,
        before / 1024
    );
    d.client().delete(&id).await.expect("deleting the sandbox");
    assert!(
        grown_mib <= SHIP_BOUND_MIB,
        "shipping the output grew the daemon by {grown_mib} MiB (from {} MiB)",
        before / 1024
    );
}
