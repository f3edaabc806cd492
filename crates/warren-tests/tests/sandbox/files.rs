//! The file API: streamed read and write of large files, metadata calls, and refusals of
//! paths that escape the sandbox or do not exist.

use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use warren_client::{ErrorCode, FileKind};

use crate::common::Daemon;

const CHUNK: usize = 1 << 20;
const CHUNKS: usize = 100;

/// Chunk `i` of a deterministic pseudo-random file (xorshift64).
fn chunk(i: usize) -> Bytes {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut out = Vec::with_capacity(CHUNK);
    while out.len() < CHUNK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(CHUNK);
    Bytes::from(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_100mb_streamed_round_trip() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let id = d.sandbox().await;
    let mut want = Sha256::new();
    for i in 0..CHUNKS {
        want.update(chunk(i));
    }
    let want = hex::encode(want.finalize());

    let started = Instant::now();
    let body = futures::stream::iter(0..CHUNKS).map(|i| Ok::<Bytes, std::io::Error>(chunk(i)));
    c.write_file(&id, "/data.bin", Some(0o600), body)
        .await
        .expect("streaming 100 MiB into the sandbox");
    let wrote = started.elapsed();

    let st = c.stat(&id, "/data.bin").await.expect("stat");
    assert_eq!(st.size, (CHUNK * CHUNKS) as u64);
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.mode, 0o600);
    let inside = d.sh_ok(&id, "sha256sum /data.bin").await;
    assert_eq!(inside.split_whitespace().next(), Some(want.as_str()));

    let started = Instant::now();
    let mut stream = c.read_file(&id, "/data.bin").await.expect("reading back");
    let mut got = Sha256::new();
    let mut n = 0u64;
    let mut largest = 0usize;
    while let Some(part) = stream.next().await {
        let part = part.expect("reading a chunk");
        n += part.len() as u64;
        largest = largest.max(part.len());
        got.update(&part);
    }
    let read = started.elapsed();
    assert_eq!(n, (CHUNK * CHUNKS) as u64);
    assert_eq!(hex::encode(got.finalize()), want);
    assert!(
        largest < 64 << 20,
        "the download came in a {largest}-byte piece: not streamed"
    );
    println!("100 MiB: write {wrote:?}, read {read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_list_stat_mkdir_chmod_remove() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let id = d.sandbox().await;

    c.mkdir(&id, "/work/a/b", true, Some(0o750))
        .await
        .expect("mkdir -p");
    let st = c.stat(&id, "/work/a/b").await.unwrap();
    assert_eq!((st.kind, st.mode), (FileKind::Dir, 0o750));
    // Without `parents` a missing parent is an error, and so is an existing directory.
    let e = c.mkdir(&id, "/nope/x", false, None).await.unwrap_err();
    assert!(e.status().is_some_and(|s| (400..500).contains(&s)), "{e}");

    c.write_file_bytes(&id, "/work/a/hello.txt", Some(0o640), "hello\n")
        .await
        .unwrap();
    c.write_file_bytes(&id, "/work/a/b/empty", None, Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        &c.read_file_bytes(&id, "/work/a/hello.txt").await.unwrap()[..],
        b"hello\n"
    );
    assert_eq!(d.sh_ok(&id, "cat /work/a/hello.txt").await, "hello\n");
    // Writes truncate.
    c.write_file_bytes(&id, "/work/a/hello.txt", None, "hi\n")
        .await
        .unwrap();
    let st = c.stat(&id, "/work/a/hello.txt").await.unwrap();
    assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 3, 0o640));
    assert_eq!(st.uid, 0);

    d.sh_ok(&id, "ln -s hello.txt /work/a/link").await;
    let mut names: Vec<(String, FileKind)> = c
        .list_dir(&id, "/work/a")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        names,
        [
            ("b".to_string(), FileKind::Dir),
            ("hello.txt".to_string(), FileKind::File),
            ("link".to_string(), FileKind::Symlink),
        ]
    );
    let link = c.stat(&id, "/work/a/link").await.unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(link.link_target.as_deref(), Some("hello.txt"));

    c.chmod(&id, "/work/a/hello.txt", 0o755).await.unwrap();
    assert_eq!(c.stat(&id, "/work/a/hello.txt").await.unwrap().mode, 0o755);
    assert_eq!(d.sh_ok(&id, "stat -c %a /work/a/hello.txt").await, "755\n");

    c.remove(&id, "/work/a/hello.txt", false).await.unwrap();
    let e = c.stat(&id, "/work/a/hello.txt").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    // A non-empty directory needs `recursive`.
    let e = c.remove(&id, "/work/a", false).await.unwrap_err();
    assert!(e.status().is_some_and(|s| (400..500).contains(&s)), "{e}");
    c.remove(&id, "/work/a", true).await.unwrap();
    assert_eq!(d.sh(&id, "test -e /work/a").await.exit_code, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_path_escape_and_missing_files() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let id = d.sandbox().await;

    for path in ["/../etc/passwd", "/a/../../etc", "/..", "relative"] {
        let e = c.read_file_bytes(&id, path).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "read {path:?}: {e}");
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "read {path:?}: {e}");
    }
    let e = c.read_file_bytes(&id, "").await.unwrap_err();
    assert_eq!(e.status(), Some(400), "read an empty path: {e}");
    let e = c
        .write_file_bytes(&id, "/../escape", None, "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    let e = c.mkdir(&id, "/../escape", true, None).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    let e = c.list_dir(&id, "/..").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    let e = c.stat(&id, "/x/../../..").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    let e = c.chmod(&id, "/../etc/shadow", 0o777).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    let e = c.remove(&id, "/../tmp", true).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{e}");
    // `..` that stays inside is fine, and symlinks resolve inside the sandbox's root.
    assert!(!c
        .read_file_bytes(&id, "/etc/../etc/hostname")
        .await
        .unwrap()
        .is_empty());
    d.sh_ok(&id, "ln -s /../../../../etc/os-release /tmp/up")
        .await;
    let through_link = c.read_file_bytes(&id, "/tmp/up").await.unwrap();
    let inside = d.sh_ok(&id, "cat /etc/os-release").await;
    assert_eq!(&through_link[..], inside.as_bytes());

    for path in ["/no/such/file", "/tmp/missing"] {
        let e = c.read_file_bytes(&id, path).await.unwrap_err();
        assert_eq!(e.status(), Some(404), "read {path}: {e}");
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "read {path}: {e}");
        let e = c.stat(&id, path).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "stat {path}: {e}");
    }
    let e = c.list_dir(&id, "/no/such/dir").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // Files of a sandbox that does not exist.
    let e = c
        .read_file_bytes(&crate::common::unknown_id(&d.node), "/etc/hostname")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
}

