#!/usr/bin/env python3
"""Per-step overhead of mini-swe-agent's Warren environment vs its own docker environment
(run with podman) on the same task, same machine, same run.

Both environments run the same steps of a small SWE-style episode (read a file, edit it, run
a test) through mini-swe-agent's ``execute`` — the call its agent loop makes per step —
alternating step by step so drift hits both alike. Prints p50/p90 per environment and the
Warren environment's p50 as a fraction of the podman one (target <= 0.1).

The podman side needs an image: ``--podman-image`` (present in podman's store), or
``--rootfs DIR`` (default: the default image's rootfs, $WARREN_CACHE/rootfs-default),
imported once as ``warren-bench-rootfs``. podman runs with ``--runtime runc`` and explicit
ulimits (see MACHINE.md); ``--podman`` names the executable.

    python bench/msa_overhead.py --steps 60

``warren bench msa`` runs this script (``--json``: one JSON document with each environment's
per-step times in milliseconds) and checks the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

STEPS = [
    "cat /repo/calc.py",
    "sed -i 's/a - b/a + b/' /repo/calc.py && sed -i 's/a + b/a - b/' /repo/calc.py",
    "cd /repo && python3 -c 'import calc; print(calc.add(2, 3))'",
    "ls -la /repo",
]
SETUP = "mkdir -p /repo && printf 'def add(a, b):\\n    return a - b\\n' > /repo/calc.py"
PODMAN_IMAGE = "localhost/warren-bench-rootfs:latest"


def podman_image(podman: str, image: str, rootfs: str) -> str:
    if image:
        return image
    have = subprocess.run([podman, "image", "exists", PODMAN_IMAGE])
    if have.returncode != 0:
        if not os.path.isdir(os.path.join(rootfs, "usr", "bin")):
            raise SystemExit(f"{rootfs} is not a root file system: give --rootfs or --podman-image")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [
                podman,
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "-",
                PODMAN_IMAGE,
            ],
            stdin=tar.stdout,
            check=True,
            capture_output=True,
        )
        tar.wait()
    return PODMAN_IMAGE


def pct(v: List[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("WARREN_URL"))
    p.add_argument("--steps", type=int, default=60, help="steps per environment")
    p.add_argument("--podman", default="podman")
    p.add_argument("--podman-image", default="")
    p.add_argument(
        "--rootfs", default=os.path.join(os.environ.get("WARREN_CACHE", "/var/cache/warren"), "rootfs-default")
    )
    p.add_argument("--json", action="store_true", help="print one JSON document: per-step ms of each environment")
    a = p.parse_args()

    from minisweagent.environments.docker import DockerEnvironment

    from warren.integrations.minisweagent import WarrenEnvironment

    image = podman_image(a.podman, a.podman_image, a.rootfs)
    envs: Dict[str, object] = {}
    # Each environment is cleaned up even when the next one fails to start.
    envs["warren"] = WarrenEnvironment(url=a.url, cwd="/", interpreter=["bash", "-c"])
    try:
        envs["podman"] = DockerEnvironment(
            image=image,
            cwd="/",
            executable=a.podman,
            interpreter=["bash", "-c"],
            run_args=[
                "--rm",
                "--runtime",
                "runc",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ],
        )
    except BaseException:
        envs["warren"].cleanup()  # type: ignore[attr-defined]
        raise
    times: Dict[str, List[float]] = {k: [] for k in envs}
    try:
        for env in envs.values():
            r = env.execute({"command": SETUP})  # type: ignore[attr-defined]
            assert r["returncode"] == 0, r
        for i in range(a.steps):
            cmd = STEPS[i % len(STEPS)]
            for name, env in envs.items():
                t = time.perf_counter()
                r = env.execute({"command": cmd})  # type: ignore[attr-defined]
                times[name].append((time.perf_counter() - t) * 1000)
                assert r["returncode"] == 0, (name, cmd, r)
    finally:
        for env in envs.values():
            env.cleanup()  # type: ignore[attr-defined]
    if a.json:
        print(json.dumps({"steps": a.steps, "podman": a.podman, "ms": times}))
        return 0
    for name, v in times.items():
        print(
            f"{name:7s} execute p50 {pct(v, 0.5):8.2f} ms  p90 {pct(v, 0.9):8.2f} ms  "
            f"mean {statistics.fmean(v):8.2f} ms"
        )
    ratio = pct(times["warren"], 0.5) / pct(times["podman"], 0.5)
    print(f"warren / podman per-step p50: {ratio:.3f}x (target <= 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
