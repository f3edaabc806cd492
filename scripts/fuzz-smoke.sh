#!/usr/bin/env bash
# A bounded libFuzzer run of the fuzz targets of E2B's protocol (fuzz/README.md): `e2b_route`
# (where a request to an `--e2b` server goes) and `envd_frames` (envd's Connect envelopes and
# messages), each for FUZZ_SECS seconds (default 6) from its seeds, with coverage feedback.
# A crash fails the run and prints the input that made it (hex), kept under target/fuzz/.
#
# No cargo-fuzz: the targets are built by cargo with the stable codegen flags cargo-fuzz uses
# without a sanitizer (`-Cpasses=sancov-module` and the coverage options), into a target
# directory of their own (target/fuzz), and only with the crates they need (`--features e2b`),
# so an unchanged tree rebuilds nothing. libFuzzer (C++, from the libfuzzer-sys crate) needs
# a C++ compiler. The seeds in fuzz/seeds are copied: the run's new corpus entries stay in a
# temporary directory.
#
# Usage: scripts/fuzz-smoke.sh [--build-only] [TARGET...]   (default: e2b_route envd_frames)
#   --build-only: compile the targets and stop (the suite builds them in the background while
#   its tests run, then runs them in its fuzz phase).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
SECS="${FUZZ_SECS:-6}"
BUILD_ONLY=false
if [[ "${1:-}" == --build-only ]]; then
    BUILD_ONLY=true
    shift
fi
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(e2b_route envd_frames)
OUT="$REPO/target/fuzz"
mkdir -p "$OUT/artifacts"

# What the build needs, said plainly (a failure, also outside CI: the suite calls this only
# where scripts/setup.sh installed build-essential).
command -v cargo > /dev/null || { echo "fuzz: cargo is not on PATH" >&2; exit 1; }
command -v c++ > /dev/null ||
    { echo "fuzz: no C++ compiler for libFuzzer (build-essential, scripts/setup.sh)" >&2; exit 1; }

export CARGO_TARGET_DIR="$OUT"
# What cargo-fuzz passes with `-s none` (coverage counters, comparison tracing, `cfg(fuzzing)`),
# on an optimized build with overflow checks and debug assertions.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions \
-Coverflow-checks -Copt-level=1"
# With an explicit --target the flags reach only the targets' crates, not build scripts and
# procedural macros (which run on the host without libFuzzer).
HOST=$(rustc -vV | sed -n 's/^host: //p')
bins=()
for t in "${TARGETS[@]}"; do bins+=(--bin "$t"); done
cargo build --quiet --locked --manifest-path fuzz/Cargo.toml --no-default-features \
    --features e2b --target "$HOST" "${bins[@]}"
if $BUILD_ONLY; then
    exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rc=0
for t in "${TARGETS[@]}"; do
    mkdir -p "$WORK/$t"
    cp -r "fuzz/seeds/$t/." "$WORK/$t/"
    echo "fuzz: $t for ${SECS}s"
    # Bounded even if libFuzzer's own clock did not stop it (-max_total_time).
    if ! timeout --kill-after=10 "$((SECS * 2 + 60))" "$OUT/$HOST/debug/$t" "$WORK/$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$OUT/artifacts/$t-" -print_final_stats=1 > "$WORK/$t.log" 2>&1; then
        rc=1
        tail -40 "$WORK/$t.log"
        for a in "$OUT/artifacts/$t-"*; do
            [[ -f "$a" ]] || continue
            echo "fuzz: $t: input $a:"
            od -A x -t x1z "$a" | head -20
        done
    else
        grep -E "stat::number_of_executed_units|stat::new_units_added" "$WORK/$t.log" |
            sed "s/^/fuzz: $t: /"
    fi
done
exit $rc
