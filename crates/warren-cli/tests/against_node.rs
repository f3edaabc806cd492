//! The `warren` binary against the node's real router over its fake runtime (`warren-testkit`'s
//! `FakeDaemon`, on a Unix socket in a temp dir): argument handling, output and exit codes of
//! create, exec, cp, ls, rm and ps. What the fake agent inside answers (the command it ran as
//! JSON, then its stdin; exit codes named by the command's last word) is described on
//! `warren_node::testing`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;
use warren_client::{Client, CreateSandboxRequest};
use warren_testkit::FakeDaemon;

struct Daemon {
    d: FakeDaemon,
    client: Client,
    rt: tokio::runtime::Runtime,
}

fn start() -> Daemon {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let d = rt.block_on(FakeDaemon::start());
    let client = Client::new(&d.url()).unwrap();
    Daemon { d, client, rt }
}

impl Daemon {
    fn warren(&self, args: &[&str], stdin: &[u8]) -> Output {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
            .args(args)
            .env("WARREN_URL", self.d.url())
            .current_dir(self.d.dir())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.d.dir().join(name)
    }

    /// A new sandbox with `labels`.
    fn sandbox(&self, labels: &[(&str, &str)]) -> String {
        let req = CreateSandboxRequest {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        self.rt.block_on(self.client.create(&req)).unwrap().id
    }

    fn ids(&self) -> Vec<String> {
        let list = self.rt.block_on(self.client.list(&BTreeMap::new(), None));
        list.unwrap().into_iter().map(|s| s.id).collect()
    }

    /// What was written at `path` in sandbox `id`: its bytes and mode.
    fn file(&self, id: &str, path: &str) -> (Vec<u8>, Option<u32>) {
        let files = self.d.files(id);
        let files = files.lock().unwrap();
        let f = files
            .get(path)
            .unwrap_or_else(|| panic!("{path} was not written"));
        (f.data.to_vec(), f.mode)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The fake agent's stdout: the command it ran (its `argv`), then its stdin.
fn echoed(stdout: &[u8]) -> (Vec<String>, String) {
    let mut it = serde_json::Deserializer::from_slice(stdout).into_iter::<Value>();
    let spec = it.next().expect("a JSON spec").expect("JSON");
    let rest = text(&stdout[it.byte_offset()..]);
    (serde_json::from_value(spec["argv"].clone()).unwrap(), rest)
}

#[test]
fn create_prints_the_id_alone() {
    let d = start();
    let out = d.warren(
        &[
            "create", "-i", "base", "-i", "task:1", "-l", "run=42", "--ttl", "60",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list =
        d.rt.block_on(d.client.list(&BTreeMap::new(), None))
            .unwrap();
    assert_eq!(list.len(), 1);
    let sb = &list[0];
    assert_eq!(text(&out.stdout), format!("{}\n", sb.id));
    assert_eq!(sb.image, ["base", "task:1"]);
    assert_eq!(
        sb.labels,
        BTreeMap::from([("run".to_string(), "42".to_string())])
    );
    assert_eq!(sb.expires_at_ms, Some(sb.created_at_ms + 60_000));
}

#[test]
fn exec_streams_bytes_and_exits_with_the_command() {
    let d = start();
    let id = d.sandbox(&[]);
    let out = d.warren(
        &["exec", &id, "--", "echo", "hi", "raw-stderr", "exit:3"],
        b"",
    );
    assert_eq!(out.status.code(), Some(3));
    let (argv, stdin) = echoed(&out.stdout);
    assert_eq!(
        (argv, stdin.as_str()),
        (
            vec![
                "echo".into(),
                "hi".into(),
                "raw-stderr".into(),
                "exit:3".into()
            ],
            ""
        )
    );
    // Bytes as they came, not UTF-8 made of them.
    assert_eq!(out.stderr, b"err\xff");

    let out = d.warren(&["exec", &id, "--", "x", "signal:9"], b"");
    assert_eq!(out.status.code(), Some(137));
    let out = d.warren(&["exec", &id, "--", "x", "timeout"], b"");
    assert_eq!(out.status.code(), Some(124));

    std::fs::write(d.path("in.txt"), "fed").unwrap();
    let out = d.warren(
        &[
            "exec",
            &id,
            "--stdin-file",
            "in.txt",
            "-s",
            "--",
            "cat",
            "-",
            "exit:0",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (argv, stdin) = echoed(&out.stdout);
    assert_eq!(argv, ["/bin/sh", "-c", "cat - exit:0"]);
    assert_eq!(stdin, "fed");

    // Piped stdin is streamed; -n leaves it alone.
    let out = d.warren(&["exec", &id, "--", "cat"], b"piped in");
    assert_eq!(
        echoed(&out.stdout),
        (vec!["cat".to_string()], "piped in".into())
    );
    let out = d.warren(&["exec", &id, "-n", "--", "cat"], b"piped in");
    assert_eq!(
        echoed(&out.stdout),
        (vec!["cat".to_string()], String::new())
    );
    // --json: one ExecResult with the output, the command's exit code.
    let out = d.warren(
        &["exec", &id, "--json", "--", "echo", "raw-stderr", "exit:3"],
        b"",
    );
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["encoding"], "base64", "stderr is not UTF-8: {v}");
}

#[test]
fn cp_both_ways_and_through_stdio() {
    let d = start();
    let id = d.sandbox(&[]);
    d.rt.block_on(d.client.mkdir(&id, "/workspace/dir", true, None))
        .unwrap();
    std::fs::write(d.path("task.py"), "print(42)\n").unwrap();
    std::fs::set_permissions(
        d.path("task.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Into an existing directory: the file keeps its name and mode.
    let out = d.warren(&["cp", "./task.py", &format!("{id}:/workspace/dir")], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        d.file(&id, "/workspace/dir/task.py"),
        (b"print(42)\n".to_vec(), Some(0o755))
    );

    // A path that does not exist yet is the new file's.
    let out = d.warren(
        &["cp", "-", &format!("{id}:/workspace/missing.txt")],
        b"from stdin",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(d.file(&id, "/workspace/missing.txt").0, b"from stdin");

    let out = d.warren(&["cp", &format!("{id}:/workspace/missing.txt"), "."], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(d.path("missing.txt")).unwrap(), b"from stdin");

    let out = d.warren(&["cp", &format!("{id}:/workspace/dir/task.py"), "-"], b"");
    assert_eq!(text(&out.stdout), "print(42)\n");

    let out = d.warren(&["cp", &format!("{id}:/missing"), "x"], b"");
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("not_found"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.path("x").exists());

    let out = d.warren(&["cp", "a", "b"], b"");
    assert!(text(&out.stderr).contains("one side must be a sandbox path"));
}

#[test]
fn ls_rm_and_ps() {
    let d = start();
    let id = d.sandbox(&[("run", "42")]);
    let other = d.sandbox(&[]);
    let out = d.warren(&["ls"], b"");
    let table = text(&out.stdout);
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table.contains(&format!("{id}  running  default")),
        "{table}"
    );
    assert!(table.contains("run=42"), "{table}");
    let out = d.warren(&["ls", "--json"], b"");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);

    let out = d.warren(&["ps", &id], b"");
    assert!(
        text(&out.stdout).contains("42   running  -     "),
        "{}",
        text(&out.stdout)
    );

    let out = d.warren(&["rm", "--all"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut deleted: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    deleted.sort();
    let mut both = vec![id.clone(), other];
    both.sort();
    assert_eq!(deleted, both);
    assert!(d.ids().is_empty());

    // A sandbox that is already gone counts as deleted; a failed delete (here an id the node
    // refuses) makes the exit 1, and says why.
    let third = d.sandbox(&[]);
    let out = d.warren(&["rm", &id, &third, "n1-broken"], b"");
    assert_eq!(out.status.code(), Some(1));
    let mut deleted: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    deleted.sort();
    let mut want = vec![id, third];
    want.sort();
    assert_eq!(deleted, want);
    let err = text(&out.stderr);
    assert!(err.contains("deleting n1-broken failed"), "{err}");
    assert!(err.contains("sandbox id must look like"), "{err}");
    assert!(d.ids().is_empty());
}

#[test]
fn unreachable_daemon_is_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["--url", "unix:///nonexistent/w.sock", "health"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot connect to warrend at unix:///nonexistent/w.sock"),
        "{err}"
    );
    assert!(err.contains("warren up --detach"), "{err}");
    // Usage errors are warren's own failures too; --help documents the codes.
    let warren = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
            .args(args)
            .output()
            .unwrap()
    };
    assert_eq!(
        warren(&["create", "--memory", "lots"]).status.code(),
        Some(125)
    );
    let help = warren(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(text(&help.stdout).contains("125"), "{}", text(&help.stdout));
}
