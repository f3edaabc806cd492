#!/usr/bin/env python3
"""One asyncio process drives many sandboxes at once, each running ``exec`` in a loop.

Creates ``--sandboxes`` sandboxes concurrently from one AsyncClient, has each run
``exec true`` back to back for ``--seconds``, deletes them, and prints create time, exec
throughput, exec latency percentiles and the error count (which should be 0).

    python bench/concurrency.py --sandboxes 1000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import sys
import time
from typing import Counter, List

import warren


def pct(xs: List[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def run(args: argparse.Namespace) -> int:
    tag = os.urandom(4).hex()
    errors: Counter[str] = collections.Counter()
    lat: List[float] = []
    async with warren.AsyncClient(args.url, max_connections=max(args.sandboxes, 64)) as client:
        t0 = time.monotonic()

        async def make() -> warren.AsyncSandbox | None:
            try:
                return await client.create(memory=args.memory, labels={"bench": "concurrency", "run": tag})
            except warren.WarrenError as e:
                errors[f"create: {e.code}"] += 1
                return None

        made = await asyncio.gather(*(make() for _ in range(args.sandboxes)))
        boxes = [b for b in made if b is not None]
        create_s = time.monotonic() - t0
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t1 = time.monotonic()
        deadline = t1 + args.seconds

        async def loop(sb: warren.AsyncSandbox) -> None:
            while time.monotonic() < deadline:
                s = time.perf_counter()
                try:
                    r = await sb.exec(["true"])
                    if r.exit_code != 0:
                        errors[f"exit {r.exit_code}"] += 1
                except warren.WarrenError as e:
                    errors[f"exec: {e.code}"] += 1
                    continue
                lat.append(time.perf_counter() - s)

        await asyncio.gather(*(loop(b) for b in boxes))
        run_s = time.monotonic() - t1
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        t2 = time.monotonic()
        await client.delete_all(labels={"run": tag}, concurrency=256)
        delete_s = time.monotonic() - t2

    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    print(f"{'sandboxes':<26} {len(boxes)} of {args.sandboxes}")
    print(f"{'create (all, concurrent)':<26} {create_s:.1f} s")
    print(f"{'exec calls':<26} {len(lat)} in {run_s:.1f} s = {len(lat) / run_s:.0f}/s")
    print(f"{'exec latency p50/p99':<26} {pct(lat, 50) * 1000:.1f} / {pct(lat, 99) * 1000:.1f} ms")
    print(f"{'client CPU per exec':<26} {cpu / max(1, len(lat)) * 1e6:.0f} us")
    print(f"{'delete (all)':<26} {delete_s:.1f} s")
    print(f"{'errors':<26} {sum(errors.values())} {dict(errors) if errors else ''}")
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="node address (default: WARREN_URL, else the local socket)")
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--memory", default="64M", help="memory per sandbox (default 64M)")
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
