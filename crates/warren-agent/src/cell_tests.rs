//! The parts of a call environment that need no namespaces: its configuration, its input,
//! the files a call brings, program lookup, collected files and the warm interpreter.

use super::*;
use base64::Engine;
use warren_types::ErrorCode;

fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A warm call's header, read back: (kind, code or path, cwd, argv, env).
type Header = (String, String, String, Vec<String>, Vec<(String, String)>);

/// Reads a header the way the bootstrap does: the length line, then length-prefixed fields.
fn parse_header(h: &[u8]) -> Header {
    let nl = h.iter().position(|b| *b == b'\n').unwrap();
    let len: usize = std::str::from_utf8(&h[..nl]).unwrap().parse().unwrap();
    let mut rest = &h[nl + 1..];
    assert_eq!(len, rest.len(), "the length line counts the payload");
    let mut f = Vec::new();
    while !rest.is_empty() {
        let nl = rest.iter().position(|b| *b == b'\n').unwrap();
        let n: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
        f.push(String::from_utf8(rest[nl + 1..nl + 1 + n].to_vec()).unwrap());
        rest = &rest[nl + 1 + n..];
    }
    let argc: usize = f[3].parse().unwrap();
    let env = f[4 + argc..]
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    (
        f[0].clone(),
        f[1].clone(),
        f[2].clone(),
        f[4..4 + argc].to_vec(),
        env,
    )
}

#[test]
fn a_cell_sees_the_layers_where_the_agent_bound_them() {
    let cfg = ContainerInit {
        lowerdirs: vec!["/var/lib/warren/a".into(), "/var/lib/warren/b".into()],
        disk_mb: 64,
        writable_dir: None,
        layer_trees: false,
        hostname: "fn".into(),
        masked_paths: vec!["/proc/kcore".into()],
        readonly_paths: vec![],
        seccomp: true,
        function: Some(FunctionInit::default()),
        landlock: true,
        best_effort: false,
        apparmor_profile: None,
        sysfs: Some("/var/lib/warren/images/mnt/sysfs".into()),
        devpts: true,
        resolv_conf: None,
        owner_uid: None,
        user_limits: vec![],
        command_groups: 0,
    };
    let c = cell_config(&cfg);
    assert_eq!(
        c.lowerdirs,
        [
            ETC_LAYER.to_string(),
            format!("{LOWER_DIR}/0"),
            format!("{LOWER_DIR}/1")
        ]
    );
    assert_eq!(
        (c.sysfs.as_deref(), c.devpts),
        (Some("/sys"), false),
        "a call shows the agent's /sys and has no devpts"
    );
    assert_eq!(
        ContainerInit {
            lowerdirs: cfg.lowerdirs.clone(),
            sysfs: cfg.sysfs.clone(),
            devpts: cfg.devpts,
            ..c
        },
        cfg,
        "nothing else changes"
    );
}

#[test]
fn the_warm_interpreter_takes_code_and_scripts_run_as_root() {
    let env = vec![("PATH".to_string(), "/bin".to_string())];
    let h = warm_header(
        "python3",
        &spec(&["python3", "-c", "print(1)", "a"]),
        &env,
        "/w",
    );
    let (kind, code, cwd, argv, env) = parse_header(&h.unwrap());
    assert_eq!((kind.as_str(), code.as_str()), ("code", "print(1)"));
    assert_eq!(argv, ["-c", "a"]);
    assert_eq!(cwd, "/w");
    assert_eq!(env, [("PATH".to_string(), "/bin".to_string())]);

    // A path to the same interpreter, a script, and root named either way.
    let mut s = spec(&["/usr/bin/python3", "/app/main.py", "--flag"]);
    for user in [None, Some("root"), Some("0")] {
        s.user = user.map(str::to_string);
        let (kind, path, _, argv, _) = parse_header(&warm_header("python3", &s, &[], "/").unwrap());
        assert_eq!((kind.as_str(), path.as_str()), ("path", "/app/main.py"));
        assert_eq!(argv, ["/app/main.py", "--flag"]);
    }
}

