#!/usr/bin/env bash
# Builds the rootfs of Warren's default image once (Debian bookworm, minbase, with python3 and git)
# and registers it as image `default` in the layer store.
#
#   scripts/build-default-image.sh [--rootfs-only]
#
# Environment:
#   WARREN_CACHE        rootfs cache directory        (default /var/cache/warren)
#   WARREN_BIN          the `warren` CLI              (default target/release/warren)
#   WARREN_IMAGE_STORE  image store directory         (default /var/lib/warren/images)
#   WARREN_MIRROR       Debian mirror to debootstrap from (default: the machine's own apt source)
#
# The rootfs is built into a .tmp directory and renamed into place at the end, so an interrupted
# build is redone on the next run and a finished one is never rebuilt. The image is registered only
# when `warren image inspect default` says it is not there yet.
set -euo pipefail

cd "$(dirname "$0")/.."

ROOTFS_ONLY=0
case "${1:-}" in
    --rootfs-only) ROOTFS_ONLY=1 ;;
    "") ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "build-default-image: unknown argument: $1" >&2; exit 2 ;;
esac

CACHE="${WARREN_CACHE:-/var/cache/warren}"
ROOTFS="$CACHE/rootfs-default"
TMP="$ROOTFS.tmp"
WARREN_BIN="${WARREN_BIN:-target/release/warren}"
STORE="${WARREN_IMAGE_STORE:-/var/lib/warren/images}"
SUITE=bookworm

log() { echo "build-default-image: $*"; }
die() { echo "build-default-image: error: $*" >&2; exit 1; }

