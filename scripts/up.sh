#!/usr/bin/env bash
# From a fresh machine (Debian 12/13, Ubuntu 22.04/24.04) to a running Warren node and a demo
# rollout, as root (with sudo if not root):
#
#   ./scripts/up.sh                       # warrend in the background, log in a file
#   ./scripts/up.sh --service [--group G] # warrend as a systemd service (scripts/install-service.sh)
#
# Installs what a node needs (scripts/setup.sh), builds, links `warren` into /usr/local/bin
# (scripts/install-bin.sh), registers the default image, installs
# the example network configuration (docs/examples/network.toml -> /etc/warren/network.toml,
# unless there is one), starts warrend unless one already answers on the socket, waits for it
# to be healthy and runs `warren demo`.
#
# Environment: WARREN_SOCKET (default /run/warren/warren.sock), WARREN_IMAGE_STORE
# (default /var/lib/warren/images), WARREN_LOG (default /var/log/warren/warrend.log).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh
require_root
use_cargo

export WARREN_SOCKET="${WARREN_SOCKET:-/run/warren/warren.sock}"
export WARREN_IMAGE_STORE="${WARREN_IMAGE_STORE:-/var/lib/warren/images}"
export WARREN_BIN="$PWD/target/release/warren"
LOG="${WARREN_LOG:-/var/log/warren/warrend.log}"
PIDFILE="$(dirname "$WARREN_SOCKET")/warrend.pid"

log() { echo "up: $*"; }

SERVICE=0 GROUP_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --service) SERVICE=1; shift ;;
        --group) GROUP_ARGS=(--group "${2:?--group needs a name}"); shift 2 ;;
        *) echo "up: unknown argument $1 (use --service [--group NAME])" >&2; exit 2 ;;
    esac
done
NET_CONFIG=/etc/warren/network.toml

healthy() {
    if command -v curl > /dev/null; then
        curl -fsS --max-time 2 --unix-socket "$WARREN_SOCKET" http://warren/v1/health > /dev/null 2>&1
    else
        "$WARREN_BIN" health > /dev/null 2>&1
    fi
}

log "setup"
scripts/setup.sh

log "cargo build --release"
build_release

log "warren on the PATH"
scripts/install-bin.sh

log "default image"
scripts/build-default-image.sh

if [[ ! -e "$NET_CONFIG" ]]; then
    log "network configuration: docs/examples/network.toml -> $NET_CONFIG"
    install -D -m 644 docs/examples/network.toml "$NET_CONFIG"
fi

if [[ $SERVICE -eq 1 ]]; then
    scripts/install-service.sh "${GROUP_ARGS[@]}"
fi

STOP_HINT="the daemon answering on $WARREN_SOCKET was already running"
if [[ -S "$WARREN_SOCKET" ]] && healthy; then
    log "reusing the warrend already answering on $WARREN_SOCKET"
else
    mkdir -p "$(dirname "$LOG")" "$(dirname "$WARREN_SOCKET")"
    log "starting warrend (socket $WARREN_SOCKET, log $LOG)"
    setsid target/release/warrend --network-config "$NET_CONFIG" < /dev/null >> "$LOG" 2>&1 &
    pid=$!
    echo "$pid" > "$PIDFILE"
    for _ in $(seq 1 100); do
        healthy && break
        if ! kill -0 "$pid" 2> /dev/null; then
            echo "up: warrend exited during start-up; last lines of $LOG:" >&2
            tail -n 30 "$LOG" >&2
            exit 1
        fi
        sleep 0.2
    done
    if ! healthy; then
        echo "up: warrend (pid $pid) did not answer on $WARREN_SOCKET within 20 s; see $LOG" >&2
        exit 1
    fi
    log "warrend is up (pid $pid)"
    STOP_HINT="stop it with: kill \$(cat $PIDFILE)"
fi

log "warren demo"
target/release/warren demo

echo
log "warrend keeps running (log $LOG); $STOP_HINT"
log "next: warren health; warren create (see README.md, CLI)"