#[test]
fn other_calls_start_cold() {
    let cold = |argv: &[&str], user: Option<&str>| {
        let mut s = spec(argv);
        s.user = user.map(str::to_string);
        warm_header("python3", &s, &[], "/").is_none()
    };
    assert!(cold(&[], None), "no program");
    assert!(
        cold(&["python3.12", "-c", "1"], None),
        "another interpreter"
    );
    assert!(cold(&["sh", "-c", "python3"], None));
    assert!(cold(&["python3", "-c", "1"], Some("1000")), "another user");
    assert!(
        cold(&["python3", "-m", "http.server"], None),
        "interpreter flags"
    );
    assert!(cold(&["python3", "-c"], None), "-c without code");
    assert!(cold(&["python3"], None), "an interactive interpreter");
}

#[test]
fn a_warm_interpreter_runs_the_call_it_is_handed() {
    let f = FunctionInit {
        interpreter: Some("python3".into()),
        preload: vec!["json".into(), "json; raise SystemExit(3)".into()],
    };
    // The second preload is not a module name: it is left out (or the start would fail).
    let w = WarmPython::start("python3", &f).expect("python3 warms up (it is installed)");
    // Fields hold any bytes: newlines, digits and non-ASCII text read back whole.
    let s = spec(&[
        "python3",
        "-c",
        "import os, sys; print(sys.argv, 6 * 7, repr(os.environ['K']), sorted(os.environ))",
        "x\n12\ny",
        "é",
    ]);
    let env = [("K".into(), "v\n3\nw".into()), ("L".into(), String::new())];
    let h = w.header(&s, &env, "/").unwrap();
    let mut child = w.child;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&h).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "['-c', 'x\\n12\\ny', 'é'] 42 'v\\n3\\nw' ['K', 'L']\n"
    );
}

