"""Several URLs against real HTTP servers on loopback that refuse connections, break them,
answer 503/429 with Retry-After, or serve: which calls move on to the next URL, which wait and
how often, and which are raised at once. Needs no node."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import warren
from warren._failover import BROKEN, GIVE_UP, MAX_WAIT, NEXT_URL, NOT_SENT, Plan, split_urls


class _Server:
    """A threaded HTTP server on 127.0.0.1 answering by ``mode``:

    ``("serve",)``, ``("unavailable", code, retry_after)``, ``("busy_for", n, retry_after)``
    (429 busy for the first n calls, then serve), ``("unreachable_for", n)`` (503
    ``node_unreachable`` for the first n calls, then serve) or ``("break",)`` (close without
    answering).
    """

    def __init__(self, name: str, mode: Tuple[Any, ...], port: int = 0) -> None:
        self.name = name
        self.mode = mode
        self.times: List[float] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                n = len(server.times)
                server.times.append(time.monotonic())
                kind = server.mode[0]
                if kind == "break":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if kind == "unavailable":
                    return self._error(503, server.mode[1], server.mode[2])
                if kind == "busy_for" and n < server.mode[1]:
                    return self._error(429, "busy", server.mode[2])
                if kind == "unreachable_for" and n < server.mode[1]:
                    return self._error(503, "node_unreachable", 0)
                self._json(200, server.body(self.path))

            do_GET = do_POST = do_DELETE = _handle

            def _error(self, status: int, code: str, retry_after: int) -> None:
                body = {"error": {"code": code, "message": "test", "retry_after": retry_after}}
                self._json(status, body, {"retry-after": str(retry_after)})

            def _json(self, status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def hits(self) -> int:
        return len(self.times)

    def body(self, path: str) -> Any:
        if path.startswith("/v1/health"):
            return {"status": "ok", "node": self.name, "version": "t", "substrates": ["container"]}
        if path.endswith("/exec"):
            return {"exit_code": 0, "signal": None, "stdout": self.name, "stderr": "", "timed_out": False}
        return {"id": f"{self.name}-01J", "substrate": "container", "state": "running", "image": ["default"]}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[Any]:
    made: List[_Server] = []

    def make(name: str, *mode: Any, port: int = 0) -> _Server:
        s = _Server(name, mode, port)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _refused() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_reads_pass_refused_and_unavailable_urls_then_stay_with_the_one_that_answered(servers: Any) -> None:
    gone = servers("gone", "unavailable", "gateway_unavailable", 1)
    good = servers("good", "serve")
    with warren.Client([_refused(), gone.url, good.url]) as c:
        assert len(c.urls) == 3
        assert c.health().node == "good"
        assert (gone.hits, good.hits) == (1, 1)
        assert c.url == good.url
        for _ in range(3):
            c.health()
        assert (gone.hits, good.hits) == (1, 4)


def test_a_request_that_never_left_goes_to_the_next_url_whatever_the_call(servers: Any) -> None:
    good = servers("good", "serve")
    with warren.Client(f"{_refused()},{good.url}") as c:
        sb = c.get("good-01J")
        assert sb.exec("true").stdout == "good"
        assert good.hits == 2


def test_calls_that_are_not_safe_to_repeat_are_not_repeated_once_sent(servers: Any) -> None:
    gone = servers("gone", "unavailable", "gateway_unavailable", 1)
    broken = servers("broken", "break")
    good = servers("good", "serve")
    with warren.Client([good.url, gone.url, broken.url]) as c:
        sb = c.get("good-01J")
        c._async._http.preferred = 1  # start at the unavailable one
        with pytest.raises(warren.WarrenError) as e:
            sb.exec("true")
        assert e.value.status == 503
        with pytest.raises(warren.WarrenError):
            c.create()  # no idempotency key
        assert (gone.hits, good.hits) == (2, 1)
        c._async._http.preferred = 2  # the one that breaks connections
        with pytest.raises(warren.ConnectionError):
            sb.exec("true")
        assert (broken.hits, good.hits) == (1, 1)


def test_safe_calls_move_on_after_a_broken_connection_or_a_503(servers: Any) -> None:
    broken = servers("broken", "break")
    gone = servers("gone", "unavailable", "capacity_unavailable", 1)
    good = servers("good", "serve")
    with warren.Client([broken.url, gone.url, good.url]) as c:
        assert c.health().node == "good"
        assert (broken.hits, gone.hits) == (1, 1)
    with warren.Client([gone.url, good.url]) as c:
        sb = c.create(idempotency_key="k-1")
        assert sb.id == "good-01J"
        assert (gone.hits, good.hits) == (2, 2)


def test_a_dead_node_behind_a_gateway_is_raised_at_once_without_a_restart_wait(servers: Any) -> None:
    gw1 = servers("gw1", "unavailable", "node_unreachable", 1)
    gw2 = servers("gw2", "serve")
    with warren.Client([gw1.url, gw2.url], restart_wait=0) as c:
        with pytest.raises(warren.WarrenError) as e:
            c.health()
        assert e.value.status == 503 and e.value.code == "node_unreachable"
        assert (gw1.hits, gw2.hits) == (1, 0)


def test_retry_after_is_waited_for_then_the_call_succeeds(servers: Any) -> None:
    busy = servers("busy", "busy_for", 2, 1)
    with warren.Client(busy.url) as c:
        assert c.health().node == "busy"
    assert busy.hits == 3
    gaps = [b - a for a, b in zip(busy.times, busy.times[1:])]
    assert all(g >= 1.0 for g in gaps), gaps


def test_waiting_is_bounded(servers: Any) -> None:
    busy = servers("busy", "busy_for", 10**9, 0)
    with warren.Client(busy.url, max_retries=3) as c:
        with pytest.raises(warren.Busy):
            c.health()
    assert busy.hits == 4
    a = servers("a", "unavailable", "capacity_unavailable", 0)
    b = servers("b", "unavailable", "capacity_unavailable", 0)
    with warren.Client([a.url, b.url], max_retries=2) as c:
        with pytest.raises(warren.WarrenError) as e:
            c.health()
        assert e.value.status == 503
    assert (a.hits, b.hits) == (3, 3)


def test_url_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    assert split_urls("http://a:1, unix:///b.sock") == ["http://a:1", "unix:///b.sock"]
    assert split_urls(["http://a:1"]) == ["http://a:1"]
    assert split_urls(None) == [None]
    for bad in ["", "http://a:1,", [], ["http://a:1", " "]]:
        with pytest.raises(ValueError):
            split_urls(bad)  # type: ignore[arg-type]
    monkeypatch.setenv("WARREN_URL", "http://10.0.0.1:80,http://10.0.0.2:80")
    assert warren.AsyncClient().urls == ["http://10.0.0.1:80", "http://10.0.0.2:80"]
    with pytest.raises(ValueError):
        warren.AsyncClient(["http://a:1", "ftp://b"])


def test_plan_rules() -> None:
    p = Plan(3, 5, safe=False)
    assert [p.after(NOT_SENT) for _ in range(3)] == [NEXT_URL, NEXT_URL, GIVE_UP]
    for attempt in [BROKEN, (503, 1.0, None), (429, 1.0, "busy"), (500, None, None)]:
        assert Plan(3, 5, safe=False).after(attempt) == GIVE_UP
    p = Plan(2, 2, safe=True)
    assert p.after((503, 3.0, None)) == NEXT_URL
    assert p.after((503, 3.0, None)) == 3.0
    assert p.after(BROKEN) == NEXT_URL
    assert isinstance(p.after(NOT_SENT), float)
    assert p.after(NOT_SENT) == NEXT_URL
    assert p.after(NOT_SENT) == GIVE_UP
    p = Plan(1, 3, safe=True)
    assert p.after((429, 3600.0, "busy")) == MAX_WAIT
    assert p.after((429, None, "limit_exceeded")) == GIVE_UP
    for attempt in [(503, 1.0, "node_unreachable"), (410, None, "sandbox_lost"), (404, None, "not_found")]:
        assert Plan(3, 5, safe=True).after(attempt) == GIVE_UP


def test_plan_waits_out_a_silent_node_for_restart_wait_then_says_so() -> None:
    now = [100.0]
    clock = lambda: now[0]  # noqa: E731
    # A safe call: connection failures and node_unreachable wait, uncounted, for 10 s.
    p = Plan(1, 2, safe=True, restart_wait=10.0, clock=clock)
    for attempt in [BROKEN, NOT_SENT, (503, None, "node_unreachable")] * 20:
        step = p.after(attempt)
        assert isinstance(step, float) and 0 < step <= 1.0, step
        now[0] += step
        if now[0] - 100.0 >= 10.0:
            break
    now[0] = 110.5
    assert p.waits == 0 and not p.outlasted
    # Past the window: the ordinary waits (max_retries), then the give-up says why.
    assert isinstance(p.after(NOT_SENT), float) and isinstance(p.after(BROKEN), float)
    assert p.after(NOT_SENT) == GIVE_UP and p.outlasted
    # node_unreachable past the window gives up at once.
    p = Plan(2, 5, safe=True, restart_wait=1.0, clock=clock)
    assert isinstance(p.after((503, None, "node_unreachable")), float)
    now[0] += 2
    assert p.after((503, None, "node_unreachable")) == GIVE_UP and p.outlasted
    # A call not safe to repeat waits only while nothing was sent.
    p = Plan(1, 5, safe=False, restart_wait=5.0, clock=clock)
    assert isinstance(p.after(NOT_SENT), float)
    assert p.after(BROKEN) == GIVE_UP and not p.outlasted
    assert Plan(1, 5, safe=False, restart_wait=5.0, clock=clock).after((503, None, "node_unreachable")) == GIVE_UP


def test_a_safe_call_waits_for_a_node_that_comes_back(servers: Any) -> None:
    """The node's address refuses connections, then answers ``503 node_unreachable``, then
    serves: a safe call waits it out and gets its answer."""
    url = _refused()
    port = int(url.rsplit(":", 1)[1])
    made: List[Any] = []

    def come_back() -> None:
        time.sleep(0.6)
        made.append(servers("back", "unreachable_for", 2, port=port))

    t = threading.Thread(target=come_back)
    t.start()
    with warren.Client(url, restart_wait=20) as c:
        t0 = time.monotonic()
        h = c.health()
        assert h.node == "back" and time.monotonic() - t0 >= 0.5
    t.join()
    assert made[0].hits == 3


def test_a_silent_node_ends_in_a_clear_error_after_restart_wait() -> None:
    url = _refused()
    with warren.Client(url, restart_wait=0.4, max_retries=0) as c:
        t0 = time.monotonic()
        with pytest.raises(warren.ConnectionError) as e:
            c.health()
        assert time.monotonic() - t0 >= 0.4
    assert "restart_wait" in str(e.value) and "0.4 s" in str(e.value), str(e.value)


def test_restart_wait_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_RESTART_WAIT", "7.5")
    assert warren.AsyncClient("http://127.0.0.1:1")._http.restart_wait == 7.5
    assert warren.AsyncClient("http://127.0.0.1:1", restart_wait=0)._http.restart_wait == 0
    monkeypatch.setenv("WARREN_RESTART_WAIT", "soon")
    with pytest.raises(ValueError):
        warren.AsyncClient("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        warren.AsyncClient("http://127.0.0.1:1", restart_wait=-1)


def test_cluster_routes_of_a_gateway() -> None:
    """``cluster()``, ``drain()`` and ``undrain()`` against a loopback server speaking the
    gateway's cluster routes; drains are safe to repeat, so a 503 moves them on."""
    seen: List[Tuple[str, str]] = []
    view = {"nodes": [{"id": "n1", "state": "ready"}], "etcd_connected": True, "revision": 7}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            seen.append((self.command, self.path))
            body = json.dumps(view if self.path == "/v1/cluster" else {}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    gone = _Server("gone", ("unavailable", "gateway_unavailable", 0))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with warren.Client([gone.url, url]) as c:
            assert c.cluster() == view
            c.drain("n1")
            c.undrain("n/2")
        assert seen == [
            ("GET", "/v1/cluster"),
            ("POST", "/v1/cluster/nodes/n1/drain"),
            ("POST", "/v1/cluster/nodes/n%2F2/undrain"),
        ]
        assert gone.hits == 1
    finally:
        httpd.shutdown()
        httpd.server_close()
        gone.close()
