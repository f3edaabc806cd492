//! `warren call` prints the outputs and exits with the call's exit code.

use crate::common::{bin_dir, skip, Daemon};

fn warren(d: &Daemon, args: &[&str]) -> std::process::Output {
    crate::common::warren_at(&format!("unix://{}", d.socket.display()), args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_call_passes_the_exit_code_through() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    if !bin_dir().join("warren").is_file() {
        skip(format!("{} is missing", bin_dir().join("warren").display()));
        return;
    }
    let out = warren(
        &d,
        &["call", "--", "sh", "-c", "echo out; echo err >&2; exit 7"],
    );
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    let dir = d.dir.join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    let local = dir.join("prog.sh");
    std::fs::write(&local, "echo from-file; echo made > /w/res\n").unwrap();
    let spec = format!("{}:/w/prog.sh", local.display());
    let saved = dir.join("res.txt");
    let save = format!("/w/res:{}", saved.display());
    let out = warren(
        &d,
        &[
            "call",
            "--image",
            "default",
            "--file",
            &spec,
            "-o",
            &save,
            "--",
            "sh",
            "/w/prog.sh",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The command's output alone on stdout; the file on the host.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-file\n");
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), "made\n");
    let out = warren(
        &d,
        &[
            "call",
            "--file",
            &spec,
            "-o",
            "/w/res:-",
            "--",
            "sh",
            "/w/prog.sh",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-file\nmade\n",
        "{out:?}"
    );

    let out = warren(&d, &["call", "--timeout", "0.3", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    let out = warren(&d, &["call", "--image", "no-such-image", "--", "true"]);
    // Warren's own failure, told apart from any exit code of the command.
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not_found"),
        "{out:?}"
    );
}
