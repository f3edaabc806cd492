#!/usr/bin/env bash
# Installs what only Warren's tests and benchmarks need, on top of a node (scripts/setup.sh).
# Idempotent; run as root. scripts/test.sh runs it in its setup phase.
#
#   scripts/setup-test.sh
#
# Baselines for the benchmarks (bwrap, crun, runc, podman), an OCI registry and an S3 emulator
# the image and blob store tests start on loopback, etcd for the cluster tests (they start their
# own members), a static busybox for minimal test images, the Python venv tooling of the SDK
# tests, headless Chromium for the dashboard tests, and cargo-nextest.
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh

log() { echo "setup-test: $*"; }

require_root
detect_os

TEST_PACKAGES=(
    bubblewrap crun runc podman         # baselines for bench-baselines.sh
    docker-registry                     # OCI registry on loopback for image import tests
    etcd-server etcd-client             # cluster tests start their own 3-member etcd
    busybox-static                      # minimal test rootfs and images without /etc/passwd
    python3-venv python3-pip            # Python SDK tests
    chromium                            # headless browser of the dashboard tests (tests/ui)
)
install_packages "${TEST_PACKAGES[@]}"

# The registry and etcd packages enable system services; the tests start their own on
# loopback ports, so keep the services off.
if command -v systemctl > /dev/null; then
    for svc in docker-registry etcd; do
        if systemctl is-enabled "$svc" > /dev/null 2>&1; then
            systemctl disable --now "$svc" > /dev/null 2>&1 || true
            log "disabled the $svc system service (tests run their own)"
        fi
    done
fi

use_cargo
if ! cargo nextest --version > /dev/null 2>&1; then
    log "installing cargo-nextest from crates.io (a few minutes)"
    cargo install --locked cargo-nextest
fi
log "$(cargo nextest --version 2> /dev/null | head -n 1)"

log "S3-compatible test server (moto) for the blob store tests"
if [[ ! -x /opt/warren-moto/bin/moto_server ]]; then
    python3 -m venv /opt/warren-moto
    /opt/warren-moto/bin/pip install --quiet 'moto[server]' \
        || log "warning: moto could not be installed; the S3 blob store test will skip"
fi

log "done"
