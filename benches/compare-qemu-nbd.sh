#!/usr/bin/env bash
# Side by side: qemu-img bench against `tagstripe serve` and against qemu-nbd serving the
# same file, in one run. Prints each figure and the ratio tagstripe / qemu-nbd.
#   usage: benches/compare-qemu-nbd.sh [SIZE_MIB] [COUNT_4K] [COUNT_1M]
# qemu-img bench issues requests at fixed steps (no random mode): "4k" is 4 KiB requests
# at depth 32 walking the image, "1m" is 1 MiB sequential requests at depth 4; reads and
# writes (-w) each.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-512}
count4k=${2:-200000}
count1m=${3:-4000}
for t in qemu-img qemu-nbd; do
  command -v "$t" >/dev/null || { echo "$t is missing (Debian: qemu-utils)"; exit 2; }
done
cargo build --release -q -p tagstripe-cli
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
img="$dir/disk.img"
# A written (not sparse) image, so both servers read real data.
dd if=/dev/urandom of="$img" bs=1M count="$size_mib" status=none

./target/release/tagstripe serve --listen 127.0.0.1:0 --export disk "$img" >"$dir/serve.out" 2>&1 &
pids+=($!)
while ! grep -q '^listening on' "$dir/serve.out" 2>/dev/null; do
  kill -0 "${pids[0]}" || { cat "$dir/serve.out"; exit 1; }
  sleep 0.1
done
ts_url=$(sed -n 's/^listening on //p' "$dir/serve.out")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
qemu-nbd -f raw -b 127.0.0.1 -p "$port" -x disk --persistent --fork -e 8 \
  --pid-file "$dir/qemu-nbd.pid" "$img"
pids+=("$(cat "$dir/qemu-nbd.pid")")
qn_url="nbd://127.0.0.1:$port/disk"

# Runs qemu-img bench; prints seconds.
run() { # url count depth size extra...
  local url=$1 count=$2 depth=$3 bs=$4; shift 4
  qemu-img bench -f raw -c "$count" -d "$depth" -s "$bs" "$@" "$url" 2>&1 |
    sed -n 's/.*Run completed in \([0-9.]*\) seconds.*/\1/p'
}

printf '%-22s %12s %12s %8s\n' case tagstripe qemu-nbd ratio
for case in "4k-read 4k 32 $count4k" "4k-write 4k 32 $count4k -w" \
            "1m-read 1M 4 $count1m" "1m-write 1M 4 $count1m -w"; do
  set -- $case
  name=$1 bs=$2 depth=$3 count=$4; shift 4
  # Alternate the two servers, best of three each, so drift hits both alike.
  best_ts=999999 best_qn=999999
  for _ in 1 2 3; do
    t=$(run "$ts_url" "$count" "$depth" "$bs" "$@"); best_ts=$(python3 -c "print(min($best_ts,$t))")
    t=$(run "$qn_url" "$count" "$depth" "$bs" "$@"); best_qn=$(python3 -c "print(min($best_qn,$t))")
  done
  python3 - "$name" "$bs" "$count" "$best_ts" "$best_qn" <<'PY'
import sys
name, bs, count, ts, qn = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
size = 4096 if bs == "4k" else 1 << 20
def fig(t):
    return f"{count / t / 1000:.1f}k IOPS" if size == 4096 else f"{count * size / t / 2**20:.0f} MiB/s"
print(f"{name:<22} {fig(ts):>12} {fig(qn):>12} {qn / ts:8.2f}")
PY
done
