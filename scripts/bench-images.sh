#!/usr/bin/env bash
# Image benchmark: import time of a generated image (many small files plus some large ones)
# against the classic ways of getting the same layer onto disk (`tar -x`, and `docker load`
# when a Docker daemon answers), and per-sandbox create time with a 3-layer stack against a
# 1-layer image, all in one run.
#
# Usage: scripts/bench-images.sh [SIZE_MB] [N]     (default 300 MB, 100 creates per image)
# Env:   WARREN_BIN_DIR (default target/release), BENCH_STORE (default
#        /var/lib/warren/images-bench; removed at the end), BENCH_DIR (scratch, /var/tmp).
# Prints a table and one JSON line (`RESULT {...}`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
require_root

SIZE_MB=${1:-300}
N=${2:-100}
BIN=${WARREN_BIN_DIR:-$PWD/target/release}
STORE=${BENCH_STORE:-/var/lib/warren/images-bench}
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/warren-bench-images.XXXXXX")
SOCK=$WORK/warrend.sock
NODE=bimg$$
DAEMON=

cleanup() {
    if [[ -n "$DAEMON" ]]; then
        "$BIN/warren" --url "unix://$SOCK" rm --all >/dev/null 2>&1 || true
        kill "$DAEMON" 2>/dev/null || true
        wait "$DAEMON" 2>/dev/null || true
    fi
    "$BIN/warren" image gc --store "$STORE" >/dev/null 2>&1 || true
    for m in $(awk -v p="$STORE/mnt/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$WORK" "$STORE"
}
trap cleanup EXIT

for b in warren warrend warren-agent; do
    [[ -x "$BIN/$b" ]] || { echo "missing $BIN/$b (cargo build --release -p warrend -p warren-agent -p warren-cli)" >&2; exit 1; }
done
W() { "$BIN/warren" "$@"; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }

echo "generating a ${SIZE_MB} MB tree in $WORK ..." >&2
python3 - "$WORK/tree" "$SIZE_MB" <<'PY'
import os, sys, random
root, size_mb = sys.argv[1], int(sys.argv[2])
rnd = random.Random(42)
small_budget = size_mb * 2 // 5 << 20          # 40% in small files, 60% in large ones
n = 0
total = 0
while total < small_budget:
    d = os.path.join(root, "usr/lib/pkg%03d/mod%02d" % (n // 400, (n // 20) % 20))
    os.makedirs(d, exist_ok=True)
    sz = rnd.choice([200, 900, 2500, 4096, 8000, 16000, 40000])
    with open(os.path.join(d, "f%05d.py" % n), "wb") as f:
        f.write(os.urandom(sz // 2) + b"\n" * (sz - sz // 2))
    total += sz
    n += 1
big = os.path.join(root, "opt/models")
os.makedirs(big, exist_ok=True)
large_budget = (size_mb << 20) - total
for i in range(12):
    with open(os.path.join(big, "weights%02d.bin" % i), "wb") as f:
        left = large_budget // 12
        while left > 0:
            chunk = min(left, 4 << 20)
            f.write(os.urandom(chunk))
            left -= chunk
os.symlink("models/weights00.bin", os.path.join(root, "opt/latest.bin"))
print(n, "small files,", total >> 20, "MB small,", large_budget >> 20, "MB large", file=sys.stderr)
PY
tar -C "$WORK/tree" -cf "$WORK/layer.tar" .
python3 - "$WORK" <<'PY'
import hashlib, json, os, sys, tarfile
w = sys.argv[1]
h = hashlib.sha256()
with open(os.path.join(w, "layer.tar"), "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                  "rootfs": {"type": "layers", "diff_ids": ["sha256:" + h.hexdigest()]}}).encode()
cname = hashlib.sha256(cfg).hexdigest() + ".json"
with open(os.path.join(w, cname), "wb") as f:
    f.write(cfg)
with open(os.path.join(w, "manifest.json"), "w") as f:
    json.dump([{"Config": cname, "RepoTags": ["bench-big:1"], "Layers": ["l1/layer.tar"]}], f)
with tarfile.open(os.path.join(w, "image.tar"), "w") as t:
    t.add(os.path.join(w, "layer.tar"), "l1/layer.tar")
    t.add(os.path.join(w, cname), cname)
    t.add(os.path.join(w, "manifest.json"), "manifest.json")
PY
rm -rf "$WORK/tree"
IMG_MB=$(( $(stat -c %s "$WORK/image.tar") >> 20 ))
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true

echo "importing ($IMG_MB MB archive) ..." >&2
t0=$(now); W image import "$WORK/image.tar" --tag bench-big:1 --force --store "$STORE" >/dev/null; t1=$(now)
IMPORT=$(secs "$t0" "$t1")
t0=$(now); W image import "$WORK/image.tar" --tag bench-big:2 --force --store "$STORE" >/dev/null; t1=$(now)
REIMPORT=$(secs "$t0" "$t1")
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
mkdir "$WORK/untar"
t0=$(now); tar -C "$WORK/untar" -xf "$WORK/layer.tar"; sync; t1=$(now)
UNTAR=$(secs "$t0" "$t1")
rm -rf "$WORK/untar"
DOCKER=null
if docker info >/dev/null 2>&1; then
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(now); docker load -q -i "$WORK/image.tar" >/dev/null; t1=$(now)
    DOCKER=$(secs "$t0" "$t1")
    docker rmi -f bench-big:1 >/dev/null 2>&1 || true
fi
rm -f "$WORK/image.tar" "$WORK/layer.tar"

echo "building the stack layers ..." >&2
W image build-layer /var/cache/warren/rootfs-default --tag default --force --store "$STORE" >/dev/null 2>&1 \
    || { echo "the default rootfs is missing: run scripts/build-default-image.sh" >&2; exit 1; }
mkdir -p "$WORK/task/workspace" "$WORK/tools/opt/harness"
for i in $(seq 1 200); do echo "task file $i" > "$WORK/task/workspace/f$i.txt"; done
head -c 20000000 /dev/urandom > "$WORK/tools/opt/harness/tool.bin"
W image build-layer "$WORK/task" --tag bench-task:1 --force --store "$STORE" >/dev/null 2>&1
W image build-layer "$WORK/tools" --tag bench-tools:1 --force --store "$STORE" >/dev/null 2>&1
W image stack --force --tag bench-s3:1 default bench-task:1 bench-tools:1 --store "$STORE" >/dev/null
W image stack --force --tag bench-s3big:1 default bench-big:1 bench-task:1 --store "$STORE" >/dev/null

"$BIN/warrend" --socket "$SOCK" --state-dir "$WORK/state" --node "$NODE" --image-store "$STORE" \
    >"$WORK/warrend.log" 2>&1 &
DAEMON=$!
for _ in $(seq 1 300); do
    W --url "unix://$SOCK" health >/dev/null 2>&1 && break
    sleep 0.05
done
bench() {
    # (bench exits 1 when a target of its own is missed; the numbers still stand)
    { W --url "unix://$SOCK" bench create --image "$1" -n "$N" --json 2>/dev/null || true; } \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); c=d["create"]; print(round(c["p50_ms"], 1), round(c["p99_ms"], 1))'
}
# One warm-up create per image mounts its layers (and checks their digests) once.
for img in default bench-s3:1 bench-s3big:1; do bench "$img" >/dev/null; done
read -r S1_P50 S1_P99 <<<"$(bench default)"
read -r S3_P50 S3_P99 <<<"$(bench bench-s3:1)"
read -r S3B_P50 S3B_P99 <<<"$(bench bench-s3big:1)"

printf '\n%-44s %10s\n' "import of a ${SIZE_MB} MB image (${IMG_MB} MB archive)" "seconds"
printf '%-44s %10s\n' "warren image import (convert to EROFS)" "$IMPORT"
printf '%-44s %10s\n' "warren image import again (already converted)" "$REIMPORT"
printf '%-44s %10s\n' "baseline: tar -x of the layer (+ sync)" "$UNTAR"
printf '%-44s %10s\n' "baseline: docker load" "$DOCKER"
printf '\n%-44s %8s %8s\n' "create -> first exec (n=$N)" "p50 ms" "p99 ms"
printf '%-44s %8s %8s\n' "1 layer (default)" "$S1_P50" "$S1_P99"
printf '%-44s %8s %8s\n' "3 layers (default + task + tools)" "$S3_P50" "$S3_P99"
printf '%-44s %8s %8s\n' "3 layers (default + ${SIZE_MB} MB import + task)" "$S3B_P50" "$S3B_P99"
echo "RESULT {\"size_mb\":$SIZE_MB,\"archive_mb\":$IMG_MB,\"import_s\":$IMPORT,\"reimport_s\":$REIMPORT,\"untar_s\":$UNTAR,\"docker_load_s\":$DOCKER,\"create_1layer_p50_ms\":$S1_P50,\"create_1layer_p99_ms\":$S1_P99,\"create_3layer_p50_ms\":$S3_P50,\"create_3layer_p99_ms\":$S3_P99,\"create_3layer_big_p50_ms\":$S3B_P50,\"create_3layer_big_p99_ms\":$S3B_P99}"
