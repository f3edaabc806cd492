#!/usr/bin/env bash
# Warren's whole test suite; CI runs it (.ci/run). Run as root (with sudo if not root) on a host
# scripts/setup.sh supports:
#
#   ./scripts/test.sh
#
# Phases: setup (node packages and rootfs: scripts/setup.sh; then what only tests need:
# scripts/setup-test.sh) -> build (every target of the workspace once, in the dev profile,
# with clippy linting it as it compiles, and the static sandbox agent) -> image (register
# `default`) -> fmt -> clippy (the lints the build found) -> nextest -> fuzz (the E2B fuzz
# targets, seconds each: scripts/fuzz-smoke.sh) -> python SDK -> API
# contract (Schemathesis against a private node) -> leak check. A failure in the first three
# stops the run; the others all run and are reported together. Exits non-zero when any phase
# failed.
#
# The suite drives the dev-profile daemon, CLI and gateway (dependencies optimised, see
# Cargo.toml) and the release agent: one compile of the workspace instead of two (a release
# build of every binary took as long as the tests' build). `scripts/up.sh` and the benchmarks
# use release builds.
#
# Environment: WARREN_IMAGE_STORE (default /var/lib/warren/images), WARREN_CACHE (rootfs cache).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh
require_root
use_cargo

REPO="$PWD"
export WARREN_BIN_DIR="$REPO/target/debug"
export WARREN_BIN="$WARREN_BIN_DIR/warren"
export WARREN_IMAGE_STORE="${WARREN_IMAGE_STORE:-/var/lib/warren/images}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# A whole-suite build from scratch gains nothing from incremental state, which would add
# gigabytes to target/.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
TEST_ROOT="$(test_root)"

START=$SECONDS
PHASES=() RESULTS=() TIMES=()
FAILED=()

clock() { local s=$((SECONDS - START)); printf '%d:%02d' $((s / 60)) $((s % 60)); }

# phase NAME CMD... : runs one phase with a header, records ok/FAILED and its duration.
phase() {
    local name="$1"; shift
    local t0=$SECONDS rc=0
    echo
    echo "==> [$(clock)] $name: $*"
    "$@" || rc=$?
    local dt=$((SECONDS - t0))
    PHASES+=("$name") TIMES+=("$dt")
    if [[ $rc -eq 0 ]]; then
        RESULTS+=(ok)
        echo "==> [$(clock)] $name: ok (${dt}s)"
    else
        RESULTS+=("FAILED (exit $rc)")
        FAILED+=("$name")
        echo "==> [$(clock)] $name: FAILED with exit $rc (${dt}s)"
    fi
    return $rc
}

skip() {
    PHASES+=("$1") TIMES+=(0) RESULTS+=("skipped: $2")
}

