#!/usr/bin/env bash
# Measures how long other sandboxing tools take to run `true` on the same rootfs Warren uses, so
# `warren bench` numbers can be read side by side with them.
#
#   scripts/bench-baselines.sh ROOTFS [N]      (N iterations each, default 100; podman: min(N, 20))
#
# Prints one JSON object per line on stdout, progress on stderr:
#   {"name":"runc_run","runtime":"runc","n":100,"p50_ms":..,"p99_ms":..,"mean_ms":..,"min_ms":..,
#    "quantiles_ms":[..]}    (quantiles 0 %, 1 %, ..., 100 %: the CDF of `warren bench --report`)
# Baselines:
#   <rt>_run     `crun run` (or `runc run` where crun refuses this host's cgroups) of `true` in an
#                OCI bundle with ROOTFS as read-only root and new pid/net/ipc/uts/mount namespaces
#   <rt>_exec    `crun exec` / `runc exec` of `true` into a running container of the same bundle
#   podman_run   `podman run --rm --network none` of `true` on an image imported from ROOTFS
#                (cached as warren-baseline:latest)
#   bwrap        `bwrap --unshare-all --ro-bind ROOTFS / --proc /proc --dev /dev true`
# Each timing is the whole command as a process, measured from a Python timer, after one
# untimed warm-up run. A baseline that cannot run prints {"name":..,"error":..} instead; the
# script exits 1 only when no baseline could be measured.
set -euo pipefail

usage() { sed -n '2,19p' "$0" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
ROOTFS="$(realpath "$1")"
N="${2:-100}"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || usage
[[ -d "$ROOTFS" ]] || { echo "bench-baselines: $ROOTFS is not a directory" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "bench-baselines: must run as root" >&2; exit 2; }
for bin in true sleep; do
    [[ -x "$ROOTFS/usr/bin/$bin" || -x "$ROOTFS/bin/$bin" ]] || {
        echo "bench-baselines: $ROOTFS has no $bin" >&2; exit 2; }
done
PODMAN_N=$((N < 20 ? N : 20))

log() { echo "bench-baselines: $*" >&2; }

WORK="$(mktemp -d /tmp/bench-baselines.XXXXXX)"
TAG="bb$$"
RUNTIME=""
MEASURED=0
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    if [[ -n "$RUNTIME" ]]; then
        "$RUNTIME" kill "$TAG-exec" KILL > /dev/null 2>&1 || true
        "$RUNTIME" delete -f "$TAG-exec" > /dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# time_cmd NAME N EXTRA_JSON ARGV... : runs ARGV N times (plus a warm-up), "{i}" in an argument
# becomes the iteration number, and prints the JSON line. Fails on the first non-zero exit.
time_cmd() {
    python3 - "$@" <<'PY'
import json, math, subprocess, sys, time

name, n, extra, argv = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4:]

def run(i):
    args = [a.replace("{i}", str(i)) for a in argv]
    t0 = time.perf_counter_ns()
    p = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    dt = (time.perf_counter_ns() - t0) / 1e6
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()
        msg = f"exit {p.returncode}: " + (err[-1] if err else "")
        print(json.dumps({"name": name, **extra, "error": msg}, separators=(",", ":")))
        sys.exit(1)
    return dt

run("warmup")
samples = sorted(run(i) for i in range(n))

def pct(p):
    return samples[max(0, math.ceil(p / 100 * len(samples)) - 1)]

print(json.dumps({"name": name, **extra, "n": n,
                  "p50_ms": round(pct(50), 2), "p99_ms": round(pct(99), 2),
                  "mean_ms": round(sum(samples) / n, 2), "min_ms": round(samples[0], 2),
                  "quantiles_ms": [round(pct(i), 3) for i in range(101)]},
                 separators=(",", ":")))
PY
}

bench() {
    local name="$1"
    log "$name ..."
    if time_cmd "$@"; then
        MEASURED=$((MEASURED + 1))
    fi
}

