"""When a call goes to the next URL, waits, or gives up (the same rules as the Rust client).

A client may be given several URLs (the gateways of a cluster). This module holds the rules
as a small state machine over what each attempt produced, so they are tested without a
network; ``_client._Http`` runs the attempts. It never opens a connection or sleeps.

- A request that never left (connection refused, connect timeout) goes to the next URL,
  whatever the call: nothing can have happened anywhere.
- A call that is safe to repeat (reads, deletes, creates with an idempotency key, logged
  steps) also goes to the next URL after a connection that broke once the request was sent,
  and after a ``503`` (a gateway or node that is unavailable) -- except
  ``503 node_unreachable``: every gateway sees the same dead node, so that answer comes back at
  once.
- Once every URL was tried in a round, or on a ``429`` with a ``Retry-After`` (the server is
  saturated), a safe call waits (``Retry-After`` when the server sent one, capped at 30 s; else
  a short exponential backoff with jitter) and starts again, at most ``max_retries`` times.
- A node that does not answer at all (no URL takes the connection, a safe call's connection
  broke, or ``503 node_unreachable`` from a gateway) may be restarting: the call waits for it
  (backoff up to 1 s) for at most ``restart_wait`` seconds from the first such failure, then as
  above. A call that was never sent waits so too, whatever the call (nothing happened); one
  that may have been sent only when it is safe to repeat (a logged step is: the node answers
  its one run). When the wait runs out, :attr:`Plan.outlasted` says so, for a clear error.
- Everything else is raised to the caller as it came.
"""

from __future__ import annotations

import random
import time
from typing import Callable, List, Optional, Sequence, Union

__all__ = ["NOT_SENT", "BROKEN", "NEXT_URL", "GIVE_UP", "MAX_WAIT", "Plan", "split_urls"]

#: The request never reached the server.
NOT_SENT = "not_sent"
#: The connection failed after the request may have been sent.
BROKEN = "broken"
#: Send to the next URL now.
NEXT_URL = "next_url"
#: Raise the failure.
GIVE_UP = "give_up"
#: The longest wait a ``Retry-After`` may impose.
MAX_WAIT = 30.0
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 2.0
#: The longest wait between tries while a node does not answer.
_OUTAGE_CAP = 1.0


def split_urls(url: Union[str, Sequence[str], None]) -> List[Optional[str]]:
    """``url`` as a list: a sequence as given, a string split at commas, ``None`` as ``[None]``
    (the environment's or the default URL)."""
    if url is None:
        return [None]
    parts = [u.strip() for u in url.split(",")] if isinstance(url, str) else [str(u).strip() for u in url]
    if not parts or any(not p for p in parts):
        raise ValueError(f"url must be one URL or a non-empty list of URLs, got {url!r}")
    return list(parts)


class Plan:
    """The attempts of one call over ``urls`` URLs.

    :meth:`after` takes what an attempt produced -- :data:`NOT_SENT`, :data:`BROKEN`, or an
    error status as ``(status, retry_after_seconds_or_None, code_or_None)`` -- and answers
    :data:`NEXT_URL`, :data:`GIVE_UP` or a number of seconds to wait before trying the first
    URL of the call again.
    """

    def __init__(
        self,
        urls: int,
        max_waits: int,
        safe: bool,
        restart_wait: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.urls = max(1, urls)
        self.max_waits = max(0, max_waits)
        self.safe = safe
        self.restart_wait = max(0.0, float(restart_wait))
        self.clock = clock
        self.tried_in_round = 1
        self.waits = 0
        self.outage_since: Optional[float] = None
        self.outage_waits = 0
        #: True once the call gave up because the node did not answer for ``restart_wait`` s.
        self.outlasted = False

    def after(self, attempt: Union[str, tuple]) -> Union[str, float]:
        untried = self.tried_in_round < self.urls
        step: Union[str, float] = GIVE_UP
        if attempt == NOT_SENT and untried:
            step = NEXT_URL
        elif attempt == NOT_SENT:
            step = self._outage(None, then_wait=self.safe)
        elif attempt == BROKEN:
            if self.safe:
                step = NEXT_URL if untried else self._outage(None, then_wait=True)
        elif isinstance(attempt, tuple) and self.safe:
            status, retry_after, code = attempt
            if status == 503 and code == "node_unreachable":
                # Every gateway sees the same node: wait for it rather than ask another.
                step = self._outage(retry_after, then_wait=False)
            elif status == 503:
                step = NEXT_URL if untried else self._wait(retry_after)
            elif status == 429 and (retry_after is not None or code == "busy"):
                step = self._wait(retry_after)
        if step == NEXT_URL:
            self.tried_in_round += 1
        elif step != GIVE_UP:
            self.tried_in_round = 1
        return step

    def _outage(self, retry_after: Optional[float], then_wait: bool) -> Union[str, float]:
        """A wait while the node does not answer: within ``restart_wait`` of the first such
        failure a short backoff; after it the ordinary waits when ``then_wait``."""
        now = self.clock()
        if self.outage_since is None:
            self.outage_since = now
        left = self.restart_wait - (now - self.outage_since)
        if left > 0:
            base = min(_OUTAGE_CAP, _BACKOFF_BASE * (2 ** min(self.outage_waits, 16)))
            self.outage_waits += 1
            wait = random.uniform(0.5, 1.0) * base
            if retry_after is not None:
                wait = max(wait, min(float(retry_after), _OUTAGE_CAP))
            return max(0.001, min(wait, left))
        step = self._wait(retry_after) if then_wait else GIVE_UP
        if step == GIVE_UP and self.restart_wait > 0:
            self.outlasted = True
        return step

    def _wait(self, retry_after: Optional[float]) -> Union[str, float]:
        if self.waits >= self.max_waits:
            return GIVE_UP
        backoff = random.uniform(0.5, 1.0) * min(_BACKOFF_CAP, _BACKOFF_BASE * (2 ** min(self.waits, 16)))
        wait = backoff if retry_after is None else max(float(retry_after), backoff)
        self.waits += 1
        return min(wait, MAX_WAIT)
