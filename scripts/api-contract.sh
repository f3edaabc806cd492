#!/usr/bin/env bash
# The API contract, checked by Schemathesis (PyPI) against a private node: requests generated
# from api/openapi.yaml (its examples, boundary cases and fuzzed input) go to a `warrend` of
# its own on a loopback port, and every answer must be no server error and have the content
# type, headers and body schema the spec says. Bounded in examples and time (MAX_TIME seconds,
# default 120); the seed is fixed, so a run is reproducible. Every sandbox the run made is
# deleted and the daemon stopped at the end.
#
# Usage: scripts/api-contract.sh [VENV]   (VENV: a Python venv to install Schemathesis in,
# default target/venv). Needs root and the release binaries (target/release or WARREN_BIN_DIR).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
VENV="${1:-$REPO/target/venv}"
BIN="${WARREN_BIN_DIR:-$REPO/target/release}"
MAX_TIME="${MAX_TIME:-120}"
SEED="${SCHEMATHESIS_SEED:-20261201}"
PORT="${API_CONTRACT_PORT:-18931}"
WORK=$(mktemp -d "${WARREN_TEST_DIR:-/tmp}/warren-api-contract.XXXXXX")
NODE="api$$"

if ! "$VENV/bin/python" -c 'import sys' > /dev/null 2>&1; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import schemathesis' 2> /dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check 'schemathesis>=4,<5'
fi

"$BIN/warrend" --socket "$WORK/warren.sock" --listen "127.0.0.1:$PORT" --state-dir "$WORK/state" \
    --node "$NODE" --agent "$BIN/warren-agent" --max-sandboxes 16 \
    --function-min-warm 0 --function-max-warm 1 > "$WORK/warrend.log" 2>&1 &
DAEMON=$!
cleanup() {
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

# The terminal route is a WebSocket upgrade, which Schemathesis does not speak. Tar bodies
# (directory uploads, image archives) have no generator. A pull would reach out to a public
# registry: the contract run talks to its own daemon on loopback only.
cd "$WORK"
"$VENV/bin/schemathesis" run "$REPO/api/openapi.yaml" --url "http://127.0.0.1:$PORT" \
    --checks not_a_server_error,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --phases examples,coverage,fuzzing --max-examples 50 --max-time "$MAX_TIME" --seed "$SEED" \
    --request-timeout 60 --workers 1 --exclude-path '/v1/sandboxes/{id}/pty' \
    --exclude-path '/v1/images/pull' --exclude-path '/v1/images/import' \
    --exclude-operation-id writeTar
