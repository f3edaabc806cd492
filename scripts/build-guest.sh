#!/usr/bin/env bash
# Fetches the guest kernel for the microvm and vm substrates and keeps it in a cache.
#
#   scripts/build-guest.sh [--force]
#
# Debian's cloud kernel (linux-image-cloud-amd64) is downloaded with `apt-get download` — never
# installed on the host — and unpacked. Kept: the kernel (bzImage, booted directly with
# `-kernel`), its config, and the few modules the guest needs (virtio-pci, virtio-blk,
# virtio-console, erofs, overlay, virtio-net and their dependencies), in load order. The daemon builds the
# initramfs itself (modules + warren-agent + its libraries) at start-up, so a rebuilt agent
# never needs this script again.
#
# Output: /var/cache/warren/guest/<kernel version>/{vmlinuz,config,modules/*.ko,modules.order}
# and the symlink /var/cache/warren/guest/current. Idempotent: a cached kernel that has every
# module of the list is kept (one cached before a module was added is fetched again).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh
require_root

CACHE=${WARREN_GUEST_CACHE:-/var/cache/warren/guest}
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { echo "build-guest: $*"; }
die() { echo "build-guest: error: $*" >&2; exit 1; }

# The module set, dependencies first (what `depends=` in each .ko says).
MODULES=(
    virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
    virtio_blk virtio_console libcrc32c erofs overlay
    failover net_failover virtio_net
)

# Complete when every module of the list is in modules.order or built into the kernel.
cached_complete() {
    local d="$CACHE/current" m cfg
    [[ -f "$d/vmlinuz" && -f "$d/modules.order" && -f "$d/config" ]] || return 1
    for m in "${MODULES[@]}"; do
        [[ "$m" == virtio_pci_legacy_dev || "$m" == virtio_pci_modern_dev || "$m" == libcrc32c ]] && continue
        grep -qx "$m.ko" "$d/modules.order" && continue
        cfg="CONFIG_$(echo "$m" | tr 'a-z' 'A-Z')"
        grep -qx "${cfg}=y" "$d/config" && continue
        return 1
    done
}

if [[ $FORCE -eq 0 ]] && cached_complete; then
    log "cached: $(readlink -f "$CACHE/current")"
    exit 0
fi

# The metapackage names the versioned image package; download only that one.
pkg="$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
if [[ -z "$pkg" ]]; then
    log "no package lists for linux-image-cloud-amd64; running apt-get update"
    apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
    pkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
fi
[[ -n "$pkg" ]] || die "cannot resolve linux-image-cloud-amd64"
kver="${pkg#linux-image-}"
log "guest kernel $kver"

work="$(mktemp -d /tmp/warren-guest.XXXXXX)"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
# `apt-get download` drops privileges to _apt, which must be able to write the directory.
(cd "$work" && apt-get download -q "$pkg" >/dev/null 2>&1) || (cd "$work" && apt-get download "$pkg")
deb="$(ls "$work"/*.deb)"
dpkg-deb -x "$deb" "$work/x"

out="$CACHE/$kver"
rm -rf "$out.tmp"
mkdir -p "$out.tmp/modules"
cp "$work/x/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
cp "$work/x/boot/config-$kver" "$out.tmp/config"
moddir="$work/x/lib/modules/$kver"
: > "$out.tmp/modules.order"
for m in "${MODULES[@]}"; do
    cfg="CONFIG_$(echo "$m" | tr 'a-z' 'A-Z')"
    f="$(find "$moddir" -name "$m.ko" -print -quit)"
    if [[ -z "$f" ]]; then
        # Built in (=y) is fine; missing altogether is not.
        grep -qi "=y" <<<"$(grep -i "^${cfg}=" "$out.tmp/config" || true)" && continue
        [[ "$m" == virtio_pci_legacy_dev || "$m" == virtio_pci_modern_dev || "$m" == libcrc32c ]] && continue
        die "module $m is neither in the package nor built in"
    fi
    cp "$f" "$out.tmp/modules/$m.ko"
    echo "$m.ko" >> "$out.tmp/modules.order"
done
echo "$kver" > "$out.tmp/version"
rm -rf "$out"
mv "$out.tmp" "$out"
ln -sfn "$kver" "$CACHE/current"
log "kernel and $(wc -l < "$out/modules.order") modules in $out"
