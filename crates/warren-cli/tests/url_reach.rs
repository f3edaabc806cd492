//! `--url` is never silently ignored: every `warren` subcommand, given `--url` naming a
//! second daemon, either acts on that daemon (the daemon sees the call, and the local image
//! store is untouched) or refuses the flag with warren's own exit status. The walk covers
//! every subcommand `warren --help` lists (and theirs): a new one fails this test until it is
//! added to the table below.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Router;

const ID: &str = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5";

/// What a subcommand does with `--url`.
enum Expect {
    /// Calls the daemon at the URL.
    Calls,
    /// Refuses the flag (exit 125, naming `--url`).
    Refuses,
    /// Hands the URL to another program (`warren bench` runs `warren-bench --url …`; its
    /// unit test checks the hand-over).
    Forwards,
}

/// Every subcommand path, its arguments after the path, and what it does with `--url`.
fn table() -> Vec<(&'static str, Vec<&'static str>, Expect)> {
    use Expect::*;
    vec![
        ("up", vec!["--detach"], Refuses),
        ("health", vec![], Calls),
        ("create", vec![], Calls),
        ("exec", vec![ID, "--", "true"], Calls),
        ("call", vec!["--", "true"], Calls),
        (
            "cp",
            vec!["local.txt", "n1-01jd0m7x4e8k0k9yq1w2e3r4t5:/x"],
            Calls,
        ),
        ("ls", vec![], Calls),
        ("rm", vec![ID], Calls),
        ("shell", vec![ID], Calls),
        ("ps", vec![ID], Calls),
        ("pause", vec![ID], Calls),
        ("resume", vec![ID], Calls),
        ("net", vec![ID], Calls),
        ("fork", vec![ID], Calls),
        ("snapshot create", vec![ID], Calls),
        ("snapshot ls", vec![], Calls),
        ("snapshot inspect", vec!["n1-snap-x"], Calls),
        ("snapshot rm", vec!["n1-snap-x"], Calls),
        ("revive", vec![ID], Calls),
        ("trajectory", vec![ID], Calls),
        ("demo", vec![], Calls),
        ("bench", vec!["create"], Forwards),
        ("image build", vec!["ctx", "--tag", "built:1"], Calls),
        (
            "image build-layer",
            vec!["ctx", "--tag", "layer:1"],
            Refuses,
        ),
        (
            "image import",
            vec!["image.tar", "--tag", "imported:1"],
            Calls,
        ),
        (
            "image stack",
            vec!["--tag", "stacked:1", "default"],
            Refuses,
        ),
        ("image tag", vec!["default", "other:1"], Refuses),
        ("image ls", vec![], Calls),
        ("image inspect", vec!["default"], Calls),
        ("image rm", vec!["default"], Calls),
        ("image gc", vec![], Calls),
        ("image verify", vec!["default"], Refuses),
        ("inspect", vec![ID], Calls),
        ("stats", vec![ID], Calls),
        ("extend", vec![ID, "--ttl", "1h"], Calls),
        ("completion", vec!["bash"], Refuses),
        ("cluster", vec![], Calls),
        ("cluster drain", vec!["n1"], Calls),
        ("cluster undrain", vec!["n1"], Calls),
        ("cluster forget", vec!["n1"], Calls),
    ]
}

fn warren(args: &[&str], dir: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(args)
        .env_remove("WARREN_URL")
        .env("WARREN_IMAGE_STORE", dir.join("local-store"))
        .env("WARREN_TOKEN", "t")
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// The subcommands `warren [path] --help` lists (without `help`).
fn subcommands(path: &[&str], dir: &Path) -> Vec<String> {
    let mut args = path.to_vec();
    args.push("--help");
    let out = warren(&args, dir);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some(start) = text.find("Commands:\n") else {
        return Vec::new();
    };
    text[start + "Commands:\n".len()..]
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// Every `warren …` command path.
fn all_paths(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for top in subcommands(&[], dir) {
        out.insert(top.clone());
        for sub in subcommands(&[&top], dir) {
            out.insert(format!("{top} {sub}"));
        }
    }
    out
}

#[test]
fn every_subcommand_acts_on_the_daemon_named_or_refuses_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("local.txt"), b"x").unwrap();
    std::fs::create_dir(d.join("ctx")).unwrap();
    std::fs::write(d.join("ctx/Dockerfile"), b"FROM default\n").unwrap();
    std::fs::write(d.join("image.tar"), b"not really a tar").unwrap();

    // The table names every subcommand there is, and nothing else.
    let table = table();
    let named: BTreeSet<String> = table.iter().map(|(p, _, _)| p.to_string()).collect();
    let mut paths = all_paths(d);
    // A group whose members are all listed stands for itself only through them.
    for group in ["snapshot", "image"] {
        paths.remove(group);
    }
    assert!(paths.len() > 30, "{paths:?}");
    assert_eq!(named, paths, "the table and `warren --help` disagree");

    // The second daemon: it answers every call with an error and remembers it.
    let sock = d.join("second.sock");
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = Router::new()
        .fallback(
            |State(seen): State<Arc<Mutex<Vec<String>>>>, req: Request| async move {
                seen.lock()
                    .unwrap()
                    .push(format!("{} {}", req.method(), req.uri().path()));
                let body = r#"{"error":{"code":"not_found","message":"the second daemon"}}"#;
                (
                    StatusCode::NOT_FOUND,
                    [("content-type", "application/json")],
                    body,
                )
                    .into_response()
            },
        )
        .with_state(seen.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(&sock) })
        .unwrap();
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("unix://{}", sock.display());

    let mut wrong = Vec::new();
    for (path, rest, expect) in &table {
        seen.lock().unwrap().clear();
        let mut args: Vec<&str> = path.split(' ').collect();
        args.extend(["--url", &url]);
        args.extend(rest.iter().copied());
        let out = warren(&args, d);
        let calls = seen.lock().unwrap().clone();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let ok = match expect {
            Expect::Calls => !calls.is_empty(),
            Expect::Refuses => {
                calls.is_empty() && out.status.code() == Some(125) && err.contains("--url")
            }
            Expect::Forwards => true,
        };
        if !ok {
            wrong.push(format!(
                "warren {}: exit {:?}, daemon saw {calls:?}: {err}",
                args.join(" "),
                out.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Nothing acted on this host's image store.
    assert!(!d.join("local-store").exists(), "the local store was used");
}
