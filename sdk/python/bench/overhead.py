#!/usr/bin/env python3
"""SDK overhead over raw HTTP for ``exec true``.

Runs ``exec true`` in one sandbox through four paths, alternating call by call so drift on
the node hits them alike:

* raw async: ``httpx.AsyncClient`` posting the JSON body on the same socket;
* SDK async: ``AsyncSandbox.exec``;
* raw sync: ``httpx.Client`` on the same socket;
* SDK sync: ``Sandbox.exec`` (the async implementation run on the SDK's loop thread).

Prints p50/p90/p99 per path, the SDK's p50 overhead over raw HTTP (target <= 0.5 ms), sync
against async, and the client-side cost of each layer with the node replaced by a canned
answer (no I/O, so no noise from the node). Needs a running node: ``--url`` or ``WARREN_URL`` (default the local
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
from warren._transport import _parse_url

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
            raw_sync = httpx.Client(
                base_url=base, transport=httpx.HTTPTransport(uds=uds) if uds else None, timeout=None
            )
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
            for _ in range(args.warmup):
                await raw_a()
                await sdk_a()
                raw_s()
                sdk_s()
            rounds = max(1, args.calls // args.round)
            for _ in range(rounds):
                # Alternate call by call so drift on the node hits both paths alike.
                ra, sa = samples["raw async"], samples["SDK async"]
                for i in range(args.round):
                    # Alternate which path goes first, too.
                    order = ((raw_a, ra), (sdk_a, sa)) if i % 2 == 0 else ((sdk_a, sa), (raw_a, ra))
                    for fn, xs in order:
                        t0 = time.perf_counter()
                        await fn()
                        xs.append(time.perf_counter() - t0)

                # Blocking calls run off this loop, as in a plain blocking program.
                def run_sync() -> None:
                    rs, ss = samples["raw sync"], samples["SDK sync"]
                    for i in range(args.round):
                        order = ((raw_s, rs), (sdk_s, ss)) if i % 2 == 0 else ((sdk_s, ss), (raw_s, rs))
                        for fn, xs in order:
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
    cs = await client_side(max(2000, args.calls))
    print()
    print("client-side cost per call, node replaced by a canned answer (p50):")
    print(
        f"  raw httpx {cs['raw httpx']:.3f} ms, SDK {cs['SDK']:.3f} ms, SDK layer {cs['SDK'] - cs['raw httpx']:+.3f} ms"
    )
    ok = over_async <= 0.5
    print("overhead target (async p50 <= 0.5 ms):", "met" if ok else "MISSED")
    return 0 if ok or not args.strict else 1


CANNED = (
    b'{"exit_code":0,"signal":null,"timed_out":false,"stdout":"","stderr":"","stdout_truncated":false,'
    b'"stderr_truncated":false,"stdout_bytes":0,"stderr_bytes":0,"encoding":"utf8","duration_ms":1.0}'
)


async def client_side(n: int) -> Dict[str, float]:
    """Per-call cost of each layer with the node replaced by a canned answer (no I/O)."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=CANNED, headers={"content-type": "application/json"})

    mock = httpx.MockTransport(handler)
    raw = httpx.AsyncClient(base_url="http://warren", transport=mock)
    c = warren.AsyncClient("unix:///nonexistent.sock")
    c._http.client = httpx.AsyncClient(base_url="http://warren", transport=mock)
    sb = warren.AsyncSandbox(c, warren.SandboxInfo.from_json({"id": "n1-01jd0m7x4e8k0k9yq1w2e3r4t5", "limits": {}}))
    path = f"/v1/sandboxes/{sb.id}/exec"
    out: Dict[str, float] = {}
    for name in ("raw httpx", "SDK"):
        xs = []
        for i in range(n + 200):
            t0 = time.perf_counter()
            if name == "SDK":
                await sb.exec(["true"])
            else:
                r = await raw.post(path, json=BODY)
                r.raise_for_status()
                r.json()
            if i >= 200:
                xs.append(time.perf_counter() - t0)
        out[name] = pct(xs, 50) * 1000
    await raw.aclose()
    return out


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
