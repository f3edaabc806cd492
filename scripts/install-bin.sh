#!/usr/bin/env bash
# Puts `warren` (and `warren-bench`, which `warren bench` runs) where a user's shell finds
# them: symbolic links in /usr/local/bin (on the default PATH of every user and of sudo) to
# this build, so a rebuild needs no reinstall. `warren up` finds `warrend` beside the file the
# link names. scripts/up.sh runs it; scripts/install-service.sh copies the binaries instead.
#
# Usage: scripts/install-bin.sh [--from DIR] [--to DIR]
#   --from  the build's binaries (default target/release, or WARREN_BIN_DIR)
#   --to    where the links go (default /usr/local/bin)
set -euo pipefail

cd "$(dirname "$0")/.."
FROM="${WARREN_BIN_DIR:-$PWD/target/release}"
TO=/usr/local/bin
while [[ $# -gt 0 ]]; do
    case "$1" in
        --from) FROM="${2:?--from needs a directory}"; shift 2 ;;
        --to) TO="${2:?--to needs a directory}"; shift 2 ;;
        *) echo "install-bin: unknown argument $1 (use --from DIR --to DIR)" >&2; exit 2 ;;
    esac
done
FROM="$(cd "$FROM" && pwd)"
[[ -x "$FROM/warren" ]] || { echo "install-bin: $FROM/warren is missing: build first (cargo build --release)" >&2; exit 1; }
mkdir -p "$TO"
for b in warren warren-bench; do
    [[ -x "$FROM/$b" ]] || continue
    ln -sfn "$FROM/$b" "$TO/$b"
    echo "install-bin: $TO/$b -> $FROM/$b"
done
case ":${PATH:-}:" in
    *":$TO:"*) ;;
    *) echo "install-bin: $TO is not on this shell's PATH; add it: export PATH=$TO:\$PATH" ;;
esac
