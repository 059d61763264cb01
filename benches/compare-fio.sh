#!/usr/bin/env bash
# Side by side: fio on the component files with the equivalent per-component workload, and
# `tagstripe bench throughput` on the striped volume over the same files, in one run.
#   usage: benches/compare-fio.sh [SIZE_MIB_PER_COMPONENT] [SECONDS]
# Four components. Equivalence: the same pieces reach each file at the same total depth.
#   1 MiB sequential read/write, volume depth 4, interleave 512 sectors (256 KiB): each
#     request is one 256 KiB piece per component, so fio runs one job per file, bs=256k,
#     iodepth=4.
#   4 KiB random read, volume depth 32, interleave 128: each request is one piece on one
#     component, so fio runs one job per file, bs=4k, iodepth=8 (4 x 8 = 32).
# O_DIRECT on both sides; fio uses io_uring where it can (libaio otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-256}
secs=${2:-5}
command -v fio >/dev/null || { echo "fio is missing (Debian: fio)"; exit 2; }
cargo build --release -q -p tagstripe-cli
bin=./target/release/tagstripe
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/tagstripe-fio.XXXXXX")
trap 'rm -rf "$dir"' EXIT INT TERM
files=()
for i in 0 1 2 3; do
  f="$dir/c$i.img"
  dd if=/dev/urandom of="$f" bs=1M count="$size_mib" status=none
  files+=("$f")
done
engine=io_uring
fio --name=probe --ioengine=io_uring --filename="${files[0]}" --size=4k --rw=read \
  --direct=1 --runtime=1 --output=/dev/null >/dev/null 2>&1 || engine=libaio

fio_mb_s() { # rw bs depth
  local args=()
  for f in "${files[@]}"; do args+=(--name="$(basename "$f")" --filename="$f"); done
  fio --ioengine="$engine" --direct=1 --rw="$1" --bs="$2" --iodepth="$3" \
    --time_based --runtime="$secs" --ramp_time=1 --group_reporting --output-format=json \
    --randrepeat=0 "${args[@]}" |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]
r=j["read"]; w=j["write"]
print((r["bw_bytes"]+w["bw_bytes"])/1e6, r["iops"]+w["iops"])'
}

ts_mb_s() { # op bs depth interleave
  local comps=()
  for f in "${files[@]}"; do comps+=(--component "$f"); done
  "$bin" bench throughput "${comps[@]}" --interleave "$4" --op "$1" --bs "$2" --depth "$3" \
    --seconds "$secs" --direct --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["mb_s"], j["iops"])'
}

printf '%-26s %14s %14s %7s\n' case tagstripe fio ratio
# Alternates the two sides, three rounds, and keeps each side's best, so that the shared
# machine's drift hits both alike.
run() { # label ts_op fio_rw vol_bs piece_bs vol_depth fio_depth interleave unit
  local ts_mb=0 ts_iops=0 f_mb=0 f_iops=0 a b
  for _ in 1 2 3; do
    read -r a b < <(ts_mb_s "$2" "$4" "$6" "$8")
    read -r ts_mb ts_iops < <(python3 -c "print(max($ts_mb,$a), max($ts_iops,$b))")
    read -r a b < <(fio_mb_s "$3" "$5" "$7")
    read -r f_mb f_iops < <(python3 -c "print(max($f_mb,$a), max($f_iops,$b))")
  done
  python3 - "$1" "$ts_mb" "$ts_iops" "$f_mb" "$f_iops" "$9" <<'PY'
import sys
label, tm, ti, fm, fi, unit = sys.argv[1], *map(float, sys.argv[2:6]), sys.argv[6]
if unit == "iops":
    print(f"{label:<26} {ti/1e3:>9.1f}k IOPS {fi/1e3:>9.1f}k IOPS {ti/fi:7.2f}")
else:
    print(f"{label:<26} {tm:>9.0f} MB/s {fm:>9.0f} MB/s {tm/fm:7.2f}")
PY
}
run "1M seq read, QD4"   read      read      1M 256k 4  4 512 mb
run "1M seq write, QD4"  write     write     1M 256k 4  4 512 mb
run "4k rand read, QD32" randread  randread  4k 4k   32 8 128 iops
echo "($engine for fio; ${size_mib} MiB per component; best of 3 alternating runs of ${secs} s)"
