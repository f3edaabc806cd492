//! Build steps that work against the node: output without end of line, and a client that
//! goes away while a step runs.

use crate::common::{bin_dir, Daemon};
use crate::{build, layers, result_of, unique, write};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A step's output without newlines comes in lines of at most 16 KiB, all of it. Before, the
/// builder held the bytes until a newline (a step could fill the daemon's memory with
/// `head -c 10G /dev/zero`) and sent them as one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_output_without_newlines_comes_in_bounded_lines() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("build-long-line");
    write(
        t.path(),
        "Dockerfile",
        "FROM default\nRUN head -c 100000 /dev/zero | tr '\\0' a\n",
    );
    let tag = format!("{}:1", unique("longline"));
    let (code, out, err) = build(
        &d,
        &[
            t.path().to_str().unwrap(),
            "-t",
            &tag,
            "--json",
            "--no-cache",
        ],
    );
    assert_eq!(code, 0, "{err}");
    result_of(&out);
    let lines: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "output")
        .map(|v| v["line"].as_str().unwrap_or_default().to_string())
        .collect();
    let longest = lines.iter().map(String::len).max().unwrap_or(0);
    assert!(longest <= 16 << 10, "a line of {longest} bytes");
    let total: usize = lines.iter().map(String::len).sum();
    assert_eq!(total, 100_000, "every byte is logged");
    assert!(lines.iter().all(|l| l.bytes().all(|b| b == b'a')));
}

/// A client that goes away cancels the build: while a step's sandbox is made, and while its
/// command runs. The step's sandbox is deleted and nothing is tagged. Before, the build ran
/// on for nobody, its step up to the step timeout (30 minutes by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_whose_client_goes_away_is_cancelled() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("build-gone");
    write(
        t.path(),
        "Dockerfile",
        "FROM default\nRUN echo step-started && sleep 1000\n",
    );
    // The step's announcement (its sandbox is being made), then the command's output.
    let step = |v: &serde_json::Value| {
        v["type"] == "step"
            && v["instruction"]
                .as_str()
                .is_some_and(|i| i.starts_with("RUN"))
    };
    let output = |v: &serde_json::Value| v["type"] == "output" && v["line"] == "step-started";
    for at in [
        &step as &(dyn Fn(&serde_json::Value) -> bool + Sync),
        &output,
    ] {
        let tag = format!("{}:1", unique("gone"));
        let mut cli = Command::new(bin_dir().join("warren"))
            .arg("--url")
            .arg(format!("unix://{}", d.socket.display()))
            .args(["image", "build", t.path().to_str().unwrap(), "-t", &tag])
            .args(["--json", "--no-cache"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("running warren image build");
        let stdout = cli.stdout.take().unwrap();
        let reached = std::thread::scope(|s| {
            s.spawn(|| {
                BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
                    .any(|v| at(&v))
            })
            .join()
            .unwrap()
        });
        assert!(reached, "the build never got there");
        cli.kill().unwrap();
        cli.wait().unwrap();
        // A bound for a hang only: without the cancel the sandbox lives for 1000 s.
        let until = Instant::now() + Duration::from_secs(120);
        while !d.list().await.is_empty() {
            assert!(
                Instant::now() < until,
                "the step's sandbox outlived its client: {:?}; log:\n{}",
                d.list().await,
                d.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(d.client().image(&tag).await.is_err(), "nothing is tagged");
    }
}

/// The daemon's scratch files (`<what>-<pid>-…` in the image store's tmp) named `what`.
fn scratch_of(d: &Daemon, what: &str) -> Vec<String> {
    let pid = d.pid().expect("daemon pid");
    std::fs::read_dir(crate::common::image_store().join("tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{what}-{pid}-")))
        .collect()
}

/// A client that goes away in the middle of sending the context leaves no scratch file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_upload_cut_short_leaves_no_scratch_file() {
    use tokio::io::AsyncWriteExt;
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut s = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let tag = format!("{}:1", unique("cut"));
    let head = format!(
        "POST /v1/images/build?tag={tag} HTTP/1.1\r\nHost: warren\r\n\
         Content-Type: application/x-tar\r\nContent-Length: 100000000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![0u8; 1 << 20]).await.unwrap();
    s.flush().await.unwrap();
    let spooled = crate::common::wait_for(Duration::from_secs(60), || async {
        let f = scratch_of(&d, "build-context.tar");
        (!f.is_empty()).then_some(f)
    })
    .await;
    assert!(spooled.is_some(), "the context is never spooled");
    drop(s);
    let gone = crate::common::wait_for(Duration::from_secs(60), || async {
        let left: Vec<String> = scratch_of(&d, "build-context");
        left.is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "scratch files left: {:?}",
        scratch_of(&d, "build-context")
    );
    assert!(d.list().await.is_empty());
}
