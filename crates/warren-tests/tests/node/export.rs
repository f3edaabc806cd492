//! A trajectory export streams a large output from its file: exporting a sandbox whose log
//! holds one 60 MiB binary output grows the daemon's resident memory by at most 64 MiB (it
//! took several times the output's size when each line was built whole), and the export
//! carries every byte of it.

use futures::StreamExt;
use sha2::Digest;
use warren_client::{CreateSandboxRequest, ExecRequest, OutputEncoding};
use warren_types::TrajectoryResult;

use crate::common::Daemon;

const OUTPUT: usize = 60 << 20;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporting_a_60_mib_output_keeps_the_daemon_small() {
    let Some(d) = Daemon::start().await else {
        return;
    };
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
    drop(r);

    // The peak from here on: reset the daemon's high-water mark to what it holds now.
    let pid = d.pid().unwrap();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM");
    let (before, _) = memory(pid);
    let mut entries = Box::pin(d.client().trajectory_stream(&id, None).await.unwrap());
    let mut found = None;
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
    let grown_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grown_mib <= 64,
        "the export grew the daemon by {grown_mib} MiB (from {} MiB)",
        before / 1024
    );
}
