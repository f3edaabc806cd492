#!/usr/bin/env bash
# Prepares a Debian 12 machine to build, run and test Warren. Idempotent; run as root.
#
#   scripts/setup.sh
#
# 1. Installs the Debian packages Warren needs (apt is skipped when all are already installed).
# 2. Checks the Rust toolchain (cargo, rustfmt, clippy) and installs cargo-nextest if missing.
# 3. Builds the default image's rootfs once (scripts/build-default-image.sh --rootfs-only).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh

log() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

require_root

PACKAGES=(
    build-essential pkg-config          # Rust crates that build C
    erofs-utils                         # mkfs.erofs for image layers
    debootstrap                         # the default image's rootfs
    bubblewrap crun runc podman         # baselines for bench-baselines.sh
    nftables iproute2                   # sandbox networking
    busybox-static                      # minimal test rootfs
    procps psmisc util-linux            # pgrep, fuser, mount, flock, nsenter
    python3-venv python3-pip            # Python SDK and its tests
    curl ca-certificates                # health checks against the daemon socket
    apparmor                            # apparmor_parser checks the generated profile
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
    [[ "$status" == installed ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    log "all ${#PACKAGES[@]} Debian packages are installed"
else
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A machine that never ran `apt-get update` has no package lists at all.
    if ! apt-get install -y --no-install-recommends "${missing[@]}"; then
        log "install failed; refreshing package lists and retrying"
        apt-get update
        apt-get install -y --no-install-recommends "${missing[@]}"
    fi
fi

# Rust: the toolchain comes with the machine (rustup); make sure it is on PATH and complete.
use_cargo
log "$(cargo --version)"
cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"
if ! cargo nextest --version >/dev/null 2>&1; then
    log "installing cargo-nextest from crates.io (a few minutes)"
    cargo install --locked cargo-nextest
fi
log "$(cargo nextest --version 2>/dev/null | head -n 1)"

log "default image rootfs"
scripts/build-default-image.sh --rootfs-only

log "swap for paused sandboxes"
scripts/setup-swap.sh

log "done"
