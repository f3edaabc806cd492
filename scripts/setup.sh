#!/usr/bin/env bash
# Prepares a machine to build and run a Warren node. Idempotent; run as root.
#
#   scripts/setup.sh
#
# Supported: Debian 12 and 13, Ubuntu 22.04 and 24.04 (others get a message saying what to
# install). What only the tests and benchmarks need (podman, runc, crun, bwrap, a registry, etcd,
# an S3 emulator, a test rootfs) is installed by scripts/setup-test.sh, which scripts/test.sh runs.
#
# 1. Installs the Debian packages a node needs (apt is skipped when all are already installed).
# 2. Checks the Rust toolchain (cargo, rustfmt, clippy).
# 3. Builds the default image's rootfs once (scripts/build-default-image.sh --rootfs-only).
# 4. QEMU 10 and the guest kernel of the microvm and vm substrates: from bookworm-backports on
#    Debian 12, from the main archive on Debian 13; on Ubuntu, whose QEMU is older, VMs are
#    left out (the daemon serves containers and says why).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh

log() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

require_root
detect_os
log "host: $OS_ID $OS_VERSION${OS_CODENAME:+ ($OS_CODENAME)}"

# What a node needs to build and run Warren. Test-only packages live in scripts/setup-test.sh.
PACKAGES=(
    build-essential pkg-config          # Rust crates that build C
    erofs-utils                         # mkfs.erofs for image layers
    e2fsprogs                           # mkfs.ext4 for VM disks
    btrfs-progs                         # mkfs.btrfs for the writable-layer file system
    debootstrap                         # the default image's rootfs
    nftables iproute2                   # sandbox networking
    procps psmisc util-linux            # pgrep, fuser, mount, flock, nsenter
    curl ca-certificates                # health checks against the daemon socket
    fuse3                               # fusermount3 for lazily loaded layers
    apparmor                            # apparmor_parser checks the generated profile
    protobuf-compiler libprotobuf-dev   # protoc and its well-known types for the etcd-client crate
    systemd                             # systemd-analyze verifies the units in deploy/systemd
)
# Ubuntu's debootstrap needs Debian's archive keys for the default image (Debian bookworm).
if [[ "$OS_ID" == ubuntu ]]; then
    PACKAGES+=(debian-archive-keyring)
fi

install_packages "${PACKAGES[@]}"

# Rust: the toolchain comes with the machine (rustup); make sure it is on PATH and complete.
use_cargo
log "$(cargo --version)"
cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"
# The sandbox agent is built as a static musl program (see build_release in lib.sh).
if command -v rustup > /dev/null; then
    if ! has_agent_target; then
        log "adding the Rust target $(agent_target) (the static sandbox agent)"
        rustup target add "$(agent_target)" || log "cannot add $(agent_target): the agent will be linked with glibc"
    fi
else
    log "no rustup: the sandbox agent will be linked with glibc (about 1 ms more CPU per sandbox start)"
fi

# QEMU 10 (snapshots with mapped-ram): bookworm-backports on Debian 12, the main archive on
# Debian 13. Ubuntu's QEMU is older and its archive has no Debian cloud kernel: no VMs there.
install_qemu_debian() {
    local suite_args=()
    if [[ "$OS_VERSION" == 12 ]]; then
        local backports=/etc/apt/sources.list.d/debian-backports.sources uri
        if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
            uri="$(awk '/^URIs:/ && /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
            [[ -n "$uri" ]] || uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
            [[ -n "$uri" ]] || uri=http://deb.debian.org/debian
            log "adding bookworm-backports ($uri)"
            printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                "$uri" > "$backports"
            apt-get -o DPkg::Lock::Timeout=600 update -q
        fi
        suite_args=(-t bookworm-backports)
    fi
    local qemu_version
    qemu_version="$(dpkg-query -W -f='${db:Status-Status} ${Version}' qemu-system-x86 2>/dev/null || true)"
    if [[ ! "$qemu_version" =~ ^installed\ 1:1[0-9]\. ]]; then
        log "installing qemu-system-x86 (10.x)${suite_args[*]:+ from ${suite_args[1]}}"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
            --no-install-recommends "${suite_args[@]}" qemu-system-x86 qemu-utils
    fi
    log "$(qemu-system-x86_64 --version | head -n 1)"
    log "guest kernel for VMs"
    scripts/build-guest.sh
}

if [[ "$OS_ID" == debian ]]; then
    install_qemu_debian
else
    log "no microvm/vm substrates on $OS_ID $OS_VERSION (QEMU 10 and Debian's cloud kernel are needed); containers only"
fi

log "default image rootfs"
scripts/build-default-image.sh --rootfs-only

log "swap for paused sandboxes"
scripts/setup-swap.sh

log "done"
