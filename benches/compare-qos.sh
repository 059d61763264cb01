#!/usr/bin/env bash
# Tenants through `tagstripe serve --tenant`, with fio's nbd engine as the clients, on a
# component that is the bottleneck: an nbdkit memory export behind its rate filter at
# 200 MB/s (rate=1600M: the filter counts bits). Then the same 50 MB/s limit through
# tagstripe and through the kernel's blk-throttle (cgroup v1 blkio.throttle) on one loop
# device, side by side in one run. Says which kernel anchor it could not use.
#
#   benches/compare-qos.sh [SECONDS]      (default 8; needs nbdkit, fio with its nbd engine,
#                                          python3; root for the loop device and blk-throttle)
set -euo pipefail
secs=${1:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/target/release/tagstripe"
for t in nbdkit fio python3; do
  command -v "$t" >/dev/null || { echo "$t is missing"; exit 2; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine"; exit 2; }
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p tagstripe-cli)
dir=$(mktemp -d)
pids=()
cleanup() {
  # Only the script itself cleans up (not a background job's subshell that inherited the trap:
  # one detached the loop device under the server).
  [ "$BASHPID" = "$$" ] || return 0
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${loopdev:-}" ] && losetup -d "$loopdev" 2>/dev/null || true
  [ -n "${cg:-}" ] && rmdir "$cg" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# fio on export $1 (or a device, $1 = dev:PATH): rw bs depth [CGROUP]; prints "MB/s IOPS".
# With CGROUP, fio runs in that cgroup (v1 blkio). The first 3 s are not counted
# (--ramp_time): the rate filter's bucket holds 2 s of burst (its burstiness), which a run
# after an idle moment would otherwise spend on top of the rate (one tenant alone measured
# at 262 MB/s of a 200 MB/s component, two together after it at 219: a ratio of buckets,
# not of schedulers).
job() {
  local target=$1 rw=$2 bs=$3 depth=$4 cgroup=${5:-}
  local how
  if [[ $target == dev:* ]]; then
    how="--ioengine=libaio --direct=1 --filename=${target#dev:}"
  else
    how="--ioengine=nbd --uri=nbd+unix:///$target?socket=$dir/ts.sock"
  fi
  # shellcheck disable=SC2086
  sh -c 'if [ -n "$1" ]; then echo $$ > "$1/cgroup.procs"; fi; shift; exec "$@"' sh "$cgroup" \
    fio --name=j $how --rw="$rw" --bs="$bs" --iodepth="$depth" --size=1G --time_based \
    --ramp_time=3 --runtime="$secs" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]
r,w=j["read"],j["write"]
print(round((r["bw_bytes"]+w["bw_bytes"])/1e6,1), round(r["iops"]+w["iops"]))'
}

nbdkit -U "$dir/kit.sock" -P "$dir/kit.pid" --filter=rate memory 2G rate=1600M
pids+=("$(cat "$dir/kit.pid")")
"$bin" serve --listen "unix:$dir/ts.sock" --export plain \
  --tenant db:weight=3 --tenant backup:weight=1 --tenant capped:limit-mbs=50 \
  --tenant vm:weight=1,reserve-iops=500 --tenant heavy:weight=1000 \
  "nbd+unix:///?socket=$dir/kit.sock" >"$dir/serve.out" 2>"$dir/serve.err" &
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/ts.sock" ] && break; sleep 0.1; done

echo "== tenants over a 200 MB/s component, fio nbd engine, 64 KiB random reads at QD16, $secs s each"
read -r plain _ < <(job plain randread 64k 16)
echo "untenanted export alone (the plain export, itself a weight-100 tenant): $plain MB/s"
# Two jobs at once: "$1 args" and "$2 args" (each a quoted job line); prints both results.
pair() {
  job $1 >"$dir/a" &
  job $2 >"$dir/b"
  wait
  echo "$(cat "$dir/a") | $(cat "$dir/b")"
}
db=$(pair "db randread 64k 16" "backup randread 64k 16")
python3 -c 'import sys; a,b=[float(x.split()[0]) for x in sys.argv[1].split("|")]; print(f"weights 3:1, both saturating: {a} and {b} MB/s: ratio {a/b:.2f} (goal 2.7-3.3), total {a+b:.1f} MB/s = {(a+b)/float(sys.argv[2]):.2f}x of one alone (goal >= 0.95)")' "$db" "$plain"
read -r capped _ < <(job capped randread 64k 16)
echo "limit-mbs=50 alone: $capped MB/s (goal 47.5-52.5)"
echo "limit-mbs=50 beside a saturating tenant (MB/s IOPS | MB/s IOPS): $(pair "capped randread 64k 16" "plain randread 64k 16")"
echo "reserve-iops=500 at weight 1 beside a weight-1000 tenant, 4 KiB (MB/s IOPS | MB/s IOPS; goal >= 475 IOPS for the first): $(pair "vm randread 4k 16" "heavy randread 4k 16")"
kill -USR1 "${pids[1]}"; sleep 0.5
grep "tenant " "$dir/serve.err" | tail -7 | sed 's/^/  /'

echo "== the same 50 MB/s limit on one loop device: tagstripe vs blk-throttle"
if [ "$(id -u)" != 0 ]; then
  echo "not root: no loop device, no blk-throttle (run as root for this part)"; exit 0
fi
# Written whole, not sparse: reads of a hole never reach the disk (a reader over holes
# measures nothing, and one "alone" before a writer has filled them looks 10x faster).
dd if=/dev/zero of="$dir/loop.img" bs=1M count=1024 oflag=direct status=none
loopdev=$(losetup --find --show --direct-io=on "$dir/loop.img")
kill "${pids[1]}"; wait "${pids[1]}" 2>/dev/null || true
"$bin" serve --listen "unix:$dir/ts.sock" --export plain --tenant capped:limit-mbs=50 \
  --direct "$loopdev" >"$dir/serve2.out" 2>"$dir/serve2.err" &
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/ts.sock" ] && break; sleep 0.1; done
cg=/sys/fs/cgroup/blkio/tagstripe-qos-$$
if [ -d /sys/fs/cgroup/blkio ] && mkdir "$cg" 2>/dev/null; then
  majmin=$(lsblk -dno MAJ:MIN "$loopdev" | tr -d ' ')
  echo "$majmin 50000000" >"$cg/blkio.throttle.read_bps_device"
  if grep -q "$majmin 50000000" "$cg/blkio.throttle.read_bps_device"; then
    for round in 1 2 3; do
      read -r t _ < <(job capped randread 64k 16)
      read -r k _ < <(job "dev:$loopdev" randread 64k 16 "$cg")
      echo "round $round: tagstripe limit-mbs=50: $t MB/s; blk-throttle 50 MB/s: $k MB/s"
    done
  else
    echo "blk-throttle did not take the limit (read back: $(cat "$cg/blkio.throttle.read_bps_device"))"
  fi
else
  echo "no cgroup v1 blkio here: blk-throttle not measured"
fi

echo "== several interactive readers beside a bulk writer, on the loop device through serve"
# 4 readers of 4 KiB at 200 IOPS each, Poisson arrivals (fio's rate_process=poisson), one
# in flight each, on a tenant in the interactive class; a bulk writer (1 MiB sequential,
# QD16) on a tenant in the bulk class. Goals (issue 34): the readers' p99 <= 4x theirs
# alone, and the writer >= 0.75x of what it writes with fairness off (both on one
# untenanted export, every request best-effort).
# The readers on export $1, or on the device itself for $1 = dev (fio's libaio, O_DIRECT);
# prints "IOPS p99-ms".
readers() {
  local how="--ioengine=nbd --uri=nbd+unix:///$1?socket=$dir/ts.sock"
  [ "$1" = dev ] && how="--ioengine=libaio --direct=1 --filename=$loopdev"
  # shellcheck disable=SC2086
  fio --name=r $how --rw=randread --bs=4k \
    --iodepth=1 --numjobs=4 --group_reporting --rate_iops=200 --rate_process=poisson \
    --size=1G --time_based --ramp_time=2 --runtime="$secs" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["read"]
print(round(j["iops"]), round(j["clat_ns"]["percentile"]["99.000000"]/1e6, 3))'
}
serve_on() {
  kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null || true
  rm -f "$dir/ts.sock"
  "$bin" serve --listen "unix:$dir/ts.sock" --export plain --direct "$loopdev" "$@" \
    >"$dir/serve3.out" 2>"$dir/serve3.err" &
  pids+=($!)
  for _ in $(seq 50); do [ -S "$dir/ts.sock" ] && break; sleep 0.1; done
}
# The kernel on the same device, fio (libaio, O_DIRECT) as readers and writer, under each of
# its schedulers this kernel has (set, then read back: said when it did not take).
sched=/sys/block/$(basename "$loopdev")/queue/scheduler
for s in none mq-deadline kyber; do
  if ! echo "$s" >"$sched" 2>/dev/null || ! grep -q "\[$s\]" "$sched"; then
    echo "kernel, $s: not available here ($(cat "$sched"))"; continue
  fi
  read -r _ ka < <(readers dev)
  job "dev:$loopdev" write 1M 16 >"$dir/w" &
  wp=$!
  read -r _ kw < <(readers dev)
  wait "$wp" || true
  read -r kmb _ <"$dir/w" || kmb=0
  python3 -c 'import sys; a,w,m=map(float,sys.argv[1:]); print(f"kernel, '"$s"', fio alone on the device: readers p99 alone {a} ms, beside the writer {w} ms = {w/a:.2f}x; writer {m} MB/s")' "$ka" "$kw" "$kmb"
done
echo none >"$sched" 2>/dev/null || true
for round in 1 2 3; do
  serve_on --tenant vm:class=interactive --tenant backup:class=bulk
  read -r _ alone < <(readers vm)
  job backup write 1M 16 >"$dir/w" &
  wp=$!
  read -r iops with < <(readers vm)
  wait "$wp" || true
  read -r fair _ <"$dir/w" || { echo "round $round: the writer gave no figure"; continue; }
  serve_on
  job plain write 1M 16 >"$dir/w" &
  wp=$!
  read -r _ off_p99 < <(readers plain)
  wait "$wp" || true
  read -r off _ <"$dir/w" || { echo "round $round: the writer gave no figure"; continue; }
  python3 -c 'import sys; a,w,i,f,o,op=map(float,sys.argv[1:])
print(f"round '"$round"': readers p99 alone {a} ms, beside the writer {w} ms = {w/a:.2f}x (goal <= 4; {i:.0f} IOPS of 800); writer {f} MB/s against {o} with fairness off = {f/o:.2f}x (goal >= 0.75; readers p99 then {op} ms)")' \
    "$alone" "$with" "$iops" "$fair" "$off" "$off_p99"
done
