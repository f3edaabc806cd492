//! Build steps that work against the node: output without end of line.

use crate::common::Daemon;
use crate::{build, layers, result_of, unique, write};

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
