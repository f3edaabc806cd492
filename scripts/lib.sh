# shellcheck shell=bash
# Helpers shared by Warren's scripts. Source it: `. "$(dirname "$0")/lib.sh"`.

# Must run as root: sandboxes need namespaces, mounts and cgroups. Root needs no sudo (a fresh
# Debian may not have it); others are told how.
require_root() {
    if [[ "$(id -u)" != 0 ]]; then
        echo "$(basename "$0"): must run as root (as root: $0; otherwise: sudo $0)" >&2
        exit 1
    fi
}

# Sets OS_ID, OS_VERSION and OS_CODENAME from /etc/os-release and refuses hosts Warren's
# scripts do not know, saying what is supported and what to do.
SUPPORTED_HOSTS="Debian 12 (bookworm), Debian 13 (trixie), Ubuntu 22.04 (jammy), Ubuntu 24.04 (noble)"
detect_os() {
    local file="${OS_RELEASE_FILE:-/etc/os-release}"
    OS_ID="" OS_VERSION="" OS_CODENAME=""
    if [[ -r "$file" ]]; then
        OS_ID="$(. "$file"; echo "${ID:-}")"
        OS_VERSION="$(. "$file"; echo "${VERSION_ID:-}")"
        OS_CODENAME="$(. "$file"; echo "${VERSION_CODENAME:-}")"
    fi
    case "$OS_ID:$OS_VERSION" in
        debian:12 | debian:13 | ubuntu:22.04 | ubuntu:24.04) return 0 ;;
    esac
    cat >&2 << EOT
$(basename "$0"): this host is ${OS_ID:-unknown} ${OS_VERSION:-?} (from $file).
Supported: $SUPPORTED_HOSTS.
On another distribution, install by hand what scripts/setup.sh lists (a Rust toolchain 1.80+,
erofs-utils, e2fsprogs, btrfs-progs, debootstrap, nftables, iproute2, fuse3, curl, protobuf-compiler; QEMU 10
for VMs), then build with \`cargo build --release\` and start target/release/warrend.
Set WARREN_ANY_OS=1 to run this script anyway.
EOT
    [[ -n "${WARREN_ANY_OS:-}" ]] && return 0
    exit 1
}

# Installs the Debian packages named (those not installed yet), refreshing the package lists
# once when an install fails (a machine that never ran `apt-get update` has none).
install_packages() {
    local missing=() pkg status
    for pkg in "$@"; do
        status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
        [[ "$status" == installed ]] || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "$(basename "$0"): all $# packages are installed"
        return 0
    fi
    echo "$(basename "$0"): installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"; then
        echo "$(basename "$0"): install failed; refreshing package lists and retrying"
        apt-get -o DPkg::Lock::Timeout=600 update
        apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
    fi
}

# Puts a rustup-installed cargo on PATH when it is not there already, e.g. under sudo, whose PATH
# leaves out ~/.cargo/bin. Looks in root's home, then in the invoking user's home.
use_cargo() {
    # sudo's secure_path and minimal environments may leave out /usr/local/bin (cargo-nextest).
    [[ ":$PATH:" == *:/usr/local/bin:* ]] || export PATH="$PATH:/usr/local/bin"
    command -v cargo > /dev/null && return 0
    local home
    for home in "$HOME" "$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)"; do
        if [[ -n "$home" && -x "$home/.cargo/bin/cargo" ]]; then
            export PATH="$home/.cargo/bin:$PATH"
            [[ -n "${RUSTUP_HOME:-}" || ! -d "$home/.rustup" ]] || export RUSTUP_HOME="$home/.rustup"
            [[ -n "${CARGO_HOME:-}" ]] || export CARGO_HOME="$home/.cargo"
            return 0
        fi
    done
    echo "$(basename "$0"): cargo not found: install a Rust toolchain (1.80 or newer)" >&2
    exit 1
}

# The Rust target of the sandbox agent: a static musl program for this machine's architecture.
agent_target() { echo "$(uname -m)-unknown-linux-musl"; }

# Whether rustup has the agent's target installed.
has_agent_target() { rustup target list --installed 2>/dev/null | grep -qx "$(agent_target)"; }

# `cargo build --release "$@"`, then the sandbox agent again as a static musl program in place
# of target/release/warren-agent. The agent is started once per sandbox: static, it reaches
# main in ~0.3 ms of CPU instead of ~1.5 ms with glibc's loader and CPU probe (on a VM).
# Without the musl target (no rustup) the glibc agent stays, with a message; a musl build that
# fails to compile fails. A later plain `cargo build --release` puts the glibc agent back.
build_release() {
    cargo build --release "$@" || return 1
    build_static_agent release
}

# build_static_agent PROFILE_DIR: the release agent as a static musl program in place of
# target/PROFILE_DIR/warren-agent (`release`, or `debug` for the test suite, which drives
# dev-profile daemons with the release agent).
build_static_agent() {
    local t dir="${CARGO_TARGET_DIR:-target}" into="$1"
    t="$(agent_target)"
    if ! has_agent_target; then
        echo "$(basename "$0"): no Rust target $t (rustup target add $t): the sandbox agent stays linked with glibc" >&2
        return 0
    fi
    cargo build --release --target "$t" -p warren-agent || return 1
    # A new file renamed over the old one: cargo's own copy (a hard link) is left as it is.
    cp "$dir/$t/release/warren-agent" "$dir/$into/.warren-agent.static"
    mv -f "$dir/$into/.warren-agent.static" "$dir/$into/warren-agent"
    echo "$(basename "$0"): $dir/$into/warren-agent: static ($t)"
}

# The test harness's directory (WARREN_TEST_DIR, default /tmp/warren-tests).
test_root() {
    echo "${WARREN_TEST_DIR:-/tmp/warren-tests}"
}

# Prints what earlier test runs left in the test root, one path per line: everything but the
# run registry (runs/ itself), the VM image cache (vm-runtime/) and the VM directory test daemons
# share (vm-shared/: templates), which stay by design; with
# --runs, the registry's entries too.
test_root_leftovers() {
    local root entry
    root="$(test_root)"
    [[ -d "$root" ]] || return 0
    for entry in "$root"/* ${1:+"$root"/runs/*}; do
        [[ -e "$entry" ]] || continue
        case "$entry" in "$root/runs" | "$root/vm-runtime" | "$root/vm-shared") continue ;; esac
        echo "$entry"
    done
}

# find_python_312: prints a CPython interpreter of version 3.12 or newer, or fails. Harbor
# needs one and Debian 12's python3 is 3.11; machines of this kind have pyenv builds (called
# by their full path: pyenv's shims fail unless a version is selected).
find_python_312() {
    local c root
    local -a cands=(python3.13 python3.12 python3)
    root="$(pyenv root 2> /dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
    for c in "$root"/versions/3.1[2-9]*/bin/python3 "$root"/versions/3.[2-9][0-9]*/bin/python3; do
        [[ -x "$c" ]] && cands+=("$c")
    done
    for c in "${cands[@]}"; do
        if "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2> /dev/null; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}
