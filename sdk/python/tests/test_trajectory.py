"""Trajectory steps, replay after a crash, pause/resume and fork, against the session's node."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import SMALL

import warren

COUNT = "/tmp/side-effects"


def count(sb: warren.Sandbox) -> int:
    return int(sb.exec(f"cat {COUNT} 2>/dev/null | wc -l").stdout.strip())


def test_a_step_runs_once_and_replays(sb: warren.Sandbox) -> None:
    first = sb.exec(f"echo x >> {COUNT}; echo hi", step=0)
    assert not first.replayed and first.stdout == "hi\n"
    again = sb.exec(f"echo x >> {COUNT}; echo hi", step=0)
    assert again.replayed and again.stdout == "hi\n"
    assert count(sb) == 1
    with pytest.raises(warren.StepConflict) as e:
        sb.exec("echo other", step=0)
    assert e.value.code == "step_conflict" and e.value.status == 409
    assert isinstance(e.value, warren.Conflict)
    sb.files.write("/tmp/f", "abc", step=1)
    sb.files.write("/tmp/f", "abc", step=1)
    with pytest.raises(warren.StepConflict):
        sb.files.write("/tmp/f", "abd", step=1)
    assert sb.files.read("/tmp/f") == b"abc"


def test_the_trajectory_says_what_ran(sb: warren.Sandbox) -> None:
    sb.exec("echo one", step=3)
    sb.files.mkdir("/tmp/d", parents=True, step=4)
    sb.files.write("/tmp/d/f", b"\x00\x01", mode=0o600, step=5)
    sb.files.chmod("/tmp/d/f", 0o644, step=6)
    sb.files.remove("/tmp/d", recursive=True, step=7)
    sb.exec("echo no step")
    log = sb.trajectory()
    assert [e["kind"] for e in log] == ["exec", "mkdir", "write_file", "chmod", "remove", "exec"]
    assert [e["step"] for e in log] == [3, 4, 5, 6, 7, None]
    assert [e["seq"] for e in log] == list(range(1, 7))
    assert log[0]["result"]["stdout"] == "one\n"
    assert log[2]["request"]["size"] == 2
    assert len(sb.trajectory(from_seq=5)) == 2


def test_a_session_replays_after_a_crash(sb: warren.Sandbox, url: str) -> None:
    # A rollout in another process dies half-way; a new process re-issues the same steps.
    script = textwrap.dedent(
        f"""
        import os, sys, warren
        crash_at = int(sys.argv[1])
        with warren.Client({url!r}) as c:
            sb = c.get({sb.id!r})
            traj = sb.trajectory_session(start=100)
            replayed = 0
            for i in range(6):
                if i == crash_at:
                    os._exit(3)
                r = traj.exec("echo x >> {COUNT}; echo " + str(i))
                replayed += r.replayed
                assert r.stdout == str(i) + "\\n", r
            traj.write("/tmp/done", "yes")
            print(replayed)
        """
    )
    crashed = subprocess.run([sys.executable, "-c", script, "4"], capture_output=True, text=True)
    assert crashed.returncode == 3, crashed.stderr
    assert count(sb) == 4
    redo = subprocess.run([sys.executable, "-c", script, "-1"], capture_output=True, text=True)
    assert redo.returncode == 0, redo.stderr
    assert redo.stdout.strip() == "4"
    assert count(sb) == 6
    assert sb.files.read("/tmp/done") == b"yes"


async def test_async_session_and_sync_agree(asb: warren.AsyncSandbox) -> None:
    traj = asb.trajectory_session()
    r = await traj.exec("echo a")
    assert traj.step == 1 and not r.replayed
    await traj.mkdir("/tmp/x")
    traj2 = asb.trajectory_session()
    assert (await traj2.exec("echo a")).replayed
    await traj2.mkdir("/tmp/x")
    assert traj2.step == 2
    assert [e["step"] for e in await asb.trajectory()] == [0, 1]


def test_pause_resume_and_calls_on_a_paused_sandbox(sb: warren.Sandbox) -> None:
    sb.exec("echo data > /root/keep")
    stats = sb.pause()
    assert stats is not None and "memory_after_bytes" in stats
    assert sb.info.state == "paused"
    # Any call resumes it.
    assert sb.exec("cat /root/keep").stdout == "data\n"
    assert sb.refresh().state == "running"
    sb.pause()
    sb.resume()
    assert sb.refresh().state == "running"


def test_fork_children_start_from_the_parent(client: warren.Client) -> None:
    tag = os.urandom(4).hex()
    with client.create(memory=SMALL, labels={"fork": tag}) as parent:
        parent.exec("echo 1", step=0)
        kids = parent.fork(2, labels={"child": "yes"})
        try:
            assert len(kids) == 2 and len({k.id for k in kids}) == 2
            for k in kids:
                assert k.info.labels == {"fork": tag, "child": "yes"}
                first = k.trajectory()[0]
                assert first["kind"] == "forked_from"
                assert first["request"] == {"parent": parent.id, "parent_seq": 1}
        finally:
            for k in kids:
                k.delete()


def test_a_fork_naming_a_step_runs_once(sb: warren.Sandbox) -> None:
    sb.exec("echo parent", step=10)
    first = sb.fork(2, step=11)
    try:
        assert len(first) == 2
        again = sb.fork(2, step=11)
        assert sorted(c.id for c in again) == sorted(c.id for c in first), "the same children"
        with pytest.raises(warren.StepConflict):
            sb.fork(1, step=11)
        with pytest.raises(warren.StepConflict):
            sb.fork(2, step=9)
        entry = [e for e in sb.trajectory() if e["kind"] == "fork"][-1]
        assert entry["step"] == 11
    finally:
        for c in first:
            c.delete()


def test_revive_replays_the_files_and_continues_the_steps(client: warren.Client) -> None:
    with client.create(memory=SMALL) as old:
        old.exec("mkdir -p /work && echo one > /work/a", step=1)
        old.files.write("/work/b", b"\x00\x01two", mode=0o600, step=2)
        old.files.chmod("/work/a", 0o640, step=3)
        old.exec("date +%s%N | tee /work/now", step=4)
        want = old.exec("sha256sum /work/a /work/b && stat -c '%a %n' /work/a /work/b").stdout
        report = client.revive(old.id)
        new = report.sandbox
        try:
            assert isinstance(new, warren.Sandbox) and new.id != old.id
            assert report.revived_from == old.id
            # The four steps and the listing (an exec without a step).
            assert (report.replayed, report.steps_replayed, report.last_step) == (5, 4, 4)
            assert report.divergences == 1 and not report.stopped
            first = report.first_divergence
            assert first is not None and (first.step, first.kind) == (4, "exec")
            assert first.expected["stdout_sha256"] != first.got["stdout_sha256"]
            assert new.exec("sha256sum /work/a /work/b && stat -c '%a %n' /work/a /work/b").stdout == want
            # Steps go on: an old step answers from the log, the next one runs.
            assert new.exec("mkdir -p /work && echo one > /work/a", step=1).replayed
            with pytest.raises(warren.StepConflict):
                new.exec("echo other", step=3)
            assert not new.exec("echo next", step=5).replayed
        finally:
            new.delete()
        stopped = client.revive(old.id, stop_on_divergence=True)
        try:
            assert stopped.stopped and stopped.replayed == 4 and stopped.last_step == 4
        finally:
            stopped.sandbox.delete()
    with pytest.raises(warren.NotFound):
        client.revive(old.id)
