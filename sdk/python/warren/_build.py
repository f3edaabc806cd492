"""Image builds: a Dockerfile and its context sent to the node, the build's log read back."""

from __future__ import annotations

import json as _json
import os
import sys
import tarfile
import tempfile
from typing import Any, AsyncIterator, Callable, Dict, Mapping, Optional

from ._errors import BuildFailed, ConnectionError, error_from_body

_CHUNK = 1 << 20
#: The Dockerfile's name in the context sent, for one given outside the context.
_OUTSIDE = ".warren-build.Dockerfile"


def _pack(context: str, dockerfile: Optional[str]) -> "tuple[Any, Optional[str]]":
    """The context as a tar in a temporary file, and the Dockerfile's name inside it."""
    ctx = os.path.realpath(context)
    if not os.path.isdir(ctx):
        raise ValueError(f"{context}: the build context must be a directory")
    name: Optional[str] = None
    extra: Optional[str] = None
    if dockerfile is not None:
        df = os.path.realpath(dockerfile if os.path.isabs(dockerfile) else os.path.join(ctx, dockerfile))
        if df.startswith(ctx + os.sep):
            name = os.path.relpath(df, ctx)
        else:
            name, extra = _OUTSIDE, df
    f = tempfile.TemporaryFile()
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
        for entry in sorted(os.listdir(ctx)):
            t.add(os.path.join(ctx, entry), arcname=entry, recursive=True)
        if extra is not None:
            t.add(extra, arcname=_OUTSIDE)
    f.seek(0)
    return f, name


async def _chunks(f: Any) -> AsyncIterator[bytes]:
    try:
        while True:
            b = f.read(_CHUNK)
            if not b:
                return
            yield b
    finally:
        f.close()


def print_event(ev: Dict[str, Any]) -> None:
    """Prints one build event as ``warren image build`` does (to stderr)."""
    kind = ev.get("type")
    if kind == "step":
        print(f"Step {ev['step']}/{ev['total']} : {ev['instruction']}", file=sys.stderr)
    elif kind == "cached":
        print(" ---> CACHED", file=sys.stderr)
    elif kind == "output":
        print(ev.get("line", ""), file=sys.stderr)
    elif kind == "result":
        img = ev["image"]
        print(
            f"built {img['reference']} ({ev['steps_run']} steps run, {ev['steps_cached']} cached) in {ev['seconds']:.1f} s",
            file=sys.stderr,
        )


async def build_image(
    http: Any,
    context: str,
    tag: str,
    *,
    dockerfile: Optional[str] = None,
    build_args: Optional[Mapping[str, str]] = None,
    target: Optional[str] = None,
    no_cache: bool = False,
    insecure: bool = False,
    network: Optional[str] = None,
    memory_mb: Optional[int] = None,
    cpus: Optional[float] = None,
    disk_mb: Optional[int] = None,
    step_timeout: Optional[float] = None,
    on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> Dict[str, Any]:
    f, name = _pack(context, dockerfile)
    params: list = [("tag", tag)]
    for k, v in (
        ("dockerfile", name),
        ("target", target),
        ("network", network),
        ("memory_mb", memory_mb),
        ("cpus", cpus),
        ("disk_mb", disk_mb),
        ("step_timeout_secs", step_timeout),
    ):
        if v is not None:
            params.append((k, str(v)))
    if no_cache:
        params.append(("no_cache", "true"))
    if insecure:
        params.append(("insecure", "true"))
    for k, v in (build_args or {}).items():
        params.append(("build_arg", f"{k}={v}"))
    resp = await http.stream(
        "POST",
        "/v1/images/build",
        params=params,
        content=_chunks(f),
        timeout=http.call_timeout(None),
    )
    try:
        async for line in resp.aiter_lines():
            if not line:
                continue
            ev = _json.loads(line)
            if on_event is not None:
                on_event(ev)
            if ev.get("type") == "result":
                return dict(ev["image"])
            if ev.get("type") == "error":
                err = error_from_body(None, {"error": {"code": ev.get("code"), "message": ev.get("message", "")}})
                if isinstance(err, BuildFailed):
                    err.step = ev.get("step")
                    err.instruction = ev.get("instruction")
                    err.exit_code = ev.get("exit_code")
                    err.output_tail = list(ev.get("output_tail") or [])
                raise err
    finally:
        await resp.aclose()
    raise ConnectionError("the build log ended without a result")
