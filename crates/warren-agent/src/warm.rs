//! What a warm Python is made of, for the cell that starts one and the zygote that forks
//! one: the bootstrap's functions, the preload's imports, the program lookup, and the wait
//! for the interpreter's "warm" byte.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};
use warren_proto::FunctionInit;

/// The bootstrap's functions, shared with the zygote (`crate::zygote`): `_warren_main` reads
/// one call's header and runs it (and, given a descriptor to report on, writes `X` and the
/// program's exit code there before it exits, in the call's own process only, not in a
/// child the program forked); `_warren_fields` splits the header.
pub const PY_DEFS: &str = r#"
def _warren_main(os, sys, fields, report=None):
    me = os.getpid()
    if report is not None:
        # The descriptor is checked again at the end: a program may have closed it and
        # opened something else there.
        try:
            st = os.fstat(report)
            ino = (st.st_dev, st.st_ino)
        except OSError:
            report = None
    n = b""
    while not n.endswith(b"\n"):
        c = os.read(0, 1)
        if not c:
            os._exit(0)
        n += c
    want = int(n)
    raw = b""
    while len(raw) < want:
        c = os.read(0, want - len(raw))
        if not c:
            os._exit(0)
        raw += c
    f = fields(raw)
    kind, body, cwd, argc = f[0], f[1], f[2], int(f[3])
    os.chdir(cwd)
    env = f[4 + argc:]
    env = [(env[i], env[i + 1]) for i in range(0, len(env) - 1, 2)]
    # Usually the environment the interpreter already has (a zygote's fork, the same
    # image): then nothing is set or unset.
    if list(os.environ.items()) != env:
        for k in list(os.environ):
            del os.environ[k]
        for k, v in env:
            os.environ[k] = v
    sys.argv = f[4:4 + argc]
    g = sys.modules["__main__"].__dict__
    for k in [k for k in g if k not in ("__name__", "__builtins__", "__loader__", "__spec__")]:
        del g[k]
    g.update(__doc__=None, __package__=None, __annotations__={})
    rc = 0
    try:
        if kind == "code":
            exec(compile(body, "<string>", "exec"), g)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(body))
            with open(body, "rb") as src:
                code = compile(src.read(), body, "exec")
            g.update(__file__=body, __cached__=None)
            exec(code, g)
    except SystemExit as e:
        c = e.code
        if c is None:
            rc = 0
        elif isinstance(c, int):
            rc = c
        else:
            print(c, file=sys.stderr)
            rc = 1
    except BaseException as e:
        import traceback
        # From the program's own frames on, as the interpreter prints it.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        rc = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    # Only the call's own process reports: a child the program forked ends here too.
    if report is not None and os.getpid() == me:
        try:
            st = os.fstat(report)
            if (st.st_dev, st.st_ino) == ino:
                os.write(report, bytes((88, rc & 0xFF)))
        except BaseException:
            pass
    os._exit(rc & 0xFF)
def _warren_fields(b):
    i, out = 0, []
    while i < len(b):
        j = b.index(b"\n", i)
        n = int(b[i:j])
        out.append(b[j + 1:j + 1 + n].decode())
        i = j + 1 + n
    return out
"#;

/// The `import` lines of a pool's preload (module names only).
pub fn preload_imports(f: &FunctionInit) -> String {
    f.preload
        .iter()
        .filter(|m| {
            !m.is_empty()
                && m.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        })
        .map(|m| format!("import {m}\n"))
        .collect()
}

/// Longest a warm interpreter may take to import its modules; after that the cell goes on
/// without it (its calls start cold). Below the agent's 20 s limit for a cell to start.
const WARM_UP_TIMEOUT_MS: u16 = 15_000;

/// Waits for the "warm" byte on `out` (an interpreter's stdout), at most
/// [`WARM_UP_TIMEOUT_MS`].
pub fn warm_byte(out: &mut (impl Read + std::os::fd::AsFd)) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = Instant::now() + Duration::from_millis(WARM_UP_TIMEOUT_MS.into());
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_millis();
        if left == 0 {
            return false;
        }
        let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::from(left.min(u16::MAX as u128) as u16),
        ) {
            Ok(0) => return false,
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
    let mut b = [0u8; 1];
    matches!(out.read(&mut b), Ok(1) if b[0] == b'R')
}

/// `cmd` with its program looked up in the command's own `PATH` (so that the standard
/// library can use `posix_spawn`); unchanged when the program is a path or not found.
pub fn resolved(cmd: std::process::Command, env: &[(String, String)]) -> std::process::Command {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let prog = cmd.get_program().to_string_lossy().to_string();
    if prog.contains('/') {
        return cmd;
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let Some(full) = path.split(':').map(|d| Path::new(d).join(&prog)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }) else {
        return cmd;
    };
    let mut c = std::process::Command::new(full);
    c.arg0(&prog).args(cmd.get_args()).env_clear();
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}
