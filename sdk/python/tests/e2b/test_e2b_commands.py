"""E2B's SDK runs commands in a Warren sandbox: envd's process service (warren-envd) over the
node's attached exec. Output, exit codes and the SDK's exceptions, env, cwd, user, timeout,
callbacks, background commands (wait, kill, list, reconnect) and stdin."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("e2b")

from e2b import CommandExitException, TimeoutException  # noqa: E402


def test_run_captures_stdout_stderr_and_exit(e2b_sandbox):
    r = e2b_sandbox.commands.run("echo out; echo err >&2")
    assert r.exit_code == 0
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    assert r.error is None


def test_output_larger_than_warrens_default_cap_comes_whole(e2b_sandbox):
    # envd streams all of it; Warren's exec keeps 1 MiB per stream unless asked for more.
    r = e2b_sandbox.commands.run("head -c 3000000 /dev/zero | tr '\\0' a; echo; head -c 1500000 /dev/zero >&2")
    assert len(r.stdout) == 3_000_001 and set(r.stdout[:-1]) == {"a"}
    assert len(r.stderr) == 1_500_000


def test_non_zero_exit_raises_the_sdks_exception(e2b_sandbox):
    with pytest.raises(CommandExitException) as e:
        e2b_sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "bad\n"


def test_env_and_cwd_are_the_commands(e2b_sandbox):
    r = e2b_sandbox.commands.run('echo "$GREETING"; pwd', envs={"GREETING": "hi there"}, cwd="/tmp")
    assert r.stdout == "hi there\n/tmp\n"


def test_user_root_and_a_user_the_image_lacks(e2b_sandbox):
    assert e2b_sandbox.commands.run("id -u", user="root").stdout == "0\n"
    has_user = e2b_sandbox.commands.run("grep -c '^user:' /etc/passwd || true", user="root").stdout.strip() != "0"
    # E2B's default user `user` runs as itself where the image has it, as root where not.
    uid = e2b_sandbox.commands.run("id -u", user="user").stdout.strip()
    assert (uid != "0") == has_user


def test_timeout_raises_the_sdks_timeout(e2b_sandbox):
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        e2b_sandbox.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - start < 25


def test_on_stdout_and_on_stderr_see_the_output_as_it_comes(e2b_sandbox):
    out, err = [], []
    r = e2b_sandbox.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo oops >&2",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == r.stdout == "line1\nline2\nline3\n"
    assert "".join(err) == "oops\n"
    assert len(out) >= 2  # streamed, not one chunk at the end


def test_background_wait_list_and_kill(e2b_sandbox):
    quick = e2b_sandbox.commands.run("sleep 0.2; echo done", background=True)
    assert quick.wait().stdout == "done\n"

    slow = e2b_sandbox.commands.run("sleep 60", background=True)
    pids = [p.pid for p in e2b_sandbox.commands.list()]
    assert slow.pid in pids
    listed = next(p for p in e2b_sandbox.commands.list() if p.pid == slow.pid)
    assert listed.args[-1] == "sleep 60"
    assert slow.kill() is True
    with pytest.raises(CommandExitException) as e:
        slow.wait()
    assert e.value.exit_code == -1
    assert slow.pid not in [p.pid for p in e2b_sandbox.commands.list()]
    # Killing what is gone answers False (envd's not_found).
    assert e2b_sandbox.commands.kill(slow.pid) is False


def test_reconnect_to_a_running_command(e2b_sandbox):
    h = e2b_sandbox.commands.run("sleep 1; echo after", background=True)
    h.disconnect()
    again = e2b_sandbox.commands.connect(h.pid)
    assert again.pid == h.pid
    assert again.wait().stdout == "after\n"


def test_stdin_send_close_and_stream(e2b_sandbox):
    h = e2b_sandbox.commands.run("cat", background=True, stdin=True)
    e2b_sandbox.commands.send_stdin(h.pid, "hello\n")
    e2b_sandbox.commands.send_stdin(h.pid, b"\x00bytes\n")
    e2b_sandbox.commands.stream_input(h.pid, ["one ", b"two\n"])
    e2b_sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello\n\x00bytes\none two\n"


def test_stdin_of_a_command_started_without_it_is_refused(e2b_sandbox):
    from e2b import SandboxException

    h = e2b_sandbox.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(SandboxException):
            e2b_sandbox.commands.send_stdin(h.pid, "x")
    finally:
        h.kill()


def test_pause_and_resume_keep_files_and_a_running_command(e2b_sandbox, opts):
    from e2b import Sandbox

    e2b_sandbox.files.write("/tmp/kept.txt", "kept")
    h = e2b_sandbox.commands.run('read line; echo "got $line"; cat /tmp/kept.txt', background=True, stdin=True)
    assert e2b_sandbox.pause() is True
    again = Sandbox.connect(e2b_sandbox.sandbox_id, **opts)
    assert again.get_info().state == "running"
    # The command started before the pause is still there, waiting for its input.
    assert h.pid in [p.pid for p in again.commands.list()]
    again.commands.send_stdin(h.pid, "after\n")
    assert h.wait().stdout == "got after\nkept"
    assert again.files.read("/tmp/kept.txt") == "kept"
