#!/usr/bin/env bash
# Fails when Warren left anything behind on the host after a run:
#   - mounts whose mountpoint contains /warren, or overlay mounts built from Warren directories,
#     except the shared read-only layer mounts under the image store's mnt/ directory;
#   - cgroups named warren* in any hierarchy under /sys/fs/cgroup (v1, v2 and hybrid unified);
#   - network namespaces named warren* or wtnet* (the network tests' mirrors) (ip netns list);
#   - nftables tables named warren-* (one per daemon node with sandbox links);
#   - host links of sandbox networks (wn<4 hex><hex index>) and of the test mirrors (wtm<n>);
#   - processes named warren-agent, and any process running as a host id of the sandbox id pool
#     (uid 2^24 and up: `warrend --id-pool-base`'s default range, owner uids included);
#   - loop devices backed by a file under the image store (the writable-layer file system's)
#     that nothing mounts;
#   - writable layers on disk (subvolumes under the image store's mnt/writable) of gone sandboxes;
#   - files the test harness left in its test root (WARREN_TEST_DIR, default /tmp/warren-tests):
#     a daemon's, gateway's or etcd's directory or log is kept only for a failed test; the run
#     registry (runs/), the VM image cache (vm-runtime/) and the test daemons' shared VM
#     directory (vm-shared/) stay by design.
#
#   scripts/check-leaks.sh [--baseline FILE] [--clean]
#   scripts/check-leaks.sh --snapshot FILE
#
# --snapshot FILE  record what exists now (before a test run) and exit 0.
# --baseline FILE  items recorded by --snapshot are reported as pre-existing and do not fail.
# --clean          try to remove what leaked (kill, unmount, rmdir, netns delete), then check again.
#
# Environment: WARREN_IMAGE_STORE (default /var/lib/warren/images), whose mnt/ holds the allowed
# shared layer mounts; WARREN_LEAK_ALLOW, extra colon-separated path prefixes whose mounts are
# allowed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

STORE="${WARREN_IMAGE_STORE:-/var/lib/warren/images}"
STORE="${STORE%/}"
ALLOWED=("$STORE/mnt/")
if [[ -n "${WARREN_LEAK_ALLOW:-}" ]]; then
    IFS=: read -r -a extra <<< "$WARREN_LEAK_ALLOW"
    ALLOWED+=("${extra[@]}")
fi

SNAPSHOT="" BASELINE="" CLEAN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --snapshot) SNAPSHOT="$2"; shift 2 ;;
        --baseline) BASELINE="$2"; shift 2 ;;
        --clean) CLEAN=1; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "check-leaks: unknown argument: $1" >&2; exit 2 ;;
    esac
done

allowed_mount() {
    local mp="$1" prefix
    for prefix in "${ALLOWED[@]}"; do
        [[ -n "$prefix" && "$mp" == "$prefix"* ]] && return 0
    done
    return 1
}

# Prints one "KIND<TAB>ITEM" line per Warren-owned object on the host.
collect() {
    local mp fstype opts
    # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS.
    # Octal escapes (\040 for a space) are kept as they are.
    while IFS=$'\t' read -r mp fstype opts; do
        allowed_mount "$mp" && continue
        if [[ "$mp" == */warren* ]] || { [[ "$fstype" == overlay ]] && [[ "$opts" == */warren* ]]; }; then
            printf 'mount\t%s\n' "$mp"
        fi
    done < <(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; print $5 "\t" $(i + 1) "\t" $(i + 3) }' \
        /proc/self/mountinfo)

    if [[ -d /sys/fs/cgroup ]]; then
        # Unit cgroups of a daemon run by systemd (warrend.service) belong to systemd, not to Warren.
        find /sys/fs/cgroup -mindepth 1 -maxdepth 6 -type d -name 'warren*' \
            ! -name '*.service' ! -name '*.scope' 2>/dev/null | sort | sed 's/^/cgroup\t/'
    fi

    if command -v ip > /dev/null; then
        ip netns list 2>/dev/null | awk '$1 ~ /^(warren|wtnet)/ {print "netns\t" $1}'
        ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' \
            | grep -E '^(wn[0-9a-f]{5,}|wtm[0-9]+)$' | sed 's/^/link\t/' || true
    fi
    if command -v nft > /dev/null; then
        nft list tables 2>/dev/null | awk '$2 == "inet" && $3 ~ /^warren-/ {print "nft\tinet " $3}'
    fi

    test_root_leftovers | sed 's/^/file\t/'

    # Writable layers on disk (one subvolume per sandbox) of sandboxes that are gone.
    local layers="$STORE/mnt/writable"
    if [[ -d "$layers" ]]; then
        find "$layers" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | sed 's/^/layer\t/'
    fi

    local pid
    for pid in $( { pgrep -x warren-agent; ps -e -o pid=,uid= | awk '$2 >= 16777216 {print $1}'; } \
        | sort -un || true); do
        # One that ended since it was listed is not left behind.
        [[ -d "/proc/$pid" ]] || continue
        printf 'process\t%s %s\n' "$pid" "$(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" || true)"
    done

    # Loop devices of Warren's files (the writable-layer file system's image) that nothing mounts.
    if command -v losetup > /dev/null; then
        local dev back
        while read -r dev back; do
            [[ "$back" == "$STORE/"* || "$back" == */warren* ]] || continue
            grep -q "^$dev " /proc/self/mounts || printf 'loop\t%s %s\n' "$dev" "$back"
        done < <(losetup -n -l -O NAME,BACK-FILE 2>/dev/null || true)
    fi
}

