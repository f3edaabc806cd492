#!/usr/bin/env bash
# Compressed swap in RAM (zram) so paused sandboxes can push their memory out of RAM.
# Only acts when the host has no swap at all and a free zram device exists; never touches an
# existing swap setup. WARREN_NO_ZRAM=1 skips it. Size: a quarter of RAM, at most 8 GiB.
set -euo pipefail

if [[ "${WARREN_NO_ZRAM:-0}" == 1 ]]; then
    echo "setup-swap: skipped (WARREN_NO_ZRAM=1)"
    exit 0
fi
if [[ -n "$(swapon --show --noheadings 2>/dev/null)" ]]; then
    echo "setup-swap: swap already configured:"
    swapon --show
    exit 0
fi
dev=""
if [[ -e /sys/block/zram0 && "$(cat /sys/block/zram0/disksize)" == 0 ]]; then
    dev=zram0
elif [[ -e /sys/class/zram-control/hot_add ]]; then
    dev="zram$(cat /sys/class/zram-control/hot_add)"
fi
if [[ -z "$dev" || ! -e "/sys/block/$dev" ]]; then
    echo "setup-swap: no zram device on this kernel; pause will freeze sandboxes but cannot push anonymous memory out"
    exit 0
fi
if [[ ! -b "/dev/$dev" ]]; then
    echo "setup-swap: /dev/$dev is missing; pause will freeze but not page out"
    exit 0
fi
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
size=$((mem_kb * 1024 / 4))
max=$((8 << 30))
((size > max)) && size=$max
for alg in zstd lz4 lzo-rle lzo; do
    if grep -qw "$alg" "/sys/block/$dev/comp_algorithm"; then
        echo "$alg" > "/sys/block/$dev/comp_algorithm"
        break
    fi
done
echo "$size" > "/sys/block/$dev/disksize"
mkswap "/dev/$dev" > /dev/null
swapon -p 100 "/dev/$dev"
echo "setup-swap: $((size >> 20)) MiB of zram swap on /dev/$dev ($(cat /sys/block/$dev/comp_algorithm | grep -o '\[[a-z0-9-]*\]'))"
