//! The streamed export (outputs of a MiB or more read from their files chunk by chunk) is
//! byte for byte the export built whole: text with characters cut at chunk boundaries and
//! characters JSON escapes, binary output (base64, both streams then), outputs on either
//! stream, beside entries without output.

use futures::StreamExt;
use warren_types::{CreateSandboxRequest, ExitInfo, SandboxId, TrajectoryCall};

use crate::testing::manager_in;
use crate::testing::Calls as _;
use crate::trajectory::{Room, StoredEntry, StoredExec, StoredResult};

/// Text of `n` bytes or a little more, of 1- to 4-byte characters and characters JSON
/// escapes.
fn text(n: usize) -> Vec<u8> {
    let unit = "a\"\\\n\té€😀\u{1}z".as_bytes();
    unit.iter()
        .copied()
        .cycle()
        .take(n + (unit.len() - n % unit.len()))
        .collect()
}

fn binary(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7919 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_export_is_the_export_built_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _rt) = manager_in(dir.path(), |_| {});
    let id: SandboxId = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info
        .id
        .parse()
        .unwrap();
    let sb = m.lookup(&id).unwrap();
    let outputs: [(Vec<u8>, Vec<u8>); 4] = [
        (text(3 << 20), b"err".to_vec()),
        (binary(2 << 20), text(1_500_000)),
        (b"small".to_vec(), text((1 << 20) + 1)),
        (text(100), binary(10)),
    ];
    for (i, (out, err)) in outputs.iter().enumerate() {
        let mut entry = StoredEntry::new(
            TrajectoryCall::Pause { by: "test".into() },
            Some(i as u64 + 1),
            1,
        );
        let mut blobs = Vec::new();
        entry.result = Some(StoredResult::Exec(StoredExec::new(
            ExitInfo::default(),
            out,
            err,
            &mut Room::unlimited(),
            &mut blobs,
        )));
        sb.log
            .append(m.journal(), entry, None, blobs)
            .await
            .unwrap();
    }

    let whole = warren_types::trajectory::ndjson_lines(
        &m.parts().trajectories.entries(&m, &id, 1).await.unwrap(),
    );
    let mut streamed = Vec::new();
    let mut chunks = 0;
    let mut stream = Box::pin(
        m.parts()
            .trajectories
            .trajectory(&m, &id, 1)
            .unwrap()
            .into_stream(),
    );
    while let Some(c) = stream.next().await {
        let c = c.unwrap();
        assert!(c.len() < 1 << 20, "a chunk of {} bytes", c.len());
        streamed.extend_from_slice(&c);
        chunks += 1;
    }
    assert!(chunks > 10, "{chunks} chunks");
    assert_eq!(streamed.len(), whole.len());
    assert!(streamed == whole, "the streamed export differs");
    let lines: Vec<serde_json::Value> = streamed
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["result"]["encoding"], "utf8");
    assert_eq!(lines[1]["result"]["encoding"], "base64");
}
