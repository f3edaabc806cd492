#!/usr/bin/env bash
# The API contract, checked by Schemathesis (PyPI) against a private node: requests generated
# from api/openapi.yaml (its examples, boundary cases and fuzzed input) go to a `warrend` of
# its own on a loopback port, and every answer must be no server error and have the content
# type, headers and body schema the spec says. Bounded in examples and time (MAX_TIME seconds,
# default 120); the seed is fixed, so a run is reproducible. Every sandbox the run made is
# deleted and the daemon stopped at the end.
#
# The checks: no server error; status codes, content types, headers and bodies as documented;
# every request the spec allows is accepted (positive data) and every request it forbids is
# refused (negative data), so the spec says exactly what the server takes. The node runs with
# the example network configuration (docs/examples/network.toml), so the spec's own examples
# of network policies name services it offers. The exec attach body (a JSON line, then raw
# stdin) and the keys of maps (labels, environment, services) are beyond what OpenAPI 3.0 can
# describe: scripts/schemathesis.toml (which also selects the checks) leaves those out of the
# positive-data check, and only that check.
#
# Usage: scripts/api-contract.sh [--install-only] [VENV]   (VENV: a Python venv to install
# Schemathesis in, default target/venv; --install-only: install it and stop, as the suite does
# before its Python phases run side by side). Needs root and the release binaries
# (target/release or WARREN_BIN_DIR). API_SPEC overrides the spec checked (default
# api/openapi.yaml).
#
# The node takes its sandbox addresses from a pool of its own (10.251.0.0/16), so the run can
# share the host with other daemons using the example configuration (the Python SDK's tests
# run beside it in the suite).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
INSTALL_ONLY=false
if [[ "${1:-}" == --install-only ]]; then
    INSTALL_ONLY=true
    shift
fi
VENV="${1:-$REPO/target/venv}"
BIN="${WARREN_BIN_DIR:-$REPO/target/release}"
MAX_TIME="${MAX_TIME:-120}"
SPEC="${API_SPEC:-$REPO/api/openapi.yaml}"
SEED="${SCHEMATHESIS_SEED:-20261201}"
PORT="${API_CONTRACT_PORT:-18931}"
# Short: a VM's sockets live under the state directory, and a Unix socket's path has at most
# 107 bytes.
WORK=$(mktemp -d "${WARREN_TEST_DIR:-/tmp}/ac.XXXXXX")
NODE="api$$"

if ! "$VENV/bin/python" -c 'import sys' > /dev/null 2>&1; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
fi
# Pinned: a new release brings new checks, which must not turn CI red on a change of nothing.
SCHEMATHESIS_VERSION=4.32.5
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('schemathesis') != '$SCHEMATHESIS_VERSION')" 2> /dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
if $INSTALL_ONLY; then
    rm -rf "$WORK"
    exit 0
fi

# The example configuration with a pool of the run's own (a top-level key, so before its tables).
{
    echo 'pool = "10.251.0.0/16"'
    cat "$REPO/docs/examples/network.toml"
} > "$WORK/network.toml"

# No guest kernel, so no VM substrates (a create asking for one is 501, as the spec says): a
# VM's boot under software emulation on a busy CI machine outlasts the run's request timeout,
# and its start failure would be a 502 of the host, not of the API. crates/warren-tests
# (tests/vm) drives VMs.
"$BIN/warrend" --socket "$WORK/warren.sock" --listen "127.0.0.1:$PORT" --state-dir "$WORK/state" \
    --node "$NODE" --agent "$BIN/warren-agent" --max-sandboxes 16 \
    --guest-kernel "$WORK/no-guest-kernel" \
    --network-config "$WORK/network.toml" \
    --function-min-warm 0 --function-max-warm 1 > "$WORK/warrend.log" 2>&1 &
DAEMON=$!
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 && -f "$WORK/warrend.log" ]]; then
        echo "api-contract: the daemon's warnings and errors (of $WORK/warrend.log):"
        grep -E ' (WARN|ERROR) ' "$WORK/warrend.log" | tail -n 40 || true
    fi
    "$BIN/warren" --url "unix://$WORK/warren.sock" rm --all > /dev/null 2>&1 || true
    kill "$DAEMON" 2> /dev/null || true
    wait "$DAEMON" 2> /dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 100); do
    [[ -S "$WORK/warren.sock" ]] && break
    sleep 0.1
done

# The terminal routes are interactive: the WebSocket one is an upgrade, which Schemathesis
# does not speak, and the plain-HTTP one (`pty/attach`) answers for as long as its terminal
# lives and is cut when the sandbox goes (a generated delete); the node's API tests check
# their bad input. Tar bodies
# (directory uploads, image archives, build contexts) have no generator. A pull would reach out to a public
# registry: the contract run talks to its own daemon on loopback only. The cluster routes
# are the gateway's: a node does not serve them. The event stream never ends, so it has no
# response to check (the node's API tests read it, check its refusals and check each event's
# data against its schema under `x-warren-events`). A sandbox's ports answer
# whatever the server inside says (nothing listens in a generated sandbox: 502), which no
# schema describes; crates/warren-tests (sandbox/ports.rs) checks them against real servers.
# scripts/schemathesis_hooks.py gives generated sandboxes lifetimes longer than the run (a
# sandbox that expires cuts the download streaming out of it, rightly).
cd "$WORK"
PYTHONPATH="$REPO/scripts${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=schemathesis_hooks \
    "$VENV/bin/schemathesis" --config-file "$REPO/scripts/schemathesis.toml" \
    run "$SPEC" --url "http://127.0.0.1:$PORT" \
    --phases examples,coverage,fuzzing --max-examples 50 --max-time "$MAX_TIME" --seed "$SEED" \
    --request-timeout 60 --workers 1 --exclude-path '/v1/sandboxes/{id}/pty' \
    --exclude-path '/v1/sandboxes/{id}/pty/attach' \
    --exclude-path '/v1/images/pull' --exclude-path '/v1/images/import' \
    --exclude-path '/v1/images/build' \
    --exclude-path '/v1/events' \
    --exclude-operation-id writeTar --exclude-path-regex '^/v1/cluster' \
    --exclude-path-regex '/ports/'
