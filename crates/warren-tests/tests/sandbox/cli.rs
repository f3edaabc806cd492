//! The `warren` command against a real daemon: piped stdin, directory copies.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::common::{bin_dir, Daemon};

/// `warren --url <daemon> ARGS` with `stdin` piped in; returns its output.
pub fn warren_with_stdin(d: &Daemon, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let warren = bin_dir().join("warren");
    assert!(warren.is_file(), "{} is missing", warren.display());
    let mut child = Command::new(warren)
        .arg("--url")
        .arg(format!("unix://{}", d.socket.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running warren");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // Written from a thread: the command's output must be read while its input goes in.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("waiting for warren");
    writer.join().unwrap();
    out
}

/// `echo hi | warren exec ID -- cat` prints `hi`; binary input of several MiB (every byte
/// value, NULs included) comes back intact; `--no-stdin` gives the command an empty stdin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_stdin_reaches_the_command() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let out = warren_with_stdin(&d, &["exec", &id, "--", "cat"], b"hi\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, b"hi\n");

    let big: Vec<u8> = (0..(5u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
    let out = warren_with_stdin(
        &d,
        &[
            "exec",
            &id,
            "-s",
            "--",
            "cat > /tmp/in && sha256sum < /tmp/in",
        ],
        &big,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let want = {
        use sha2::Digest as _;
        hex(&sha2::Sha256::digest(&big))
    };
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).split(' ').next(),
        Some(want.as_str())
    );
    // And back out through stdout, byte for byte.
    let out = warren_with_stdin(&d, &["exec", &id, "--", "cat"], &big);
    assert!(
        out.stdout == big,
        "{} bytes back of {}",
        out.stdout.len(),
        big.len()
    );

    let out = warren_with_stdin(&d, &["exec", &id, "-n", "--", "wc", "-c"], b"ignored");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{out:?}");
    // The command's own exit code still comes through.
    let out = warren_with_stdin(&d, &["exec", &id, "-s", "--", "read x; exit $x"], b"7\n");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