/// Runs `argv` on a freshly warmed interpreter: (exit status, stdout, stderr).
fn run_warm(argv: &[&str]) -> (i32, String, String) {
    let f = FunctionInit {
        interpreter: Some("python3".into()),
        preload: vec![],
    };
    let w = WarmPython::start("python3", &f).expect("python3 warms up (it is installed)");
    let h = w.header(&spec(argv), &[], "/").unwrap();
    let mut child = w.child;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&h).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_warm_script_runs_as_the_main_module() {
    let dir = std::env::temp_dir().join(format!("warren-warm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("main.py");
    // What it defines is `__main__`'s (pickled by reference), `__file__` is the script, no
    // name of the bootstrap is left, and its directory leads `sys.path`.
    std::fs::write(
        &script,
        "import os, pickle, sys\n\
         class Point:\n    pass\n\
         p = pickle.loads(pickle.dumps(Point()))\n\
         left = sorted(k for k in globals() if k.startswith('_warren'))\n\
         print(type(p).__module__, __name__, __file__ == sys.argv[0], left, \
               sys.path[0] == os.path.dirname(__file__), sys.argv[1:])\n",
    )
    .unwrap();
    let path = script.to_str().unwrap();
    let (rc, out, err) = run_warm(&["python3", path, "a"]);
    assert_eq!(
        (rc, out.as_str()),
        (0, "__main__ __main__ True [] True ['a']\n"),
        "{err}"
    );

    // An exception's traceback starts at the program, as the interpreter prints it; a syntax
    // error names the script.
    std::fs::write(&script, "def f():\n    raise ValueError('boom')\nf()\n").unwrap();
    let (rc, _, err) = run_warm(&["python3", path]);
    assert_eq!(rc, 1);
    assert!(
        err.starts_with("Traceback (most recent call last):\n  File \""),
        "{err}"
    );
    assert!(
        err.contains("ValueError: boom") && !err.contains("_warren"),
        "{err}"
    );
    std::fs::write(&script, "print(\n").unwrap();
    let (rc, _, err) = run_warm(&["python3", path]);
    assert_eq!(rc, 1);
    assert!(err.contains(path) && err.contains("SyntaxError"), "{err}");
    assert!(!err.contains("Traceback"), "{err}");
    let (rc, out, _) = run_warm(&["python3", "-c", "import sys; print(__name__); sys.exit(4)"]);
    assert_eq!((rc, out.as_str()), (4, "__main__\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_preload_that_fails_leaves_the_cell_cold() {
    let f = FunctionInit {
        interpreter: Some("python3".into()),
        preload: vec!["no_such_module_for_warren".into()],
    };
    assert!(WarmPython::start("python3", &f).is_none());
}

/// The agent's end and the cell's [`Input`] on a socket pair.
fn pair() -> (UnixStream, Input) {
    let (agent, cell) = UnixStream::pair().unwrap();
    let input = Input {
        ctl: cell,
        buf: Vec::new(),
        eof: false,
    };
    (agent, input)
}

fn send(to: &mut UnixStream, kind: Kind, data: &[u8]) {
    Frame::new(1, kind, data.to_vec())
        .write_blocking(to)
        .unwrap();
}

#[test]
fn input_buffers_what_it_is_asked_for_until_eof() {
    let (mut agent, mut input) = pair();
    send(&mut agent, Kind::Stdin, b"abc");
    send(&mut agent, Kind::Credit, &[0, 0, 0, 1]);
    send(&mut agent, Kind::Stdin, b"defg");
    send(&mut agent, Kind::Eof, b"");
    assert!(input.fill(2));
    assert_eq!(input.buf, b"abc", "reads no more frames than needed");
    assert!(input.fill(5));
    assert_eq!(input.buf, b"abcdefg", "other kinds are skipped");
    assert!(!input.eof);
    assert!(input.fill(100), "EOF ends the input without failing");
    assert!(input.eof);
    // After EOF nothing more is read, even when the agent is gone.
    drop(agent);
    assert!(input.fill(1000));
    assert_eq!(input.buf, b"abcdefg");
}

#[test]
fn input_fails_on_cancel_or_a_lost_agent() {
    let (mut agent, mut input) = pair();
    send(&mut agent, Kind::Stdin, b"ab");
    send(&mut agent, Kind::Cancel, b"");
    assert!(!input.fill(10));
    let (agent, mut input) = pair();
    drop(agent);
    assert!(!input.fill(1));
    assert!(input.fill(0), "nothing asked, nothing read");
}

#[test]
fn call_files_are_written_with_their_directories_and_modes() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a/b/run.sh");
    write_file(p.to_str().unwrap(), b"#!/bin/sh\n", Some(0o100755)).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"#!/bin/sh\n");
    let mode = std::fs::metadata(&p).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755, "only permission bits are applied");
    // Under a regular file no directory can be made: the caller's error.
    let bad = d.path().join("a/b/run.sh/x");
    let e = write_file(bad.to_str().unwrap(), b"", None).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    assert!(e.to_string().starts_with(bad.to_str().unwrap()), "{e}");
}

#[test]
fn programs_are_looked_up_in_the_commands_own_path() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    // The first directory has a file of that name that is not executable: skipped.
    std::fs::write(a.join("tool"), b"").unwrap();
    std::fs::write(b.join("tool"), b"").unwrap();
    std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", a.display(), b.display());
    let env = vec![
        ("PATH".to_string(), path),
        ("X".to_string(), "1".to_string()),
    ];
    let mut cmd = std::process::Command::new("tool");
    cmd.arg("--x").current_dir("/tmp");
    let c = resolved(cmd, &env);
    assert_eq!(Path::new(c.get_program()), b.join("tool"));
    assert_eq!(c.get_args().collect::<Vec<_>>(), ["--x"]);
    assert_eq!(c.get_current_dir(), Some(Path::new("/tmp")));
    let envs: Vec<_> = c.get_envs().collect();
    assert!(envs.contains(&(std::ffi::OsStr::new("X"), Some(std::ffi::OsStr::new("1")))));
    // A path, or a name found nowhere, is left as it is.
    for prog in ["./tool", "missing"] {
        let c = resolved(std::process::Command::new(prog), &env);
        assert_eq!(c.get_program(), prog);
    }
}

