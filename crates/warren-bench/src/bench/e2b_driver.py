"""The client side of `warren bench e2b`: E2B's own SDK (the `e2b` package) and Warren's Python
SDK (`warren`) against one `warrend --e2b`, in one process and one event loop, alternating
sample by sample so that both see the same machine.

Arguments: URL N_RUN N_CREATE ROLLOUTS COMMANDS. Prints one JSON document on stdout:

- `run`: ms of `commands.run("true")` (E2B; the SDK runs `/bin/bash -l -c true`), `exec true`
  and `exec /bin/bash -l -c true` (Warren), in one sandbox (made through E2B, reached through
  Warren's SDK under the same id);
- `create`: ms of `AsyncSandbox.create` → first `commands.run("true")` and of Warren's
  `create` → `exec true` and → `exec /bin/bash -l -c true` (kills/deletes not timed);
- `rollouts`: ROLLOUTS `AsyncSandbox` rollouts at once (create, COMMANDS commands, a file
  written and read back, kill): wall seconds, errors and the first few error texts.
"""

import asyncio
import json
import sys
import time

from e2b import AsyncSandbox

import warren

WARMUP = 20


def main() -> None:
    url, n_run, n_create, rollouts, commands = sys.argv[1], *map(int, sys.argv[2:6])
    opts = {"api_url": url, "sandbox_url": url, "api_key": "warren-bench", "domain": "e2b.bench"}
    out = asyncio.run(bench(url, opts, n_run, n_create, rollouts, commands))
    json.dump(out, sys.stdout)


async def bench(url, opts, n_run, n_create, rollouts, commands):
    async with warren.AsyncClient(url, max_retries=0) as native:
        return {
            "run": await run_true(native, opts, n_run),
            "create": await create_then_run(native, opts, n_create),
            "rollouts": await many(opts, rollouts, commands),
        }


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


async def run_true(native, opts, n):
    sbx = await AsyncSandbox.create(timeout=600, metadata={"bench": "e2b"}, **opts)
    try:
        w = await native.get(sbx.sandbox_id)
        e2b, true, bash = [], [], []

        async def e2b_run():
            t = time.perf_counter()
            r = await sbx.commands.run("true")
            assert r.exit_code == 0, r
            return ms(t)

        async def native_exec(argv):
            t = time.perf_counter()
            r = await w.exec(argv)
            assert r.exit_code == 0, r
            return ms(t)

        for i in range(WARMUP + n):
            order = [0, 1, 2] if i % 2 == 0 else [2, 1, 0]
            got = {}
            for k in order:
                if k == 0:
                    got[k] = await e2b_run()
                elif k == 1:
                    got[k] = await native_exec(["true"])
                else:
                    got[k] = await native_exec(["/bin/bash", "-l", "-c", "true"])
            if i >= WARMUP:
                e2b.append(got[0])
                true.append(got[1])
                bash.append(got[2])
        return {"e2b": e2b, "native_true": true, "native_bash": bash}
    finally:
        await sbx.kill()


async def create_then_run(native, opts, n):
    """Three arms in turn: E2B create → run("true"), Warren create → exec true, Warren create
    → exec /bin/bash -l -c true (the program E2B's run starts)."""
    e2b, nat, bash = [], [], []

    async def e2b_arm():
        t = time.perf_counter()
        sbx = await AsyncSandbox.create(timeout=120, metadata={"bench": "e2b"}, **opts)
        r = await sbx.commands.run("true")
        dt = ms(t)
        assert r.exit_code == 0, r
        await sbx.kill()
        return dt

    async def native_arm(argv):
        t = time.perf_counter()
        sb = await native.create(ttl=120, labels={"bench": "e2b"})
        r = await sb.exec(argv)
        dt = ms(t)
        assert r.exit_code == 0, r
        await sb.delete()
        return dt

    for i in range(n + 3):
        got = {}
        for k in ([0, 1, 2] if i % 2 == 0 else [2, 1, 0]):
            if k == 0:
                got[k] = await e2b_arm()
            elif k == 1:
                got[k] = await native_arm(["true"])
            else:
                got[k] = await native_arm(["/bin/bash", "-l", "-c", "true"])
        if i >= 3:
            e2b.append(got[0])
            nat.append(got[1])
            bash.append(got[2])
    return {"e2b": e2b, "native": nat, "native_bash": bash}


async def many(opts, n, commands):
    async def rollout(i):
        sbx = await AsyncSandbox.create(timeout=300, metadata={"bench": "e2b"}, **opts)
        try:
            for j in range(commands):
                r = await sbx.commands.run(f"echo {i}-{j}")
                assert r.stdout == f"{i}-{j}\n", r
            await sbx.files.write(f"/tmp/rollout-{i}.txt", f"rollout {i}")
            assert await sbx.files.read(f"/tmp/rollout-{i}.txt") == f"rollout {i}"
            assert [e.name for e in await sbx.files.list("/tmp") if e.name == f"rollout-{i}.txt"]
        finally:
            await sbx.kill()

    t = time.perf_counter()
    results = await asyncio.gather(*(rollout(i) for i in range(n)), return_exceptions=True)
    secs = time.perf_counter() - t
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"n": n, "commands": commands, "secs": secs, "errors": len(errors), "first_errors": errors[:5]}


if __name__ == "__main__":
    main()