# The first bookworm mirror of this machine's apt sources (comments ignored), else deb.debian.org.
detect_mirror() {
    local uri=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        # deb822: blank-line separated stanzas; pick the first one with Types: deb and suite bookworm.
        uri="$(awk -v suite="$SUITE" '
            function flush() {
                if (!found && is_deb && has_suite && uris != "") { split(uris, u, " "); print u[1]; found = 1 }
                is_deb = 0; has_suite = 0; uris = ""
            }
            /^[[:space:]]*#/ { next }
            /^[[:space:]]*$/ { flush(); next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") is_deb = 1 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) has_suite = 1 }
            tolower($1) == "uris:" { uris = ""; for (i = 2; i <= NF; i++) uris = uris " " $i }
            END { flush() }
        ' /etc/apt/sources.list.d/debian.sources)"
    fi
    if [[ -z "$uri" && -r /etc/apt/sources.list ]]; then
        # One-line style: deb [options] URI SUITE COMPONENTS...
        uri="$(awk -v suite="$SUITE" '
            $1 != "deb" { next }
            { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } }
            $(i + 1) == suite { print $i; exit }
        ' /etc/apt/sources.list)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Unmount anything left mounted under a directory (debootstrap mounts proc and sys into its
# target; an interrupted build can leave them behind). Deepest first.
umount_under() {
    local dir="$1" mp
    awk '{print $2}' /proc/self/mounts | { grep -E "^${dir//./\\.}(/|$)" || true; } | sort -r |
        while read -r mp; do
            log "unmounting leftover $mp"
            umount -l "$mp" || true
        done
}

# Files every Warren sandbox expects in its root. Idempotent: only touches what is missing or wrong.
finish_rootfs() {
    local root="$1"
    if [[ "$(cat "$root/etc/hostname" 2>/dev/null || true)" != "sandbox" ]]; then
        echo sandbox > "$root/etc/hostname"
        log "wrote $root/etc/hostname"
    fi
    if [[ -L "$root/etc/resolv.conf" ]] || ! grep -q '^# Warren' "$root/etc/resolv.conf" 2>/dev/null; then
        rm -f "$root/etc/resolv.conf"
        printf '%s\n' "# Warren: replaced at sandbox start when the sandbox has a network." \
            > "$root/etc/resolv.conf"
        log "wrote $root/etc/resolv.conf placeholder"
    fi
    local d
    for d in root tmp workspace; do
        [[ -d "$root/$d" ]] || { mkdir -p "$root/$d"; log "created $root/$d"; }
    done
    [[ "$(stat -c %a "$root/root")" == 700 ]] || chmod 0700 "$root/root"
    [[ "$(stat -c %a "$root/tmp")" == 1777 ]] || chmod 1777 "$root/tmp"
    [[ "$(stat -c %a "$root/workspace")" == 755 ]] || chmod 0755 "$root/workspace"
    # Downloaded .debs and package lists (about 100 MB) are not needed at run time; `apt-get
    # update` inside a sandbox brings the lists back.
    if compgen -G "$root/var/cache/apt/archives/*.deb" > /dev/null \
        || compgen -G "$root/var/lib/apt/lists/*_Packages" > /dev/null; then
        find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -delete
        find "$root/var/lib/apt/lists" -maxdepth 1 -type f ! -name lock -delete
        log "removed apt caches from $root"
    fi
}

build_rootfs() {
    command -v debootstrap >/dev/null || die "debootstrap is not installed (run scripts/setup.sh)"
    local mirror="${WARREN_MIRROR:-$(detect_mirror)}"
    if [[ -e "$TMP" ]]; then
        log "removing an unfinished build at $TMP"
        umount_under "$TMP"
        rm -rf --one-file-system "$TMP"
    fi
    mkdir -p "$TMP"
    log "debootstrap --variant=minbase --include=python3,git $SUITE from $mirror (about 30 s)"
    local start=$SECONDS
    if ! debootstrap --variant=minbase --include=python3,git "$SUITE" "$TMP" "$mirror" \
        > "$CACHE/debootstrap.log" 2>&1; then
        umount_under "$TMP"
        tail -n 30 "$CACHE/debootstrap.log" >&2
        die "debootstrap failed (full log: $CACHE/debootstrap.log)"
    fi
    umount_under "$TMP"
    finish_rootfs "$TMP"
    mv -T "$TMP" "$ROOTFS"
    log "rootfs built in $((SECONDS - start)) s: $ROOTFS ($(du -sh "$ROOTFS" | cut -f1))"
}

[[ "$(id -u)" == 0 ]] || die "must run as root"
mkdir -p "$CACHE"

# One build at a time; a second caller waits and then finds the rootfs ready.
exec 9> "$CACHE/.rootfs-default.lock"
flock 9

if [[ -d "$ROOTFS" ]]; then
    log "reusing cached rootfs $ROOTFS"
    finish_rootfs "$ROOTFS"
else
    build_rootfs
fi

if [[ "$ROOTFS_ONLY" == 1 ]]; then
    exit 0
fi

if [[ ! -x "$WARREN_BIN" ]]; then
    die "cannot register image 'default': $WARREN_BIN does not exist yet." \
        "Build it first with 'cargo build --release' (the rootfs is ready at $ROOTFS)."
fi

# Registrations of this rootfs, one line per store, with the layer format they were made in.
# Format 2 keeps every file's modification time (format 1 set them all to 0, which made every
# Python start recompile the modules it imports); a store registered in an older format is
# registered again.
STAMP="$ROOTFS.registered"
FORMAT=2
stamp_line="format=$FORMAT store=$STORE"
if "$WARREN_BIN" image inspect default --store "$STORE" > /dev/null 2>&1; then
    if grep -qxF "$stamp_line" "$STAMP" 2>/dev/null; then
        log "image 'default' is already registered in $STORE"
        exit 0
    fi
    log "image 'default' in $STORE was registered by an older builder: registering it again"
fi

log "registering $ROOTFS as image 'default' in $STORE"
mkdir -p "$STORE"
start=$SECONDS
# --force: an older registration of this rootfs is replaced (the check above exits when
# there is a current one).
if ! "$WARREN_BIN" image build-layer "$ROOTFS" --tag default --store "$STORE" --force; then
    die "'$WARREN_BIN image build-layer $ROOTFS --tag default --store $STORE --force' failed"
fi
{ awk -v s="store=$STORE" '$2 != s' "$STAMP" 2>/dev/null || true; echo "$stamp_line"; } > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "image 'default' registered in $((SECONDS - start)) s"
