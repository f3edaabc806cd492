"""The client side of `warren bench e2b`: E2B's own SDK (the `e2b` package) and Warren's Python
SDK (`warren`) against one `warrend --e2b`, in one process and one event loop, alternating
sample by sample so that both see the same machine.

Arguments: URL N_RUN N_CREATE ROLLOUTS COMMANDS DAEMON_PID N_CPU ROUNDS. Prints one JSON
document on stdout:

- `run`: ms of `commands.run("true")` (E2B; the SDK runs `/bin/bash -l -c true`), `exec true`,
  `exec /bin/bash -c true` and `exec /bin/bash -l -c true` (Warren), in one sandbox (made
  through E2B, reached through Warren's SDK under the same id); and `commands.run("true")`
  and `exec /bin/bash -l -c true` in a second sandbox with Debian's stock login profile;
- `create`: ms of `AsyncSandbox.create` → first `commands.run("true")` and of Warren's
  `create` → `exec true` and → `exec /bin/bash -l -c true` (kills/deletes not timed);
- `cpu`: CPU time per call of `commands.run("true")`, Warren's `exec_stream` and Warren's
  `exec` of `/bin/bash -l -c true` (what `run("true")` starts), N_CPU calls per arm and
  round, ROUNDS rounds, one arm after the other in one sandbox: the daemon's (every thread of
  DAEMON_PID), this client's (`process_time`: both SDKs) and the sandbox's
  (its cgroup's `cpu_usec`: the agent and the command), in ms per call;
- `rollouts`: ROLLOUTS `AsyncSandbox` rollouts at once (create, COMMANDS commands, a file
  written and read back, kill): wall seconds, errors and the first few error texts.
"""

import asyncio
import json
import os
import sys
import time

from e2b import AsyncSandbox

import warren

WARMUP = 20


def main() -> None:
    url = sys.argv[1]
    n_run, n_create, rollouts, commands, daemon_pid, n_cpu, rounds = map(int, sys.argv[2:9])
    opts = {"api_url": url, "sandbox_url": url, "api_key": "warren-bench", "domain": "e2b.bench"}
    out = asyncio.run(bench(url, opts, n_run, n_create, rollouts, commands, (daemon_pid, n_cpu, rounds)))
    json.dump(out, sys.stdout)


async def bench(url, opts, n_run, n_create, rollouts, commands, cpu):
    async with warren.AsyncClient(url, max_retries=0) as native:
        return {
            "run": await run_true(native, opts, n_run),
            "cpu": await cpu_per_call(native, opts, *cpu),
            "create": await create_then_run(native, opts, n_create),
            "rollouts": await many(opts, rollouts, commands),
        }


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


# Debian's own login profile, kept by base-files; the default image's runs no program without
# a terminal (scripts/build-default-image.sh). A second sandbox gets Debian's back, so both are
# measured in the same run.
STOCK_PROFILE = (
    "cp /usr/share/base-files/profile /etc/profile"
    " && cp /usr/share/base-files/dot.profile /root/.profile"
)


async def run_true(native, opts, n):
    sbx = await AsyncSandbox.create(timeout=600, metadata={"bench": "e2b"}, **opts)
    stock = await AsyncSandbox.create(timeout=600, metadata={"bench": "e2b"}, **opts)
    try:
        await stock.commands.run(STOCK_PROFILE)
        w = await native.get(sbx.sandbox_id)
        ws = await native.get(stock.sandbox_id)
        names = [
            "e2b", "native_true", "native_plain_bash", "native_bash",
            "e2b_stock", "native_bash_stock",
        ]
        out = {k: [] for k in names}

        async def e2b_run(s):
            t = time.perf_counter()
            r = await s.commands.run("true")
            assert r.exit_code == 0, r
            return ms(t)

        async def native_exec(s, argv):
            t = time.perf_counter()
            r = await s.exec(argv)
            assert r.exit_code == 0, r
            return ms(t)

        login = ["/bin/bash", "-l", "-c", "true"]
        arms = [
            lambda: e2b_run(sbx),
            lambda: native_exec(w, ["true"]),
            lambda: native_exec(w, ["/bin/bash", "-c", "true"]),
            lambda: native_exec(w, login),
            lambda: e2b_run(stock),
            lambda: native_exec(ws, login),
        ]
        for i in range(WARMUP + n):
            order = list(range(len(arms)))
            if i % 2:
                order.reverse()
            got = {}
            for k in order:
                got[k] = await arms[k]()
            if i >= WARMUP:
                for k, name in enumerate(names):
                    out[name].append(got[k])
        return out
    finally:
        await sbx.kill()
        await stock.kill()


def daemon_cpu_ms(pid):
    """`utime + stime` of process `pid` (every thread, those gone included), in ms. The
    kernel counts it to the nanosecond and shows it in clock ticks: over short rounds the
    rounding averages out (summing `/proc/PID/task/*/schedstat` instead would lose the time
    of threads that exit, as the blocking pool's do)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command's name: state is field 3, utime 14 and stime 15 (from 1).
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


async def cpu_per_call(native, opts, daemon_pid, n, rounds):
    """Per arm and round: ms of CPU per call in the daemon, this client and the sandbox."""
    names = ["e2b", "exec_stream", "exec"]
    out = {k: [] for k in names}
    if n <= 0 or rounds <= 0:
        return out
    sbx = await AsyncSandbox.create(timeout=600, metadata={"bench": "e2b"}, **opts)
    try:
        w = await native.get(sbx.sandbox_id)
        login = ["/bin/bash", "-l", "-c", "true"]

        async def e2b_run():
            r = await sbx.commands.run("true")
            assert r.exit_code == 0, r

        async def stream():
            r = await w.exec_stream(login).wait()
            assert r.exit_code == 0, r

        async def one_shot():
            r = await w.exec(login)
            assert r.exit_code == 0, r

        arms = {"e2b": e2b_run, "exec_stream": stream, "exec": one_shot}
        for arm in arms.values():
            for _ in range(WARMUP):
                await arm()
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                s0 = (await w.stats())["cpu_usec"] or 0
                d0, c0 = daemon_cpu_ms(daemon_pid), time.process_time()
                for _ in range(n):
                    await arms[name]()
                c1, d1 = time.process_time(), daemon_cpu_ms(daemon_pid)
                s1 = (await w.stats())["cpu_usec"] or 0
                out[name].append({
                    "daemon": (d1 - d0) / n,
                    "client": (c1 - c0) * 1000.0 / n,
                    "sandbox": (s1 - s0) / 1000.0 / n,
                })
        return out
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
