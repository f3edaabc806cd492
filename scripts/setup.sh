#!/usr/bin/env bash
# Prepares a Debian 12 machine to build, run and test Warren. Idempotent; run as root.
#
#   scripts/setup.sh
#
# 1. Installs the Debian packages Warren needs (apt is skipped when all are already installed).
# 2. Checks the Rust toolchain (cargo, rustfmt, clippy) and installs cargo-nextest if missing.
# 3. Builds the default image's rootfs once (scripts/build-default-image.sh --rootfs-only).
# 4. Adds Debian bookworm-backports, installs QEMU 10 from it and fetches the guest kernel of
#    the microvm and vm substrates (scripts/build-guest.sh).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh

log() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

require_root

PACKAGES=(
    build-essential pkg-config          # Rust crates that build C
    erofs-utils                         # mkfs.erofs for image layers
    docker-registry                     # OCI registry on loopback for image import tests
    e2fsprogs                           # mkfs.ext4 for VM disks
    debootstrap                         # the default image's rootfs
    bubblewrap crun runc podman         # baselines for bench-baselines.sh
    nftables iproute2                   # sandbox networking
    busybox-static                      # minimal test rootfs
    procps psmisc util-linux            # pgrep, fuser, mount, flock, nsenter
    python3-venv python3-pip            # Python SDK and its tests
    curl ca-certificates                # health checks against the daemon socket
    fuse3                               # fusermount3 for lazily loaded layers
    apparmor                            # apparmor_parser checks the generated profile
    etcd-server etcd-client             # cluster membership; tests start their own 3-member etcd
    protobuf-compiler libprotobuf-dev   # protoc and its well-known types for the etcd-client crate
    systemd                             # systemd-analyze verifies the units in deploy/systemd
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

# The registry package enables a system service on :5000; the tests start their own on a
# loopback port, so keep the service off.
if command -v systemctl >/dev/null && systemctl is-enabled docker-registry >/dev/null 2>&1; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
    log "disabled the docker-registry system service (tests run their own)"
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

# QEMU 10 (snapshots with mapped-ram) is in bookworm-backports, not in the default sources.
BACKPORTS=/etc/apt/sources.list.d/debian-backports.sources
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    uri="$(awk '/^URIs:/ && /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    [[ -n "$uri" ]] || uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    [[ -n "$uri" ]] || uri=http://deb.debian.org/debian
    log "adding bookworm-backports ($uri)"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" > "$BACKPORTS"
    apt-get -o DPkg::Lock::Timeout=600 update -q
fi
qemu_version="$(dpkg-query -W -f='${db:Status-Status} ${Version}' qemu-system-x86 2>/dev/null || true)"
if [[ ! "$qemu_version" =~ ^installed\ 1:1[0-9]\. ]]; then
    log "installing qemu-system-x86 (10.x) from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
        --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils
fi
log "$(qemu-system-x86_64 --version | head -n 1)"

log "guest kernel for VMs"
scripts/build-guest.sh

log "default image rootfs"
scripts/build-default-image.sh --rootfs-only

log "S3-compatible test server (moto) for the blob store tests"
if [[ ! -x /opt/warren-moto/bin/moto_server ]]; then
    python3 -m venv /opt/warren-moto
    /opt/warren-moto/bin/pip install --quiet 'moto[server]' \
        || log "warning: moto could not be installed; the S3 blob store test will skip"
fi

log "swap for paused sandboxes"
scripts/setup-swap.sh

log "done"
