#!/usr/bin/env bash
# Side by side with Linux's own I/O schedulers: the fairness story's workload on one loop
# device with direct I/O, run by fio through `none`, `mq-deadline`, `kyber` and `bfq`, and
# by `tagstripe bench fairness` (its queue on top, the kernel's scheduler set to `none`).
#   usage: benches/compare-linux-sched.sh [SIZE_MIB] [SECONDS] [RUNS]   (as root)
# Workload (both sides): a sequential writer of 1 MiB requests at depth 16 and a 4 KiB random
# reader at depth 1 that waits 1 ms after each read. fio reports the reader's completion
# latency p99 and the writer's bandwidth; tagstripe its "fairness on" run (and "fairness
# off", no queue at all). The last column is the writer's MB/s per millisecond of reader
# p99: what each buys of one for the other. RUNS repeats every row (BFQ varies run to run).
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-1024}
secs=${2:-5}
runs=${3:-1}
[[ $(id -u) == 0 ]] || { echo "needs root (losetup, sysfs)"; exit 2; }
command -v fio >/dev/null || { echo "fio is missing (Debian: fio)"; exit 2; }
command -v losetup >/dev/null || { echo "losetup is missing (Debian: mount)"; exit 2; }
cargo build --release -q -p tagstripe-cli
bin=./target/release/tagstripe
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/tagstripe-sched.XXXXXX")
img="$dir/disk.img"
dev=
cap_before=
cleanup() {
  [[ -n "$cap_before" ]] && echo "$cap_before" >"$queue/max_sectors_kb" 2>/dev/null
  [[ -n "$dev" ]] && losetup -d "$dev" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
# Written through, so reads hit the backing file's blocks rather than holes.
fallocate -l "${size_mib}M" "$img"
dd if=/dev/zero of="$img" bs=1M count="$size_mib" status=none oflag=direct conv=notrunc
dev=$(losetup --find --show --direct-io=on "$img")
queue=/sys/block/$(basename "$dev")/queue
# A loop device keeps its max_sectors_kb from an earlier attachment: a value left small
# would cut every request (and this comparison) to it. Run at the hardware cap, and put the
# old value back at the end.
cap_before=$(cat "$queue/max_sectors_kb")
cat "$queue/max_hw_sectors_kb" >"$queue/max_sectors_kb"
echo "device: $dev over $img ($size_mib MiB, direct I/O, max_sectors_kb $(cat "$queue/max_sectors_kb")), schedulers: $(cat "$queue/scheduler")"
echo "workload: 1 MiB sequential writer x16 and a 4 KiB random reader x1 with 1 ms think time, ${secs}s"

engine=io_uring
fio --name=probe --ioengine=io_uring --filename="$dev" --size=4k --rw=read \
  --direct=1 --runtime=1 --output=/dev/null >/dev/null 2>&1 || engine=libaio

# The scheduler the queue really runs: the bracketed one in sysfs.
active_sched() { sed -n 's/.*\[\([^]]*\)\].*/\1/p' "$queue/scheduler"; }
# Set a scheduler and check that it took: a write the kernel refuses, or one it takes without
# switching, must not be measured under the wrong name.
set_sched() { # scheduler -> 0 if it is now the active one
  echo "$1" >"$queue/scheduler" 2>/dev/null || true
  [[ $(active_sched) == "$1" ]]
}
unavailable=()
note_unavailable() { # scheduler
  [[ " ${unavailable[*]-} " == *" $1 "* ]] || unavailable+=("$1")
}

fio_row() { # scheduler -> "p99_ms bulk_mb_s" (the caller has set it)
  fio --output-format=json --ioengine="$engine" --direct=1 --filename="$dev" \
    --time_based --runtime="$secs" \
    --name=writer --rw=write --bs=1M --iodepth=16 \
    --name=reader --rw=randread --bs=4k --iodepth=1 --thinktime=1000 --thinktime_blocks=1 \
    --randrepeat=0 |
    python3 -c 'import json,sys
jobs={j["jobname"]: j for j in json.load(sys.stdin)["jobs"]}
p99=jobs["reader"]["read"]["clat_ns"]["percentile"]["99.000000"]/1e6
print(round(p99, 3), round(jobs["writer"]["write"]["bw_bytes"]/1e6, 1))'
}

tagstripe_rows() { # -> two lines "label p99_ms bulk_mb_s" (the caller has set none)
  "$bin" bench fairness --component "$dev" --live-seconds "$secs" --json |
    python3 -c 'import json,sys
j=json.load(sys.stdin)
for r in j["live"][1:]:
    label={"fairness off (no queue)": "tagstripe-off", "fairness on (tagstripe)": "tagstripe"}[r["run"]]
    print(label, r["interactive"]["p99_ms"], r["bulk_mb_s"])'
}

row() { # label p99 mb
  python3 -c 'import sys
label, p99, mb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print(f"{label:<16} {p99:>12.2f} {mb:>12.1f} {mb / max(p99, 1e-3):>16.0f}")' "$@"
}

printf '%-16s %12s %12s %16s\n' "scheduler" "reader p99 ms" "bulk MB/s" "MB/s per ms p99"
for ((r = 0; r < runs; r++)); do
  for s in none mq-deadline kyber bfq; do
    if ! set_sched "$s"; then
      echo "$s: could not be set (this kernel offers: $(cat "$queue/scheduler")); not measured"
      note_unavailable "$s"
      continue
    fi
    read -r p99 mb < <(fio_row "$s")
    row "$s" "$p99" "$mb"
  done
  if ! set_sched none; then
    echo "none: could not be set under tagstripe (active: $(active_sched)); tagstripe rows skipped"
    note_unavailable none
    continue
  fi
  while read -r label p99 mb; do
    row "$label" "$p99" "$mb"
  done < <(tagstripe_rows)
done
if ((${#unavailable[@]})); then
  echo "schedulers that could not be set, so not measured: ${unavailable[*]}"
else
  echo "every scheduler asked for was set and checked active before its run"
fi
