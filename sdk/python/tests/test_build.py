"""Image builds through the SDK against the session's node: the log streamed as it happens,
the built image's configuration in its sandboxes, a failing RUN raised as BuildFailed with
nothing tagged, and the sync client."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Dict, List

import pytest

import warren

DOCKERFILE = """\
FROM default
ARG WHO=nobody
ENV GREETING="hello ${WHO}"
WORKDIR /srv/task
COPY *.txt ./
RUN echo "step output: $GREETING" && cat a.txt > joined && cat b.txt >> joined
USER nobody
CMD ["cat", "joined"]
"""


def _context(tmp: Path, dockerfile: str) -> str:
    (tmp / "Dockerfile").write_text(dockerfile)
    (tmp / "a.txt").write_text("a\n")
    (tmp / "b.txt").write_text("b\n")
    (tmp / "skip.log").write_text("not copied\n")
    return str(tmp)


def _tag(what: str) -> str:
    return f"py-{what}-{secrets.token_hex(3)}:1"


async def test_build_streams_its_log_and_the_image_runs(aclient: warren.AsyncClient, tmp_path: Path) -> None:
    tag = _tag("built")
    events: List[Dict[str, Any]] = []
    image = await aclient.build_image(
        _context(tmp_path, DOCKERFILE), tag, build_args={"WHO": "sdk"}, on_event=events.append
    )
    try:
        assert image["reference"] == tag and len(image["layers"]) >= 2
        kinds = [e["type"] for e in events]
        assert kinds[-1] == "result" and kinds[0] == "step"
        steps = [e for e in events if e["type"] == "step"]
        assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
        assert any(s["instruction"].startswith("RUN echo") for s in steps)
        # The RUN's output came between its step and the result.
        out = [e.get("line", "") for e in events if e["type"] == "output"]
        assert "step output: hello sdk" in out, events
        result = events[-1]
        assert result["steps_run"] >= 3 and result["steps_cached"] == 0

        info = await aclient.image(tag)
        assert info["config"]["user"] == "nobody" and info["config"]["working_dir"] == "/srv/task"
        async with await aclient.create(tag) as sb:
            r = await sb.exec("echo $GREETING; pwd; id -un; cat joined; ls")
            assert r.stdout == "hello sdk\n/srv/task\nnobody\na\nb\na.txt\nb.txt\njoined\n", r

        # Again: every step from the cache.
        events.clear()
        await aclient.build_image(str(tmp_path), tag, build_args={"WHO": "sdk"}, on_event=events.append)
        assert events[-1]["steps_run"] == 0 and any(e["type"] == "cached" for e in events)
    finally:
        await aclient.delete_image(tag)


async def test_failing_run_raises_build_failed(aclient: warren.AsyncClient, tmp_path: Path) -> None:
    tag = _tag("fails")
    ctx = _context(tmp_path, "FROM default\nRUN echo first\nRUN echo last words; echo oops >&2; exit 7\n")
    with pytest.raises(warren.BuildFailed) as e:
        await aclient.build_image(ctx, tag)
    err = e.value
    assert err.step == 3 and err.exit_code == 7, vars(err)
    assert err.instruction is not None and err.instruction.startswith("RUN echo last words")
    assert "oops" in err.output_tail and "last words" in err.output_tail, err.output_tail
    with pytest.raises(warren.NotFound):
        await aclient.image(tag)
    # No step's sandbox is left.
    assert [s for s in await aclient.list() if s.labels.get("warren.build")] == []


def test_sync_build(client: warren.Client, tmp_path: Path) -> None:
    tag = _tag("sync")
    ctx = _context(tmp_path, "FROM default\nENV X=1\nCOPY a.txt /a.txt\n")
    image = client.build_image(ctx, tag, no_cache=True, network="none")
    try:
        assert image["reference"] == tag
        assert "X=1" in client.image(tag)["config"]["env"]
    finally:
        client.delete_image(tag)
