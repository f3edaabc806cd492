"""``client.call``: one-shot stateless calls through warm pools, async and sync."""

from __future__ import annotations

import base64

import pytest
from conftest import SMALL

import warren
from warren._function import call_body


def test_call_body_and_result_parse() -> None:
    body = call_body(
        "default",
        ["python3", "-c", "print(1)"],
        files={"/w/a.txt": "hi", "/w/b.bin": b"\x00\xff"},
        stdin=b"in",
        timeout=2,
        limits={"memory": "128M", "cpus": 0.5},
        env={"A": "1"},
        cwd="/w",
        return_files=["/w/out"],
        interpreter="python3",
        preload=["json"],
        max_output=100,
        parse_mib=warren.parse_mib,
    )
    assert body["argv"] == ["python3", "-c", "print(1)"]
    assert body["files"][1] == {"path": "/w/b.bin", "content": "AP8=", "encoding": "base64"}
    assert (body["memory_mb"], body["cpus"], body["stdin"], body["timeout_secs"]) == (128, 0.5, "in", 2.0)
    assert call_body("default", "echo hi", files=None, stdin=None, timeout=None, limits=None, env=None,
                     cwd=None, return_files=None, interpreter=None, preload=None, max_output=None,
                     parse_mib=warren.parse_mib)["shell"] == "echo hi"
    with pytest.raises(ValueError):
        call_body("default", "x", files=None, stdin=None, timeout=None, limits={"gpus": 1}, env=None,
                  cwd=None, return_files=None, interpreter=None, preload=None, max_output=None,
                  parse_mib=warren.parse_mib)
    r = warren.CallResult.from_json(
        {
            "exit_code": 0,
            "signal": None,
            "stdout": base64.b64encode(b"hi\n").decode(),
            "stderr": "",
            "encoding": "base64",
            "files": [
                {"path": "/a", "content": base64.b64encode(b"\x01").decode(), "encoding": "base64", "size": 1, "truncated": False},
                {"path": "/b", "content": "", "encoding": "base64", "size": 0, "truncated": False, "error": "not found"},
            ],
            "duration_ms": 3.0,
            "queued_ms": 0.5,
        }
    )
    assert r.ok and r.stdout == "hi\n" and r.files == {"/a": b"\x01"} and r.file_errors == {"/b": "not found"}
    assert r.duration == 0.003


async def test_async_call(aclient: warren.AsyncClient) -> None:
    r = await aclient.call(
        "default",
        "cat /w/in; echo -n x > /w/out; cat; echo $A; exit 3",
        files={"/w/in": "file\n"},
        stdin="stdin\n",
        env={"A": "env"},
        return_files=["/w/out", "/w/none"],
        limits={"memory": SMALL},
    )
    assert (r.exit_code, r.stdout) == (3, "file\nstdin\nenv\n")
    assert r.files == {"/w/out": b"x"} and r.file_errors == {"/w/none": "not found"}
    # The next call starts from the image again.
    r = await aclient.call("default", ["sh", "-c", "ls /w 2>&1 || true"], limits={"memory": SMALL})
    assert "in" not in r.stdout.split()
    with pytest.raises(warren.CommandError):
        await aclient.call("default", "exit 1", check=True, limits={"memory": SMALL})
    r = await aclient.call("default", "sleep 30", timeout=0.3, limits={"memory": SMALL})
    assert r.timed_out
    with pytest.raises(warren.NotFound):
        await aclient.call("no-such-image", "true")


def test_sync_call_with_a_warm_interpreter(client: warren.Client) -> None:
    for _ in range(3):
        r = client.call(
            "default",
            ["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", "a"],
            interpreter="python3",
            preload=["json"],
            limits={"memory": SMALL},
        )
        assert r.ok and r.stdout == '["a"]\n', r
