"""``POST /run_code``: SandboxFusion's protocol, against the real ``sandbox-fusion`` client and
the exact JSON veRL's reward code posts, on a live node."""

from __future__ import annotations

import base64
import json
import os

import httpx
import pytest
from conftest import Node, need

# The body veRL's reward path (`verl/utils/reward_score/sandbox_fusion/utils.py`) posts.
VERL_BODY = {
    "compile_timeout": 10,
    "run_timeout": 10,
    "code": "a, b = map(int, input().split())\nprint(a + b)",
    "stdin": "3 4",
    "memory_limit_MB": 1024,
    "language": "python",
    "files": {},
    "fetch_files": [],
}


def post(node: Node, body: object) -> httpx.Response:
    return httpx.post(f"{node.http_url}/run_code", json=body, timeout=60)


def run(node: Node, **body: object) -> dict:
    r = post(node, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_clients_run_code(node: Node) -> None:
    sf = need("sandbox_fusion")
    req = sf.RunCodeRequest(code="import sys\nprint(sys.stdin.read().upper())", language="python", stdin="hi")
    r = sf.run_code(req, endpoint=node.http_url, max_attempts=1)
    assert r.status == sf.RunStatus.Success, r
    assert r.run_result.status == sf.CommandRunStatus.Finished
    assert r.run_result.stdout == "HI\n" and r.run_result.return_code == 0
    assert r.run_result.execution_time is not None and r.run_result.execution_time >= 0
    assert r.executor_pod_name == node.name
    # The client's summary reads the answer as a pass.
    assert sf.summary_run_code_result(r, sf.SummaryMapping()) == "Success"
    bash = sf.run_code(sf.RunCodeRequest(code="echo $((6*7)); exit 3", language="bash"), endpoint=node.http_url)
    assert (bash.status, bash.run_result.return_code, bash.run_result.stdout) == (sf.RunStatus.Failed, 3, "42\n")


def test_verls_exact_body(node: Node) -> None:
    r = httpx.post(
        f"{node.http_url}/run_code",
        content=json.dumps(VERL_BODY),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["status"] == "Success", v
    assert v["compile_result"] is None
    assert v["run_result"]["status"] == "Finished"
    assert v["run_result"]["stdout"].rstrip("\n") == "7"
    assert set(v) >= {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}


def test_timeout_memory_and_syntax_errors_as_the_protocol_reports_them(node: Node) -> None:
    tle = run(node, code="while True: pass", language="python", run_timeout=1)
    assert tle["status"] == "Failed", tle
    assert tle["run_result"]["status"] == "TimeLimitExceeded"
    assert tle["run_result"]["return_code"] is None

    big = run(
        node,
        code="x = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('survived')",
        language="python",
        memory_limit_MB=64,
    )
    assert big["status"] == "Failed", big
    assert big["run_result"]["status"] == "Finished"
    assert big["run_result"]["return_code"] not in (0, None), big
    assert "survived" not in big["run_result"]["stdout"]

    syntax = run(node, code="def f(:\n  pass", language="python")
    assert syntax["status"] == "Failed"
    assert syntax["run_result"]["return_code"] == 1
    assert "SyntaxError" in syntax["run_result"]["stderr"]


def test_files_in_and_out_and_nothing_left_for_the_next_call(node: Node) -> None:
    data = base64.b64encode(b"\x00\x01payload").decode()
    r = run(
        node,
        code=(
            "import os\n"
            "d = open('in/data.bin', 'rb').read()\n"
            "open('out.txt', 'w').write(str(len(d)))\n"
            "open('/tmp/left-behind', 'w').write('x')\n"
            "print(os.getcwd())"
        ),
        language="python",
        files={"in/data.bin": data, "skipped": None},
        fetch_files=["out.txt", "missing.txt"],
    )
    assert r["status"] == "Success", r
    assert base64.b64decode(r["files"]["out.txt"]) == b"9"
    assert "missing.txt" not in r["files"]
    after = run(node, code="import os\nprint(os.path.exists('/tmp/left-behind'))", language="python")
    assert after["run_result"]["stdout"] == "False\n"


def test_fetch_files_that_are_not_regular_files_are_left_out(node: Node) -> None:
    # A FIFO blocked the read-back for ever (nothing is left to write it): the request never
    # answered. A device is not read either (/dev/zero came back as the cap's worth of zeros).
    r = run(
        node,
        code="import os\nos.mkfifo('pipe')\nos.symlink('pipe', 'link')\nopen('ok.txt', 'w').write('ok')",
        language="python",
        fetch_files=["pipe", "link", "/dev/zero", "ok.txt"],
    )
    assert r["status"] == "Success", r
    assert set(r["files"]) == {"ok.txt"}, r
    assert base64.b64decode(r["files"]["ok.txt"]) == b"ok"
    assert run(node, code="print(1)", language="python")["run_result"]["stdout"] == "1\n"


def test_languages_the_image_cannot_run_are_sandbox_errors(node: Node) -> None:
    # The default image has no C++ compiler: the protocol's server-side error, naming it.
    r = run(node, code="int main() { return 0; }", language="cpp")
    assert r["status"] == "SandboxError", r
    assert "g++" in r["message"]
    r = run(node, code="x", language="lean")
    assert r["status"] == "SandboxError"


def test_refusals_in_the_protocols_shape(node: Node) -> None:
    r = post(node, {"code": "print(1)", "language": "cobol"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "language"]
    r = post(node, {"language": "python"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"
    r = post(node, {"code": "x", "language": "python", "image": "no-such-image"})
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "not_found" and r.json()["detail"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs the live node")
def test_compiled_languages_run_when_the_image_has_the_tools(node: Node) -> None:
    # A driver language whose tool the default image has: perl (Debian's base system).
    r = run(node, code='my $x = <STDIN>; print $x * 2, "\\n";', language="perl", stdin="21")
    assert r["status"] == "Success", r
    assert r["run_result"]["stdout"] == "42\n"
    slow = run(node, code="sleep 5;", language="perl", run_timeout=0.5)
    assert slow["run_result"]["status"] == "TimeLimitExceeded", slow


def test_the_clients_run_jupyter(node: Node) -> None:
    sf = need("sandbox_fusion")
    cells = [
        "a = 6 * 7",
        "a",
        "print(a); import os; _ = os.system('echo from-a-subprocess')",
        "import sys; print('warn', file=sys.stderr)",
        "raise ValueError('boom')",
        "open('out.txt', 'w').write(open('in.txt').read().upper())",
    ]
    files = {"in.txt": base64.b64encode(b"hi").decode()}
    r = sf.run_jupyter(
        sf.RunJupyterRequest(cells=cells, files=files, fetch_files=["out.txt"]),
        endpoint=node.http_url,
        max_attempts=1,
    )
    assert r.status == sf.RunStatus.Success, r
    assert r.executor_pod_name == node.name
    assert r.driver is not None and r.driver.status == sf.CommandRunStatus.Finished
    assert len(r.cells) == len(cells)
    assert r.cells[1].display == [{"text/plain": "42"}]
    assert r.cells[2].stdout == "42\nfrom-a-subprocess\n", r.cells[2]
    assert r.cells[3].stderr == "warn\n"
    err = r.cells[4].error[0]
    assert (err["ename"], err["evalue"]) == ("ValueError", "boom")
    assert "boom" in "".join(err["traceback"])
    # The cell after an error still ran, in the same namespace and working directory.
    assert r.cells[5].error == [] and base64.b64decode(r.files["out.txt"]) == b"HI"

    # A cell over its timeout ends the run: Failed, with the cells that ended.
    body = {"cells": ["x = 1", "while True: pass", "print('never')"], "cell_timeout": 1}
    v = httpx.post(f"{node.http_url}/run_jupyter", json=body, timeout=60).json()
    assert v["status"] == "Failed", v
    assert v["driver"]["status"] == "TimeLimitExceeded"
    assert len(v["cells"]) == 2 and v["cells"][1]["error"][0]["ename"] == "TimeoutError"
    # Nothing of one request reaches the next; a wrong kernel is refused in the protocol's shape.
    again = sf.run_jupyter(sf.RunJupyterRequest(cells=["'a' in dir()"]), endpoint=node.http_url)
    assert again.cells[0].display == [{"text/plain": "False"}]
    bad = httpx.post(f"{node.http_url}/run_jupyter", json={"cells": [], "kernel": "ruby"}, timeout=30)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "kernel", bad.text
