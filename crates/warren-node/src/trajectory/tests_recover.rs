//! Tests of the recovery at open of what a crash left past a log's indexed length (see
//! `journal::recover` and [`super::logs::LogDir::tail`]).

use std::os::unix::fs::FileExt as _;

use warren_types::{NodeId, SandboxId};

use super::blobs::BlobDir;
use super::journal::Journal;
use super::{flood_entry, logs, Blob, SandboxLog, StoredEntry};

fn sandbox() -> SandboxId {
    SandboxId::generate(&"n1".parse::<NodeId>().unwrap())
}

fn seqs(j: &Journal, id: &SandboxId, from: u64) -> Vec<u64> {
    let (entries, _) = j.read().unwrap().entries(id, from, 1000).unwrap();
    entries.iter().map(|e| e.seq).collect()
}

/// An exec entry with a step and an output too large to be inline (a blob).
fn step_entry(step: u64) -> (StoredEntry, Vec<Blob>) {
    use super::{Room, StoredExec, StoredResult};
    let call = warren_types::TrajectoryCall::Exec(warren_types::ExecCall {
        shell: Some(format!("step {step}")),
        ..Default::default()
    });
    let mut e = StoredEntry::new(call, Some(step), 0);
    let mut blobs = Vec::new();
    let out = format!("{step}\n").repeat(5000);
    e.result = Some(StoredResult::Exec(StoredExec::new(
        warren_types::ExitInfo {
            exit_code: Some(0),
            stdout_bytes: out.len() as u64,
            ..Default::default()
        },
        out.as_bytes(),
        b"",
        &mut Room::unlimited(),
        &mut blobs,
    )));
    (e, blobs)
}

/// What a node killed after a group's sync but before its index commit was durable
/// leaves: records past the indexed length (their output files written). The next open
/// indexes them (lengths, step rows, output references), so none is lost, a retried step
/// is answered from them, and the sweep keeps their output.
#[tokio::test]
async fn records_past_the_index_are_recovered_with_their_steps_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let id = sandbox();
    let indexed = {
        let store = crate::Store::open(&path).unwrap();
        let log = SandboxLog::empty(&id);
        for i in 1..=2 {
            log.append(store.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
        let r = store.journal().read().unwrap();
        let logs = r.logs().unwrap();
        logs.iter().find(|l| l.0 == id).map(|l| l.1).unwrap()
    };
    let file = dir
        .path()
        .join(crate::store::LOG_DIR)
        .join(format!("{id}.log"));
    assert!(
        std::fs::metadata(&file).unwrap().len() > indexed,
        "grown ahead"
    );
    let mut past = Vec::new();
    let mut digests = Vec::new();
    for (seq, step) in [(3u64, 7u64), (4, 8)] {
        let (mut e, blobs) = step_entry(step);
        e.seq = seq;
        logs::frame(seq, &e.encode().unwrap(), &mut past);
        let blob_dir = BlobDir::open(dir.path().join(crate::store::BLOB_DIR), |_| true).unwrap();
        for (d, bytes) in blobs {
            blob_dir.write(&d, &bytes).unwrap();
            digests.push(d);
        }
    }
    // And a torn fifth record after them.
    let mut torn = Vec::new();
    logs::frame(5, b"cut short", &mut torn);
    torn.truncate(torn.len() - 2);
    past.extend_from_slice(&torn);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .write_all_at(&past, indexed)
        .unwrap();

    let store = crate::Store::open(&path).unwrap();
    let j = store.journal();
    assert_eq!(seqs(j, &id, 1), [1, 2, 3, 4]);
    let r = j.read().unwrap();
    assert_eq!(r.tail(&id).unwrap(), (4, Some(8)));
    let logged = r.step(&id, 7).unwrap().expect("step 7 indexed");
    let (e, blobs) = r.entry(&id, 3).unwrap().unwrap();
    assert_eq!(logged.seq, 3);
    assert_eq!(hex::encode(logged.digest), e.request_sha256);
    assert_eq!(blobs.len(), 1, "its output survived the sweep");
    // The recovered step row says where its record starts: read there, the same entry.
    assert!(logged.at.is_some(), "recovery keeps the record's place");
    let (again, _) = r.entry_at(&id, &logged).unwrap().unwrap();
    assert_eq!(
        (again.seq, again.request_sha256),
        (3, e.request_sha256.clone())
    );
    assert_eq!(r.blob_count().unwrap(), digests.len() as u64);
    drop(r);
    // The log goes on after them, at seq 5 (the torn record is gone).
    let log = SandboxLog::open(j, &id).unwrap();
    log.append(j, flood_entry(5), None, Vec::new())
        .await
        .unwrap();
    assert_eq!(seqs(j, &id, 1), [1, 2, 3, 4, 5]);
    // Removing the sandbox drops the recovered references with the rest.
    store.remove_sandbox(&id, None).unwrap();
    assert_eq!(j.read().unwrap().blob_count().unwrap(), 0);
}
