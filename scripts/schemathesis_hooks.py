"""Schemathesis hooks of scripts/api-contract.sh.

A sandbox's lifetime (`ttl_secs`) is hard: when it passes, the sandbox is deleted, and a
download streaming out of it at that moment is cut (the HTTP stream ends without its last
chunk, which is the only way a stream that already answered 200 can fail). The generated
creates, forks and extensions would give some sandboxes lifetimes of a second or two, and a
later download of a big tree from one of them would be cut by its expiry: right for the
server, but a network error to the run. So every lifetime the spec allows that is shorter
than the run is lengthened to outlast it; values the spec forbids are sent as generated, so
they are still checked to be refused.
"""

import schemathesis

# Longer than any contract run (MAX_TIME, 120 s by default, plus the slowest request).
OUTLAST_RUN_SECS = 3600


@schemathesis.hook
def before_call(ctx, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    ttl = body.get("ttl_secs")
    if isinstance(ttl, int) and not isinstance(ttl, bool) and 1 <= ttl < OUTLAST_RUN_SECS:
        body["ttl_secs"] = OUTLAST_RUN_SECS