/// Missing parent directories are made: a file written under them, and a sandbox's working
/// directory at its create. One that cannot be made (a file is in the way) is one clear
/// error: a file error for the write, a refused create for the workdir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_workdirs_make_their_parents() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let id = d.sandbox().await;
    c.write_file_bytes(&id, "/srv/new/deep/task.py", None, "print(1)\n")
        .await
        .unwrap();
    assert_eq!(
        d.sh_ok(&id, "cat /srv/new/deep/task.py").await,
        "print(1)\n"
    );
    let e = c
        .write_file_bytes(&id, "/etc/hostname/x/y", None, "x")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::FileError), "{e}");
    c.delete(&id).await.unwrap();

    let sb = d
        .create(&warren_client::CreateSandboxRequest {
            workdir: Some("/workspace/run/7".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(d.sh_ok(&sb.id, "pwd").await, "/workspace/run/7\n");
    c.delete(&sb.id).await.unwrap();
    let e = c
        .create(&warren_client::CreateSandboxRequest {
            workdir: Some("/etc/hostname/w".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    assert!(e.to_string().contains("workdir /etc/hostname/w"), "{e}");
    assert!(
        d.list().await.is_empty(),
        "the refused create left a sandbox"
    );
}

/// An upload whose directory the sandbox moves away while it streams, then cut off: its
/// temporary file goes with it wherever the directory went (it was made and is removed
/// through the directory's fd, not its path); one that completes lands in the moved
/// directory, also without a leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_an_upload_raced_by_the_sandbox_leaves_no_temporary_file() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    for finish in [false, true] {
        d.sh_ok(&id, "rm -rf /up /moved && mkdir /up").await;
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let (c, sid) = (d.client().clone(), id.clone());
        let upload =
            tokio::spawn(async move { c.write_file(&sid, "/up/data.bin", None, rx).await });
        futures::SinkExt::send(&mut tx, Ok(Bytes::from_static(b"first part")))
            .await
            .unwrap();
        // The upload's file is there once its first part is.
        let seen = crate::common::wait_for(std::time::Duration::from_secs(10), || async {
            let r = d.sh(&id, "ls -A /up").await;
            r.stdout.contains(".upload-").then_some(())
        })
        .await;
        assert!(seen.is_some(), "the upload never started");
        d.sh_ok(&id, "mv /up /moved").await;
        if finish {
            futures::SinkExt::send(&mut tx, Ok(Bytes::from_static(b", second part")))
                .await
                .unwrap();
            drop(tx);
            upload.await.unwrap().unwrap();
            assert_eq!(
                d.sh_ok(&id, "cat /moved/data.bin").await,
                "first part, second part"
            );
        } else {
            futures::SinkExt::send(&mut tx, Err(std::io::Error::other("cut off")))
                .await
                .unwrap();
            drop(tx);
            assert!(upload.await.unwrap().is_err(), "a cut-off upload succeeded");
        }
        // A cut-off upload is cleaned up once the agent hears of it (after the answer).
        let clean = crate::common::wait_for(std::time::Duration::from_secs(10), || async {
            let left = d.sh_ok(&id, "ls -A /moved").await;
            (!left.contains(".upload-")).then_some(())
        })
        .await;
        assert!(
            clean.is_some(),
            "an upload's temporary file is left (finished: {finish}): {}",
            d.sh_ok(&id, "ls -A /moved").await
        );
    }
}
