# shellcheck shell=bash
# Helpers shared by Warren's scripts. Source it: `. "$(dirname "$0")/lib.sh"`.

# Must run as root: sandboxes need namespaces, mounts and cgroups.
require_root() {
    if [[ "$(id -u)" != 0 ]]; then
        echo "$(basename "$0"): must run as root (try: sudo $0)" >&2
        exit 1
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