clean() {
    local kind item pid cg
    # Processes first (they pin mounts, cgroups and namespaces), then mounts deepest first.
    while IFS=$'\t' read -r kind item; do
        case "$kind" in
            process) pid="${item%% *}"; echo "check-leaks: killing process $pid"; kill -9 "$pid" 2>/dev/null || true ;;
            cgroup)
                if [[ -w "$item/cgroup.kill" ]]; then
                    echo 1 > "$item/cgroup.kill" 2>/dev/null || true
                elif [[ -r "$item/cgroup.procs" ]]; then
                    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$item/cgroup.procs"
                fi ;;
        esac
    done <<< "$1"
    sleep 0.2
    awk -F'\t' '$1 == "mount" {print $2}' <<< "$1" | sort -r | while read -r item; do
        echo "check-leaks: unmounting $item"
        umount -l "$(printf '%b' "$item")" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "cgroup" {print $2}' <<< "$1" | sort -r | while read -r cg; do
        echo "check-leaks: removing cgroup $cg"
        rmdir "$cg" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "netns" {print $2}' <<< "$1" | while read -r item; do
        echo "check-leaks: deleting netns $item"
        ip netns delete "$item" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "link" {print $2}' <<< "$1" | while read -r item; do
        echo "check-leaks: deleting link $item"
        ip link delete "$item" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "file" {print $2}' <<< "$1" | while read -r item; do
        echo "check-leaks: removing $item"
        rm -rf --one-file-system "$item" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "layer" {print $2}' <<< "$1" | while read -r item; do
        echo "check-leaks: deleting writable layer $item"
        if command -v btrfs > /dev/null; then
            btrfs subvolume delete "$item" > /dev/null 2>&1 || true
        fi
    done
    awk -F'\t' '$1 == "loop" {print $2}' <<< "$1" | while read -r item _; do
        echo "check-leaks: detaching loop device $item"
        losetup -d "$item" 2>/dev/null || true
    done
    awk -F'\t' '$1 == "nft" {print $2}' <<< "$1" | while read -r item; do
        echo "check-leaks: deleting nftables table $item"
        nft delete table $item 2>/dev/null || true
    done
}

current="$(collect)"

if [[ -n "$SNAPSHOT" ]]; then
    printf '%s\n' "$current" > "$SNAPSHOT"
    exit 0
fi

baseline=""
if [[ -n "$BASELINE" && -r "$BASELINE" ]]; then
    baseline="$(cat "$BASELINE")"
fi

# Splits $current into leaks (new since the baseline) and pre-existing items.
classify() {
    leaks="" preexisting=""
    local line
    while IFS= read -r line; do
        [[ -z "$line" ]] && continue
        if [[ -n "$baseline" ]] && grep -qxF -- "$line" <<< "$baseline"; then
            preexisting+="$line"$'\n'
        else
            leaks+="$line"$'\n'
        fi
    done <<< "$current"
}
classify

if [[ -n "$leaks" && "$CLEAN" == 1 ]]; then
    clean "$leaks"
    current="$(collect)"
    classify
fi

if [[ -n "$preexisting" ]]; then
    echo "check-leaks: warning: $(grep -c . <<< "$preexisting") item(s) existed before this run (not counted):"
    printf '%s' "$preexisting" | sed 's/^/  /'
fi
if [[ -n "$leaks" ]]; then
    echo "check-leaks: FAILED: $(grep -c . <<< "$leaks") Warren-owned item(s) left behind:"
    printf '%s' "$leaks" | sed 's/^/  /'
    exit 1
fi
echo "check-leaks: no leftovers (mounts, cgroups, netns, links, nftables, loop devices, writable layers, warren-agent and sandbox-id processes, test files)"
