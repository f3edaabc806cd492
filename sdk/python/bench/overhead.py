#!/usr/bin/env python3
"""SDK overhead over raw HTTP for ``exec true``.

Runs ``exec true`` in one sandbox through four paths, interleaved in rounds so drift on the
node hits them all alike:

* raw async: ``httpx.AsyncClient`` posting the JSON body on the same socket;
* SDK async: ``AsyncSandbox.exec``;
* raw sync: ``httpx.Client`` on the same socket;
* SDK sync: ``Sandbox.exec`` (the async implementation run on the SDK's loop thread).

Prints p50/p90/p99 per path, the SDK's p50 overhead over raw HTTP (target <= 0.5 ms) and
sync against async. Needs a running node: ``--url`` or ``WARREN_URL`` (default the local
socket).

    python bench/overhead.py --calls 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Dict, List

import httpx

import warren
from warren._client import _parse_url

BODY = {"argv": ["true"]}


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def main_async(args: argparse.Namespace) -> int:
    base, uds = _parse_url(args.url)
    async with warren.AsyncClient(args.url) as client:
        sb = await client.create(memory=64, labels={"bench": "overhead"})
        try:
            path = f"/v1/sandboxes/{sb.id}/exec"
            raw_async = httpx.AsyncClient(
                base_url=base, transport=httpx.AsyncHTTPTransport(uds=uds) if uds else None, timeout=None
            )
            raw_sync = httpx.Client(base_url=base, transport=httpx.HTTPTransport(uds=uds) if uds else None, timeout=None)
            sync_client = warren.Client(args.url)
            ssb = sync_client.get(sb.id)
            loop = asyncio.get_running_loop()

            async def raw_a() -> None:
                r = await raw_async.post(path, json=BODY)
                r.raise_for_status()
                r.json()

            async def sdk_a() -> None:
                await sb.exec(["true"])

            def raw_s() -> None:
                r = raw_sync.post(path, json=BODY)
                r.raise_for_status()
                r.json()

            def sdk_s() -> None:
                ssb.exec(["true"])

            samples: Dict[str, List[float]] = {"raw async": [], "SDK async": [], "raw sync": [], "SDK sync": []}
            async_paths = {"raw async": raw_a, "SDK async": sdk_a}
            sync_paths = {"raw sync": raw_s, "SDK sync": sdk_s}
            rounds = max(1, args.calls // args.round)
            for i in range(args.warmup):
                await raw_a()
                await sdk_a()
                raw_s()
                sdk_s()
            for _ in range(rounds):
                for name, fn in async_paths.items():
                    xs = samples[name]
                    for _ in range(args.round):
                        t0 = time.perf_counter()
                        await fn()
                        xs.append(time.perf_counter() - t0)
                # Sync calls block; run them off the loop so the SDK's own loop thread is the
                # only event loop involved (as in a plain blocking program).
                def run_sync() -> None:
                    for name, fn in sync_paths.items():
                        xs = samples[name]
                        for _ in range(args.round):
                            t0 = time.perf_counter()
                            fn()
                            xs.append(time.perf_counter() - t0)

                await loop.run_in_executor(None, run_sync)
            await raw_async.aclose()
            raw_sync.close()
            sync_client.close()
        finally:
            await sb.delete()

    ms = 1000.0
    print(f"exec true, {rounds * args.round} calls per path, node {client.url}")
    print(f"{'path':<10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, xs in samples.items():
        print(
            f"{name:<10} {pct(xs, 50) * ms:8.3f} {pct(xs, 90) * ms:8.3f} {pct(xs, 99) * ms:8.3f} "
            f"{statistics.fmean(xs) * ms:8.3f}"
        )
    p50 = {k: pct(v, 50) * ms for k, v in samples.items()}
    over_async = p50["SDK async"] - p50["raw async"]
    over_sync = p50["SDK sync"] - p50["raw sync"]
    print()
    print(f"SDK overhead, async (p50 SDK - p50 raw): {over_async:+.3f} ms  (target <= 0.5 ms)")
    print(f"SDK overhead, sync  (p50 SDK - p50 raw): {over_sync:+.3f} ms")
    print(f"sync vs async SDK   (p50 sync - async):  {p50['SDK sync'] - p50['SDK async']:+.3f} ms")
    ok = over_async <= 0.5
    print("overhead target:", "met" if ok else "MISSED")
    return 0 if ok or not args.strict else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="node address (default: WARREN_URL, else the local socket)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per path (default 2000)")
    ap.add_argument("--round", type=int, default=100, help="calls per path per interleaved round")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--strict", action="store_true", help="exit 1 when the overhead target is missed")
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
