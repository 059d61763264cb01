#!/usr/bin/env bash
# Two builds of `tagstripe serve` side by side in one run: did a change make serving slower?
# Both serve the same file in /dev/shm over Unix sockets; fio's nbd engine (libnbd) drives
# each in turn, A B A B ..., one job, so the machine's drift hits both alike.
#   usage: benches/compare-builds.sh BIN_A BIN_B [SECONDS] [ROUNDS]
# Each cell: the median of ROUNDS runs and their range; the last column is B / A. The CPU
# line gives each server's user + system seconds per GiB moved, read from /proc.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 BIN_A BIN_B [SECONDS] [ROUNDS]"; exit 2; }
bin_a=$1 bin_b=$2 secs=${3:-5} rounds=${4:-3}
for t in fio python3; do
  command -v "$t" >/dev/null || { echo "$t is missing (Debian: fio)"; exit 2; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine"; exit 2; }
for b in "$bin_a" "$bin_b"; do [[ -x $b ]] || { echo "$b is not an executable"; exit 2; }; done
dir=$(mktemp -d /dev/shm/tagstripe-builds.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
img="$dir/disk.img"
dd if=/dev/urandom of="$img" bs=1M count=512 status=none

"$bin_a" serve --listen "unix:$dir/a.sock" --export disk "$img" >"$dir/a.out" 2>&1 &
pid_a=$!
"$bin_b" serve --listen "unix:$dir/b.sock" --export disk "$img" >"$dir/b.out" 2>&1 &
pid_b=$!
pids+=("$pid_a" "$pid_b")
for f in "$dir/a.sock" "$dir/b.sock"; do
  for _ in $(seq 100); do [[ -S $f ]] && break; sleep 0.1; done
done

# CPU seconds (user + system) of a process so far.
cpu() { python3 -c 'import os,sys
f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split()
print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"; }

# fio, one workload against one server: prints "IOPS MB/s bytes".
run() { # server rw bs depth
  fio --name=w --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/$1.sock" --rw="$2" \
    --rwmixread=50 --bs="$3" --iodepth="$4" --numjobs=1 --time_based --runtime="$secs" \
    --size=512M --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]
r,w=j["read"],j["write"]
print(round(r["iops"]+w["iops"]), round((r["bw_bytes"]+w["bw_bytes"])/1e6,1), r["io_bytes"]+w["io_bytes"])'
}
stats() { python3 -c 'import sys,statistics
v=[float(x) for x in sys.argv[1:]]
print(f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})")' "$@"; }

printf '%-24s %22s %22s %8s\n' workload "A IOPS (range)" "B IOPS (range)" "B/A"
cpu_a=0 cpu_b=0 bytes_a=0 bytes_b=0
for w in "4k-randread-qd32 randread 4k 32" "4k-randwrite-qd32 randwrite 4k 32" \
  "64k-randrw-qd16 randrw 64k 16" "1m-write-qd16 write 1M 16" "1m-read-qd16 read 1M 16"; do
  set -- $w
  name=$1 rw=$2 bs=$3 depth=$4
  a=() b=()
  for ((r = 0; r < rounds; r++)); do
    c0=$(cpu "$pid_a"); read -r iops _ by < <(run a "$rw" "$bs" "$depth"); c1=$(cpu "$pid_a")
    a+=("$iops"); cpu_a=$(python3 -c "print($cpu_a + $c1 - $c0)"); bytes_a=$((bytes_a + by))
    c0=$(cpu "$pid_b"); read -r iops _ by < <(run b "$rw" "$bs" "$depth"); c1=$(cpu "$pid_b")
    b+=("$iops"); cpu_b=$(python3 -c "print($cpu_b + $c1 - $c0)"); bytes_b=$((bytes_b + by))
  done
  ma=$(python3 -c 'import sys,statistics; print(statistics.median(map(float,sys.argv[1:])))' "${a[@]}")
  mb=$(python3 -c 'import sys,statistics; print(statistics.median(map(float,sys.argv[1:])))' "${b[@]}")
  printf '%-24s %22s %22s %8s\n' "$name" "$(stats "${a[@]}")" "$(stats "${b[@]}")" \
    "$(python3 -c "print(f'{$mb/$ma:.2f}x')")"
done
python3 -c "print(f'CPU seconds per GiB moved: A {$cpu_a/($bytes_a/2**30):.3f}, B {$cpu_b/($bytes_b/2**30):.3f}')"
