# Runs the cells of a /run_jupyter request inside its function call, one after the other in
# one namespace, as a notebook's python3 kernel runs them. Reads $S/cells.json
# ({"cells": [...], "cell_timeout": seconds or 0}); after each cell rewrites $S/cells.out.json
# ({"cells": [{stdout, stderr, display, error}], "timed_out": bool}), so a call cut short by
# its total timeout still returns the cells that ended. Each cell's stdout and stderr are its
# file descriptors 1 and 2 (what its subprocesses print is the cell's too); the value of a
# last expression statement is its display ({"text/plain": repr}, plus "text/html" when the
# value has `_repr_html_`); an exception is its error ({ename, evalue, traceback}), and the
# next cells still run, as in a notebook. A cell over the cell timeout ends the run.
import ast
import json
import os
import signal
import sys
import traceback
import types

S = "/tmp/.warren-fusion"
# The working directory of the cells (the request's files are written there), made when the
# request brought none.
os.makedirs("/tmp/code", exist_ok=True)
os.chdir("/tmp/code")
# Modules beside the cells import, as in a notebook (whose path starts with the working
# directory), not the driver's own directory.
sys.path[0] = ""
with open(S + "/cells.json") as f:
    spec = json.load(f)
cells = spec["cells"]
cell_timeout = float(spec.get("cell_timeout") or 0)
# What one cell's stdout, stderr and display may each keep: the answer file has room for
# about 700 KB.
budget = max(1024, 200_000 // max(1, len(cells)))
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
ns = main.__dict__
ns["__builtins__"] = __builtins__
results = []


class CellTimeout(BaseException):
    pass


def on_alarm(signum, frame):
    raise CellTimeout()


def flush():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass


def read(path):
    with open(path, "rb") as f:
        b = f.read(budget + 1)
    t = b[:budget].decode("utf-8", "replace")
    return t + ("\n[output truncated]\n" if len(b) > budget else "")


def display_of(v):
    d = {"text/plain": repr(v)[:budget]}
    html = getattr(v, "_repr_html_", None)
    if callable(html):
        try:
            h = html()
            if isinstance(h, str):
                d["text/html"] = h
        except Exception:
            pass
    return d


def save(timed_out):
    tmp = S + "/cells.out.json.tmp"
    with open(tmp, "w") as f:
        json.dump({"cells": results, "timed_out": timed_out}, f)
    os.replace(tmp, S + "/cells.out.json")


signal.signal(signal.SIGALRM, on_alarm)
# A line printed is written at once, in order with what subprocesses write to the same fd.
for s in (sys.stdout, sys.stderr):
    s.reconfigure(line_buffering=True)
timed_out = False
for i, src in enumerate(cells):
    name = "<cell %d>" % (i + 1)
    out_path, err_path = "%s/cell.out" % S, "%s/cell.err" % S
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    flush()
    saved = (os.dup(1), os.dup(2))
    os.dup2(out, 1)
    os.dup2(err, 2)
    display, error = [], []
    try:
        if cell_timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            tree = ast.parse(src, filename=name)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), ns)
            if last is not None:
                v = eval(compile(last, name, "eval"), ns)
                if v is not None:
                    ns["_"] = v
                    display.append(display_of(v))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CellTimeout:
        timed_out = True
        error.append(
            {
                "ename": "TimeoutError",
                "evalue": "the cell ran longer than its %g s" % cell_timeout,
                "traceback": [],
            }
        )
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        error.append(
            {
                "ename": type(e).__name__,
                "evalue": str(e),
                "traceback": traceback.format_exception(type(e), e, tb),
            }
        )
    flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (out, err) + saved:
        os.close(fd)
    results.append({"stdout": read(out_path), "stderr": read(err_path), "display": display, "error": error})
    save(timed_out)
    if timed_out:
        break
save(timed_out)
