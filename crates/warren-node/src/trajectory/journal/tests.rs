//! Tests of the journal: group commit, the log files as its storage, crash safety.

use super::*;
use crate::trajectory::{flood_entry, SandboxLog};
use warren_types::NodeId;

fn sandbox() -> SandboxId {
    SandboxId::generate(&"n1".parse::<NodeId>().unwrap())
}

fn seqs(j: &Journal, id: &SandboxId, from: u64) -> Vec<u64> {
    let (entries, _) = j.read().unwrap().entries(id, from, 1000).unwrap();
    entries.iter().map(|e| e.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_past_the_budget_cost_about_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::Store::open(dir.path().join("state.redb")).unwrap());
    let id = sandbox();
    let log = Arc::new(SandboxLog::empty(&id));
    let before = store.journal().state_bytes();
    let n = 2000u64;
    // Four callers at once, as the groups of a busy sandbox.
    let tasks: Vec<_> = (0..4u64)
        .map(|w| {
            let (store, log) = (store.clone(), log.clone());
            tokio::spawn(async move {
                for i in (w..n).step_by(4) {
                    log.append(store.journal(), flood_entry(i), None, Vec::new())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let per_entry = (store.journal().state_bytes() - before) / n;
    // As redb rows these took about 1,600 bytes each.
    assert!(per_entry <= 250, "{per_entry} bytes of state per entry");
    assert_eq!(seqs(store.journal(), &id, 1).len(), 1000, "a page");
    assert_eq!(store.journal().read().unwrap().tail(&id).unwrap().0, n);
}

/// Concurrent appends share groups (one sync and one transaction for all of them), and
/// none waits much longer than a group takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::Store::open(dir.path().join("state.redb")).unwrap());
    let (clients, each) = (8u64, 50u64);
    let logs: Vec<_> = (0..clients)
        .map(|_| Arc::new(SandboxLog::empty(&sandbox())))
        .collect();
    let before = store.journal().groups();
    let tasks: Vec<_> = logs
        .iter()
        .map(|log| {
            let (store, log) = (store.clone(), log.clone());
            tokio::spawn(async move {
                let mut worst = std::time::Duration::ZERO;
                for i in 0..each {
                    let t = std::time::Instant::now();
                    log.append(store.journal(), flood_entry(i), None, Vec::new())
                        .await
                        .unwrap();
                    worst = worst.max(t.elapsed());
                }
                worst
            })
        })
        .collect();
    let mut worst = std::time::Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    let groups = store.journal().groups() - before;
    let appends = clients * each;
    println!("{appends} appends from {clients} callers in {groups} groups, longest wait {worst:?}");
    assert!(
        groups * 2 <= appends,
        "{appends} appends took {groups} groups: they do not share syncs"
    );
    // Loose: the machine running the tests may be busy; a wait is one group or two.
    assert!(worst < std::time::Duration::from_secs(2), "{worst:?}");
}

/// Steps of one sandbox committed in one group each keep where their own record starts
/// (not the group's first): a logged step is read back at once, however long the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_sharing_a_group_each_keep_their_records_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::Store::open(dir.path().join("state.redb")).unwrap());
    let id = sandbox();
    let log = Arc::new(SandboxLog::empty(&id));
    let (callers, each) = (8u64, 25u64);
    let before = store.journal().groups();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (store, log) = (store.clone(), log.clone());
            tokio::spawn(async move {
                for k in 0..each {
                    let step = c * 1000 + k;
                    let mut e = flood_entry(step);
                    e.step = Some(step);
                    let digest = [step as u8; 32];
                    log.append(store.journal(), e, Some(digest), Vec::new())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let groups = store.journal().groups() - before;
    assert!(
        groups < callers * each,
        "no group held two appends ({groups} groups)"
    );
    let r = store.journal().read().unwrap();
    for c in 0..callers {
        for k in 0..each {
            let step = c * 1000 + k;
            let logged = r.step(&id, step).unwrap().expect("indexed");
            assert_eq!(logged.digest, [step as u8; 32]);
            let (e, _) = r
                .entry_at(&id, &logged)
                .unwrap()
                .unwrap_or_else(|| panic!("step {step} is not where its row says"));
            assert_eq!((e.seq, e.step), (logged.seq, Some(step)));
        }
    }
}

#[tokio::test]
async fn older_rows_read_before_the_log_and_go_with_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = crate::Store::open(&path).unwrap();
    let id = sandbox();
    // Two entries as an older node kept them: rows of the `trajectory` table.
    let tx = store.journal().db.begin_write().unwrap();
    {
        let mut t = tx.open_table(ENTRIES).unwrap();
        for seq in 1..=2u64 {
            let mut e = flood_entry(seq);
            e.seq = seq;
            t.insert(
                (id.as_str(), seq),
                serde_json::to_vec(&e).unwrap().as_slice(),
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
    let log = SandboxLog::open(store.journal(), &id).unwrap();
    for i in 3..=4 {
        log.append(store.journal(), flood_entry(i), None, Vec::new())
            .await
            .unwrap();
    }
    assert_eq!(seqs(store.journal(), &id, 1), [1, 2, 3, 4]);
    assert_eq!(seqs(store.journal(), &id, 2), [2, 3, 4]);
    assert_eq!(seqs(store.journal(), &id, 4), [4]);
    assert_eq!(store.journal().read().unwrap().tail(&id).unwrap().0, 4);
    let file = dir
        .path()
        .join(crate::store::LOG_DIR)
        .join(format!("{id}.log"));
    assert!(file.exists());
    store.remove_sandbox(&id, None).unwrap();
    assert!(seqs(store.journal(), &id, 1).is_empty());
    assert!(!file.exists(), "the log file goes with the sandbox");
    assert_eq!(store.journal().log_dir().bytes(), 0);
}

#[tokio::test]
async fn a_crash_mid_group_loses_only_what_was_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let id = sandbox();
    let file = dir
        .path()
        .join(crate::store::LOG_DIR)
        .join(format!("{id}.log"));
    {
        let store = crate::Store::open(&path).unwrap();
        let log = SandboxLog::empty(&id);
        for i in 1..=3 {
            log.append(store.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
    }
    // Records written but not committed, and a log whose first commit never came.
    let mut torn = Vec::new();
    logs::frame(4, b"never committed", &mut torn);
    torn.truncate(torn.len() - 3);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .write_all(&torn)
        .unwrap();
    let stray = dir.path().join(crate::store::LOG_DIR).join("n1-stray.log");
    std::fs::write(&stray, b"x").unwrap();
    let store = crate::Store::open(&path).unwrap();
    let committed = committed_logs(&store.journal().db).unwrap()[id.as_str()];
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        committed,
        "cut back to the committed length"
    );
    assert!(!stray.exists());
    let log = SandboxLog::open(store.journal(), &id).unwrap();
    log.append(store.journal(), flood_entry(4), None, Vec::new())
        .await
        .unwrap();
    assert_eq!(seqs(store.journal(), &id, 1), [1, 2, 3, 4]);
}

use std::io::Write as _;

mod bench {
    use super::super::*;

    /// How long one append waits for its commit, alone (no group to share the fsync with):
    /// `cargo test -p warren-node --release -- --ignored append_latency --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, not a check: run by hand with --ignored"]
    async fn append_latency() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let store = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let id: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
        let log = crate::trajectory::SandboxLog::empty(&id);
        let mut ts = Vec::new();
        for i in 0..2000u64 {
            let e = StoredEntry::new(
                warren_types::TrajectoryCall::Kill { pid: 1, signal: 9 },
                None,
                i,
            );
            let t = std::time::Instant::now();
            log.append(store.journal(), e, None, Vec::new())
                .await
                .unwrap();
            ts.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ts.sort_by(f64::total_cmp);
        println!(
            "append p50 {:.3} ms p90 {:.3} ms p99 {:.3} ms",
            ts[1000], ts[1800], ts[1980]
        );
    }
}

/// A log started ahead of its first entry: file grown and indexed at length 0; the first
/// append writes inside it and needs no new file, it survives a restart, and it goes with
/// the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_started_ahead_takes_its_first_entry_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let file = dir.path().join("trajectory-logs");
    let id = sandbox();
    {
        let store = crate::Store::open(&path).unwrap();
        let j = store.journal();
        j.committed(j.start_log(&id).unwrap()).await.unwrap();
        let log_file = file.join(format!("{id}.log"));
        let size = std::fs::metadata(&log_file).unwrap().len();
        assert!(size >= 16 << 10, "grown ahead: {size}");
        assert_eq!(j.read().unwrap().tail(&id).unwrap().0, 0, "indexed, empty");
        // Starting it again changes nothing.
        j.committed(j.start_log(&id).unwrap()).await.unwrap();
        let log = SandboxLog::open(j, &id).unwrap();
        log.append(j, flood_entry(1), None, Vec::new())
            .await
            .unwrap();
        assert_eq!(
            std::fs::metadata(&log_file).unwrap().len(),
            size,
            "written in place"
        );
        assert_eq!(seqs(j, &id, 1), [1]);
    }
    let store = crate::Store::open(&path).unwrap();
    assert_eq!(seqs(store.journal(), &id, 1), [1], "after a restart");
    store.remove_sandbox(&id, None).unwrap();
    assert!(!file.join(format!("{id}.log")).exists());
}