summary() {
    echo
    echo "==> [$(clock)] summary"
    local i
    for i in "${!PHASES[@]}"; do
        printf '  %-8s %5ss  %s\n' "${PHASES[$i]}" "${TIMES[$i]}" "${RESULTS[$i]}"
    done
    if [[ ${#FAILED[@]} -eq 0 ]]; then
        echo "test.sh: OK in $(clock)"
    else
        echo "test.sh: FAILED (${FAILED[*]}) in $(clock)"
    fi
}

# The run starts from an empty test root: the files earlier runs kept for their failed tests
# (a VM test's daemon directory holds its templates, hundreds of MiB) would otherwise pile up
# run after run. The VM image cache stays; nothing is removed across a mount.
prune_test_root() {
    local entry
    [[ -d "$TEST_ROOT" ]] || return 0
    # Only a directory of Warren's own (as the default is): a WARREN_TEST_DIR pointed at a
    # shared directory is left alone.
    if [[ "$(basename "$TEST_ROOT")" != *warren* ]]; then
        echo "test.sh: not emptying $TEST_ROOT (its name does not say warren)"
        return 0
    fi
    while IFS= read -r entry; do
        if awk -v p="$entry" '$5 == p || index($5, p "/") == 1 { found = 1 } END { exit !found }' \
            /proc/self/mountinfo; then
            echo "test.sh: $entry has mounts; left for the leak check"
            continue
        fi
        rm -rf --one-file-system "$entry"
    done < <(test_root_leftovers --runs)
}
prune_test_root
# The free space the run starts with (the test root may not exist yet on a fresh machine).
mkdir -p "$TEST_ROOT"
df -h "$REPO" "$TEST_ROOT" 2> /dev/null | awk 'NR == 1 || !seen[$1]++' || true

# Everything Warren-owned that exists before the run is reported, not failed, by the leak check.
mkdir -p target
LEAK_BASELINE="$REPO/target/leak-baseline.txt"
scripts/check-leaks.sh --snapshot "$LEAK_BASELINE"

# Background work: what needs little of the CPU the foreground phase is using (downloads, a
# compile at the lowest priority) runs beside it. `bg_start NAME FN...` runs FN niced, its output
# in target/bg-NAME.log; `bg_wait NAME` waits for it, prints that output and returns its status.
declare -A BG_PID=()
bg_start() {
    local name="$1"; shift
    ( renice -n "${BG_NICE:-19}" -p "$BASHPID" > /dev/null; "$@" ) > "$REPO/target/bg-$name.log" 2>&1 &
    BG_PID[$name]=$!
}
bg_wait() {
    local name="$1" rc=0
    [[ -n "${BG_PID[$name]:-}" ]] || { echo "$name: never started"; return 1; }
    wait "${BG_PID[$name]}" || rc=$?
    unset "BG_PID[$name]"
    cat "$REPO/target/bg-$name.log"
    return $rc
}
# A run that stops early takes its background work with it.
bg_kill() {
    local pid
    for pid in "${BG_PID[@]}"; do
        pkill -TERM -P "$pid" 2> /dev/null || true
        kill "$pid" 2> /dev/null || true
    done
}
trap bg_kill EXIT

# True when the venv VENV has a CPython >= 3.12 (what Harbor needs).
harbor_venv_ok() {
    "$1/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))' > /dev/null 2>&1
}

# The Python packages the SDK's tests and the API contract need (pinned), downloaded and
# installed in the background from the start of the build: the two Python phases then run
# side by side and neither installs anything.
python_env() {
    local sdk="$REPO/sdk/python" venv="$REPO/target/venv"
    if ! "$venv/bin/python" -c 'import sys' > /dev/null 2>&1; then
        rm -rf "$venv"
        python3 -m venv "$venv" || return 1
    fi
    # The SDK with its test tools and the harness adapters' upstream packages, pinned.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$sdk/constraints.txt" -e "${sdk}[test,minisweagent]" || return 1
    # Harbor needs Python >= 3.12: its adapter's test runs trials in a venv of its own.
    local py312 hvenv="$REPO/target/venv-harbor"
    if py312="$(find_python_312)"; then
        if ! harbor_venv_ok "$hvenv"; then
            rm -rf "$hvenv"
            "$py312" -m venv "$hvenv" || return 1
        fi
        "$hvenv/bin/python" -m pip install --quiet --disable-pip-version-check \
            -c "$sdk/constraints.txt" -e "${sdk}[harbor]" || return 1
    elif [[ "${CI:-}" == true ]]; then
        echo "python: no CPython >= 3.12 found (pyenv versions, python3.12, python3.13): Harbor's test cannot run"
        return 1
    else
        echo "python: no CPython >= 3.12 found; Harbor's test will be skipped"
    fi
    if ! "$venv/bin/python" -c 'import pytest' 2> /dev/null; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check pytest || return 1
    fi
    scripts/api-contract.sh --install-only "$venv"
}

# Runs inside `phase`, where errexit is off: every step checks its own status.
python_sdk_tests() {
    local sdk="$REPO/sdk/python" venv="$REPO/target/venv" hvenv="$REPO/target/venv-harbor"
    # Harbor's venv, where python_env could make one (>= 3.12).
    if harbor_venv_ok "$hvenv"; then
        export WARREN_HARBOR_PYTHON="$hvenv/bin/python"
    fi
    local rc=0
    (cd "$sdk" && "$venv/bin/python" -m pytest tests) || rc=$?
    if [[ $rc -eq 5 ]]; then
        # pytest's "no tests collected": wrong when there are test files, fine when there are none.
        if find "$sdk/tests" -name 'test_*.py' -o -name '*_test.py' | grep -q .; then
            echo "python: test files exist in $sdk/tests but pytest collected none"
            return 1
        fi
        echo "python: no test files in $sdk/tests yet"
        return 0
    fi
    return $rc
}

# Clippy lints every target of the workspace while the dev-profile build the tests run from
# is compiled: clippy-driver is the workspace's rustc wrapper (what `cargo clippy` sets up over
# a check build), so each dependency is compiled once, for the tests, instead of once more as
# check metadata. A warning of a workspace crate fails the clippy phase, as `-D warnings`
# would (the dependencies' lints are capped), without stopping the tests from building and
# running; a compile error fails the build.
with_clippy() {
    RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)" "$@"
}

CLIPPY_JSON="$REPO/target/clippy.json"

# The build phase: every target in the dev profile (clippy's messages kept for the clippy
# phase), then the agent as a static musl program in place of target/debug/warren-agent.
build_all() {
    command -v clippy-driver > /dev/null || { echo "build: clippy-driver not found"; return 1; }
    local rc=0
    with_clippy cargo build --workspace --all-targets \
        --message-format=json-diagnostic-rendered-ansi > "$CLIPPY_JSON" || rc=$?
    if [[ $rc -ne 0 ]]; then
        # What failed to compile, readable.
        python3 - "$CLIPPY_JSON" << 'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-message" and m["message"].get("level") == "error":
        sys.stdout.write(m["message"].get("rendered") or m["message"].get("message", "") + "\n")
PY
        return $rc
    fi
    build_static_agent debug
}

clippy_report() {
    local rc=0
    python3 - "$CLIPPY_JSON" << 'PY' || rc=1
import json, sys
found, seen = False, set()
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-message":
        continue
    msg = m["message"]
    text = msg.get("rendered") or msg.get("message", "") + "\n"
    # A target built twice (a lib and its unit tests) reports the same lint twice.
    if msg.get("level") in ("warning", "error") and text not in seen:
        seen.add(text)
        found |= msg.get("level") == "warning"
        sys.stdout.write(text)
if found:
    print("clippy: the workspace has warnings (denied, as by -D warnings)")
    sys.exit(1)
PY
    return $rc
}

finish() {
    summary
    [[ ${#FAILED[@]} -eq 0 ]]
}

setup_all() { scripts/setup.sh && scripts/setup-test.sh; }
if ! phase setup setup_all; then
    skip build "setup failed"; finish; exit 1
fi
HAVE_PY_TESTS=false
[[ -d sdk/python/tests ]] && HAVE_PY_TESTS=true
$HAVE_PY_TESTS && bg_start python-env python_env
if ! phase build build_all; then
    skip image "build failed"; finish; exit 1
fi
if ! phase image scripts/build-default-image.sh; then
    finish; exit 1
fi
phase fmt cargo fmt --all -- --check || true
phase clippy clippy_report || true
# The E2B protocol's fuzz targets are compiled (their own build in target/fuzz, with coverage
# instrumentation) in the background while the tests run, at the lowest priority, and run
# a few seconds each after them.
bg_start fuzz-build scripts/fuzz-smoke.sh --build-only
# The build phase has built the tests (same wrapper, so nothing is compiled again here).
phase nextest with_clippy cargo nextest run --workspace --no-fail-fast || true
fuzz_all() { bg_wait fuzz-build && scripts/fuzz-smoke.sh; }
phase fuzz fuzz_all || true
# The Python SDK's tests and the API contract (each with daemons of its own, their own
# address pools and ports) run side by side once their packages are installed.
if ! $HAVE_PY_TESTS; then
    skip python "no sdk/python/tests"
    phase api-contract scripts/api-contract.sh "$REPO/target/venv" || true
elif phase python-env bg_wait python-env; then
    BG_NICE=0 bg_start api-contract scripts/api-contract.sh "$REPO/target/venv"
    phase python python_sdk_tests || true
    phase api-contract bg_wait api-contract || true
else
    skip python "its packages did not install"
    skip api-contract "its packages did not install"
fi
phase leaks scripts/check-leaks.sh --baseline "$LEAK_BASELINE" || true

finish