# --- OCI bundle: ROOTFS read-only, new namespaces (network too: only loopback inside) ---------
make_bundle() {
    local dir="$1"; shift
    mkdir -p "$dir"
    python3 - "$dir/config.json" "$ROOTFS" "$@" <<'PY'
import json, sys
path, rootfs, args = sys.argv[1], sys.argv[2], sys.argv[3:]
caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
config = {
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "cwd": "/",
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "noNewPrivileges": True,
    },
    "root": {"path": rootfs, "readonly": True},
    "hostname": "baseline",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
    ],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                        "/proc/timer_list", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                          "/proc/sysrq-trigger"],
    },
}
json.dump(config, open(path, "w"), indent=1)
PY
}

make_bundle "$WORK/run" true
make_bundle "$WORK/exec" sleep infinity

# crun first; crun 1.8 refuses hybrid cgroup hosts, where runc works as is.
for rt in crun runc; do
    command -v "$rt" > /dev/null || continue
    if "$rt" run -b "$WORK/run" "$TAG-probe" < /dev/null > /dev/null 2> "$WORK/$rt.err"; then
        RUNTIME="$rt"
        break
    fi
    log "$rt cannot run containers here: $(tail -n 1 "$WORK/$rt.err")"
    "$rt" delete -f "$TAG-probe" > /dev/null 2>&1 || true
done

if [[ -z "$RUNTIME" ]]; then
    echo '{"name":"oci_run","error":"neither crun nor runc could run a container"}'
    echo '{"name":"oci_exec","error":"neither crun nor runc could run a container"}'
else
    log "OCI runtime: $RUNTIME"
    bench "${RUNTIME}_run" "$N" "{\"runtime\":\"$RUNTIME\"}" \
        "$RUNTIME" run -b "$WORK/run" "$TAG-run-{i}"

    if "$RUNTIME" run -d -b "$WORK/exec" "$TAG-exec" < /dev/null > /dev/null 2> "$WORK/exec.err"; then
        bench "${RUNTIME}_exec" "$N" "{\"runtime\":\"$RUNTIME\"}" \
            "$RUNTIME" exec "$TAG-exec" true
    else
        echo "{\"name\":\"${RUNTIME}_exec\",\"runtime\":\"$RUNTIME\",\"error\":\"could not start the container to exec into\"}"
        log "$(tail -n 1 "$WORK/exec.err")"
    fi
    "$RUNTIME" kill "$TAG-exec" KILL > /dev/null 2>&1 || true
    "$RUNTIME" delete -f "$TAG-exec" > /dev/null 2>&1 || true
fi

# --- podman ---------------------------------------------------------------------------------
IMAGE=warren-baseline:latest
if ! command -v podman > /dev/null; then
    echo '{"name":"podman_run","error":"podman is not installed"}'
else
    have="$(podman image inspect --format '{{index .Config.Labels "warren.baseline.rootfs"}}' \
        "$IMAGE" 2> /dev/null || true)"
    imported=1
    if [[ "$have" != "$ROOTFS" ]]; then
        log "importing $ROOTFS as podman image $IMAGE"
        if ! tar -C "$ROOTFS" --numeric-owner -cf - . |
            podman import --change "LABEL warren.baseline.rootfs=$ROOTFS" - "$IMAGE" > /dev/null; then
            echo '{"name":"podman_run","error":"podman import failed"}'
            imported=0
        fi
    fi
    # Debian's podman 4.3 cannot raise RLIMIT_NOFILE here: give explicit limits; crun is avoided
    # for the same hybrid-cgroup reason as above.
    if [[ "$imported" == 1 ]]; then
        bench podman_run "$PODMAN_N" '{"runtime":"runc"}' \
            podman run --rm --network none --runtime runc \
            --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$IMAGE" true
    fi
fi

# --- bubblewrap -----------------------------------------------------------------------------
if ! command -v bwrap > /dev/null; then
    echo '{"name":"bwrap","error":"bwrap is not installed"}'
else
    bench bwrap "$N" '{}' \
        bwrap --unshare-all --ro-bind "$ROOTFS" / --proc /proc --dev /dev true
fi

[[ "$MEASURED" -gt 0 ]]