#[test]
fn collected_files_obey_their_cap() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("out.txt");
    std::fs::write(&p, b"0123456789").unwrap();
    let decode = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    for (cap, kept, truncated) in [
        (100, &b"0123456789"[..], false),
        (10, b"0123456789", false),
        (4, b"0123", true),
    ] {
        match collect(p.to_str().unwrap(), cap) {
            Event::Collected {
                data,
                size,
                truncated: t,
                error,
                ..
            } => {
                assert_eq!((decode(&data).as_slice(), size, t), (kept, 10, truncated));
                assert!(error.is_none());
            }
            other => panic!("{other:?}"),
        }
    }
    match collect(d.path().join("none").to_str().unwrap(), 10) {
        Event::Collected { error, size, .. } => {
            assert_eq!((error.as_deref(), size), (Some("not found"), 0));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_regular_files_are_collected_and_a_fifo_does_not_block() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    std::os::unix::fs::symlink(&fifo, d.path().join("to-fifo")).unwrap();
    std::fs::create_dir(d.path().join("dir")).unwrap();
    // A FIFO without a writer blocked the open for ever; /dev/zero read `cap` zeros as a file
    // of size 0, not truncated.
    for p in [
        fifo,
        d.path().join("to-fifo"),
        d.path().join("dir"),
        "/dev/zero".into(),
    ] {
        match collect(p.to_str().unwrap(), 1 << 20) {
            Event::Collected {
                error, data, size, ..
            } => {
                assert!(error.is_some(), "{p:?} was read");
                assert_eq!((data.as_str(), size), ("", 0), "{p:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_cell_starts_only_from_a_container_start_up_message() {
    let cfg = ContainerInit {
        lowerdirs: vec!["/lower/0".into()],
        disk_mb: 8,
        writable_dir: None,
        layer_trees: false,
        hostname: "h".into(),
        masked_paths: vec![],
        readonly_paths: vec![],
        seccomp: false,
        function: None,
        landlock: false,
        best_effort: false,
        apparmor_profile: None,
        sysfs: None,
        devpts: false,
        resolv_conf: None,
        owner_uid: None,
        user_limits: vec![],
        command_groups: 0,
    };
    let init = Init::Container {
        version: PROTOCOL_VERSION,
        config: Box::new(cfg.clone()),
    };
    assert_eq!(
        start_config(Ok(Frame::json(0, Kind::Init, &init))).unwrap(),
        cfg
    );
    for bad in [
        Ok(Frame::json(0, Kind::Init, &Init::Mapped)),
        Ok(Frame::new(0, Kind::Init, &b"{not json"[..])),
        Err(FrameError::Closed),
    ] {
        let e = start_config(bad).unwrap_err();
        assert!(
            e.to_string().starts_with("cell: bad start-up message"),
            "{e}"
        );
    }
}

#[test]
fn a_ready_cell_runs_an_invoke_exits_when_retired_and_refuses_anything_else() {
    let invoke = Call::Invoke {
        spec: InvokeSpec {
            exec: spec(&["true"]),
            ..Default::default()
        },
    };
    match first_call(Ok(Frame::json(9, Kind::Call, &invoke))) {
        FirstCall::Run(9, s) => assert_eq!(s.exec.argv, ["true"]),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        first_call(Err(FrameError::Closed)),
        FirstCall::Retired
    ));
    let kill = Call::Kill { pid: 1, signal: 9 };
    for f in [
        Frame::json(4, Kind::Call, &kill),
        Frame::new(4, Kind::Stdin, &b"early"[..]),
    ] {
        match first_call(Ok(f)) {
            FirstCall::Unexpected(4, e) => {
                assert_eq!(e.code(), ErrorCode::Internal);
                assert!(e.to_string().contains("unexpected first frame"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
