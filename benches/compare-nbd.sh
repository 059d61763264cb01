#!/usr/bin/env bash
# Side by side in one run: `tagstripe serve`, nbdkit's file plugin and qemu-nbd serving the
# same device, driven by fio's nbd engine (libnbd): the matrix of issue 33.
#   usage: benches/compare-nbd.sh [SECONDS] [RUNS]
# Devices ($DEVICES, default "shm loop direct stripe stripe-direct"):
#   shm     a 512 MiB file in /dev/shm, each server as it opens a file by default;
#   loop    a 2 GiB loop device (backing file on /var/tmp, --direct-io=on) through the page
#           cache, each server's default;
#   direct  the loop device with O_DIRECT: `serve --direct` against `qemu-nbd --cache=none
#           --aio=io_uring` (the ratio is against qemu-nbd alone: nbdkit's file plugin has
#           no O_DIRECT; its figure, with cache=none, is through the page cache).
#   stripe  a striped volume of 4 loop devices of 512 MiB (each as the one above; 64 KiB
#           interleave, each component behind its tagged queue), served by tagstripe, against
#           tagstripe serving the one 2 GiB loop device: the cost of the layers (goal: the
#           volume at >= 0.9x of the one device), through the page cache;
#   stripe-direct  the same with O_DIRECT (`serve --direct` for both).
#           These rows print the volume, the one device and nbdkit's or qemu-nbd's figure
#           on the one device (for scale), and the ratio volume / one device.
# The loop device's page cache is filled before its rows (a server of cached data), with the
# device held open from then until the row's servers stop: Linux drops a block device's page
# cache when its last opener closes it, so a fill by `dd` alone left the cache empty and the
# first server of each row read from the disk. It is filled by writing the device's own bytes
# back in 4 KiB writes (then `sync`), not by reading it through: a read-through's readahead
# (the loop device's is 2.5 MiB) caches it in folios of up to 2 MiB, and each 4 KiB write
# into one walks all 512 of its buffer heads (`__block_write_begin_int`, 29% of the machine's
# time under nbdkit): 4 KiB random writes then ran at 31-57 k/s for either server, moving
# 0.6-1.4x between them from run to run, and at 98-167 k/s in 4 KiB folios. Cached folios
# keep their size until evicted, so the row's later writes leave the cache as it was filled.
# Every run also starts with nothing dirty (`sync` first, not timed): what one server wrote
# is not written back under the next one's run.
# Transports ($TRANSPORTS, default "unix tcp"): a Unix socket, TCP on loopback.
# Jobs ($JOBS, default "1 4"): fio jobs, each its own connection.
# Workloads ($WORKLOADS): 4k-randread, 4k-randwrite (QD32), 64k-randrw (50/50, QD16),
#   1m-write, 1m-read (sequential, QD16).
# Each cell is the median of RUNS runs, the servers in turn (each run led by the next); the
# ratio is tagstripe against the best of the peers (with RUNS > 1 the spread follows: the
# least and the most of the runs' own ratios, each run's servers measured back to back);
# CPU is each server's user + system seconds (from /proc) per GiB moved. The shm and
# O_DIRECT rows also print the device alone: fio (io_uring) on the file or loop device
# itself, the same workload and jobs; where 1.2x the best peer is more than that, no server
# can reach it (counted at the end). Not the loop
# rows: io_uring through a block device's page cache hands each request to a kernel worker
# and is no measure of it (4 KiB random reads: 78 k/s alone, 202 k/s served by tagstripe).
# Every row also prints the client's ceiling: fio's own CPU a request (user + system, from its
# report; the least of the three servers' runs), and what that allows a second on as many cores
# as it has jobs (at most the machine's) if the server cost nothing. Where 1.2x the best peer
# is more than the device alone or that ceiling, the cell is out of any server's reach on this
# machine; the last line counts those and how many of the others reach 1.2x. (An estimate: a
# client could spend less a request against a server that batched its replies better still.)
# With $TLS=1 (default), 1 MiB reads over TLS on the shm file too.
# The loop devices need root; without it they are skipped, and said so.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
runs=${2:-1}
devices=${DEVICES:-shm loop direct stripe stripe-direct}
transports=${TRANSPORTS:-unix tcp}
jobs_list=${JOBS:-1 4}
workloads=${WORKLOADS:-4k-randread 4k-randwrite 64k-randrw 1m-write 1m-read}
tls=${TLS:-1}
py=/usr/bin/python3
for t in fio nbdkit qemu-nbd openssl $py; do
  command -v "$t" >/dev/null || { echo "$t is missing (Debian: fio, nbdkit, qemu-utils, openssl, python3)"; exit 2; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine"; exit 2; }
cargo build --release -q -p tagstripe-cli
ts_bin=$PWD/target/release/tagstripe
dir=$(mktemp -d /dev/shm/tagstripe-nbd.XXXXXX)
servers=() loopdev="" backing="" held=()
# Keeps block device $1 open (its page cache with it) until the servers stop.
hold() { local fd; exec {fd}<"$1"; held+=("$fd"); }
# Holds loop device $1 and fills its page cache in 4 KiB folios: what was cached is dropped
# (`blockdev --flushbufs`: written back, then invalidated), then the backing file $2's bytes
# (the device's own) are written into the device 4 KiB at a time and on to the disk (`sync`).
# (So each device has written back before its rows too: the kernel gives a block device that
# has not yet written back a small share of the dirty-page limit, and random writes to fresh
# stripes were throttled, 0.38x of the one device, twice.)
fill() { # device backing
  hold "$1"
  blockdev --flushbufs "$1"
  dd if="$2" of="$1" ibs=1M obs=4k iflag=direct status=none
  sync
}
stop_servers() {
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${servers[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  servers=()
  local fd
  for fd in "${held[@]}"; do exec {fd}<&-; done
  held=()
}
cleanup() {
  stop_servers
  [[ -n $loopdev ]] && losetup -d "$loopdev" 2>/dev/null || true
  [[ -n $backing ]] && rm -f "$backing"
  for d in "${stripes[@]}"; do losetup -d "$d" 2>/dev/null || true; done
  for b in "${stripe_backing[@]}"; do rm -f "$b"; done
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
img="$dir/disk.img"
dd if=/dev/urandom of="$img" bs=1M count=512 status=none
stripes=() stripe_backing=()
if [[ $devices == *loop* || $devices == *direct* || $devices == *stripe* ]]; then
  if [[ $(id -u) -ne 0 ]] || ! command -v losetup >/dev/null; then
    echo "note: not root (or no losetup): the loop-device rows are skipped"
    devices=${devices//stripe-direct/}
    devices=${devices//stripe/}
    devices=${devices//loop/}
    devices=${devices//direct/}
  else
    backing=$(mktemp /var/tmp/tagstripe-nbd-loop.XXXXXX)
    dd if=/dev/urandom of="$backing" bs=1M count=2048 oflag=direct status=none
    loopdev=$(losetup -f --show --direct-io=on "$backing")
    if [[ $devices == *stripe* ]]; then
      for _ in 1 2 3 4; do
        b=$(mktemp /var/tmp/tagstripe-nbd-stripe.XXXXXX)
        stripe_backing+=("$b")
        dd if=/dev/urandom of="$b" bs=1M count=512 oflag=direct status=none
        stripes+=("$(losetup -f --show --direct-io=on "$b")")
      done
    fi
  fi
fi

port=$((20000 + RANDOM % 20000))
# Starts the three servers on DEVICE-KIND over TRANSPORT; sets uri_ts, uri_kit, uri_qemu and
# the pids pid_ts, pid_kit, pid_qemu.
start() { # kind transport
  local kind=$1 tr=$2 path direct_ts=() kit_cache=() qemu_cache=()
  # What the rows before wrote is on its way to the disk first, not under these rows.
  sync
  case $kind in
    shm) path=$img ;;
    loop) path=$loopdev
      fill "$loopdev" "$backing" ;;
    direct) path=$loopdev; direct_ts=(--direct); kit_cache=(cache=none)
      qemu_cache=(--cache=none --aio=io_uring) ;;
  esac
  alone_path=$path alone_direct=0
  [[ $kind == direct ]] && alone_direct=1
  local p1=$port p2=$((port + 1)) p3=$((port + 2))
  port=$((port + 3))
  if [[ $tr == unix ]]; then
    "$ts_bin" serve --listen "unix:$dir/ts.sock" --export disk "${direct_ts[@]}" "$path" \
      >"$dir/serve.out" 2>&1 &
    pid_ts=$!
    nbdkit --unix "$dir/kit.sock" --pidfile "$dir/kit.pid" --exportname disk file "$path" "${kit_cache[@]}"
    qemu-nbd -f raw -k "$dir/qemu.sock" -x disk --persistent --fork -e 16 "${qemu_cache[@]}" \
      --pid-file "$dir/qemu.pid" "$path"
    uri_ts="nbd+unix:///disk?socket=$dir/ts.sock"
    uri_kit="nbd+unix:///disk?socket=$dir/kit.sock"
    uri_qemu="nbd+unix:///disk?socket=$dir/qemu.sock"
    wait_for "$dir/ts.sock"
  else
    "$ts_bin" serve --listen "127.0.0.1:$p1" --export disk "${direct_ts[@]}" "$path" \
      >"$dir/serve.out" 2>&1 &
    pid_ts=$!
    nbdkit --ipaddr 127.0.0.1 --port "$p2" --pidfile "$dir/kit.pid" --exportname disk file "$path" "${kit_cache[@]}"
    qemu-nbd -f raw -b 127.0.0.1 -p "$p3" -x disk --persistent --fork -e 16 "${qemu_cache[@]}" \
      --pid-file "$dir/qemu.pid" "$path"
    uri_ts="nbd://127.0.0.1:$p1/disk"
    uri_kit="nbd://127.0.0.1:$p2/disk"
    uri_qemu="nbd://127.0.0.1:$p3/disk"
    for _ in $(seq 100); do grep -q "listening\|serving" "$dir/serve.out" 2>/dev/null && break; sleep 0.1; done
    sleep 0.3
  fi
  wait_for "$dir/kit.pid"
  wait_for "$dir/qemu.pid"
  pid_kit=$(cat "$dir/kit.pid") pid_qemu=$(cat "$dir/qemu.pid")
  servers=("$pid_ts" "$pid_kit" "$pid_qemu")
}
# The stripe rows: tagstripe serving the volume of 4 loop devices (pid_ts, uri_ts), tagstripe
# serving the one loop device (in nbdkit's slot: pid_kit, uri_kit) and the peer on the one
# device for scale (in qemu-nbd's slot: nbdkit through the page cache, qemu-nbd with O_DIRECT).
start_stripe() { # kind transport
  local kind=$1 tr=$2 direct_ts=() a b c
  sync
  local p1=$port p2=$((port + 1)) p3=$((port + 2))
  port=$((port + 3))
  if [[ $kind == stripe-direct ]]; then
    direct_ts=(--direct)
  else
    # Each filled as the loop rows' device is (above), the stripes and the one device alike.
    fill "$loopdev" "$backing"
    local i
    for i in "${!stripes[@]}"; do fill "${stripes[$i]}" "${stripe_backing[$i]}"; done
  fi
  if [[ $tr == unix ]]; then
    a="unix:$dir/ts.sock" b="unix:$dir/ts1.sock"
    uri_ts="nbd+unix:///disk?socket=$dir/ts.sock"
    uri_kit="nbd+unix:///disk?socket=$dir/ts1.sock"
    uri_qemu="nbd+unix:///disk?socket=$dir/peer.sock"
  else
    a="127.0.0.1:$p1" b="127.0.0.1:$p2"
    uri_ts="nbd://127.0.0.1:$p1/disk"
    uri_kit="nbd://127.0.0.1:$p2/disk"
    uri_qemu="nbd://127.0.0.1:$p3/disk"
  fi
  "$ts_bin" serve --listen "$a" --export disk "${direct_ts[@]}" "${stripes[@]}" >"$dir/serve.out" 2>&1 &
  pid_ts=$!
  "$ts_bin" serve --listen "$b" --export disk "${direct_ts[@]}" "$loopdev" >"$dir/serve1.out" 2>&1 &
  pid_kit=$!
  if [[ $kind == stripe-direct ]]; then
    if [[ $tr == unix ]]; then c=(-k "$dir/peer.sock"); else c=(-b 127.0.0.1 -p "$p3"); fi
    qemu-nbd -f raw "${c[@]}" -x disk --persistent --fork -e 16 --cache=none --aio=io_uring \
      --pid-file "$dir/peer.pid" "$loopdev"
  else
    if [[ $tr == unix ]]; then c=(--unix "$dir/peer.sock"); else c=(--ipaddr 127.0.0.1 --port "$p3"); fi
    nbdkit "${c[@]}" --pidfile "$dir/peer.pid" --exportname disk file "$loopdev"
  fi
  for f in serve.out serve1.out; do
    for _ in $(seq 100); do grep -q "listening\|serving" "$dir/$f" 2>/dev/null && break; sleep 0.1; done
  done
  sleep 0.3
  wait_for "$dir/peer.pid"
  pid_qemu=$(cat "$dir/peer.pid")
  servers=("$pid_ts" "$pid_kit" "$pid_qemu")
}
wait_for() { for _ in $(seq 100); do [[ -e $1 ]] && return; sleep 0.1; done; echo "$1 never appeared"; exit 1; }
stop() { stop_servers; rm -f "$dir"/*.sock "$dir"/*.pid; }

# A process's user + system CPU seconds so far.
cpu() { $py -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"; }

# fio, one workload against one server: prints "IOPS GiB-moved client-us-per-request", the
# last fio's own CPU (user + system, all its jobs) per request.
fio_run() { # uri rw bs depth jobs [extra...]
  local uri=$1 rw=$2 bs=$3 depth=$4 jobs=$5
  shift 5
  HOME=$dir/home fio --name=w --ioengine=nbd --uri="$uri" --rw="$rw" --rwmixread=50 --bs="$bs" \
    --iodepth="$depth" --numjobs="$jobs" --group_reporting --time_based --runtime="$secs" \
    --size=512M --output-format=json "$@" 2>/dev/null |
    $py -c 'import json,sys
t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]
n=j["read"]["total_ios"]+j["write"]["total_ios"]
# usr_cpu and sys_cpu are percent of the jobs summed run time (job_runtime, ms).
c=(j["usr_cpu"]+j["sys_cpu"])/100*j["job_runtime"]/1000
print(round(j["read"]["iops"]+j["write"]["iops"]), (j["read"]["io_bytes"]+j["write"]["io_bytes"])/2**30, round(c/n*1e6,3) if n else "-")'
}
# One run of a workload against a server: prints "IOPS CPU-s-per-GiB client-us-per-request".
measured() { # pid uri rw bs depth jobs
  local pid=$1 before after out
  shift
  sync
  before=$(cpu "$pid")
  out=$(fio_run "$@")
  after=$(cpu "$pid")
  $py -c 'import sys; i,g,c,b,a=sys.argv[1:]; g=float(g); print(i, round((float(a)-float(b))/g,3) if g>0 else "-", c)' $out "$before" "$after"
}
# The device alone, once per device, workload and jobs: fio (io_uring) on the file or loop
# device itself; sets alone_iops (empty or 0 if fio could not run it).
declare -A alone_seen=()
alone() { # key rw bs depth jobs
  local key=$1 rw=$2 bs=$3 depth=$4 jobs=$5
  if [[ -z ${alone_seen[$key]+set} ]]; then
    alone_seen[$key]=$(fio --name=a --ioengine=io_uring --filename="$alone_path" \
      --direct="$alone_direct" --rw="$rw" --rwmixread=50 --bs="$bs" --iodepth="$depth" \
      --numjobs="$jobs" --group_reporting --time_based --runtime="$secs" --size=512M \
      --output-format=json 2>/dev/null |
      $py -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))' \
      2>/dev/null || true)
  fi
  alone_iops=${alone_seen[$key]}
}
median() { $py -c 'import sys,statistics; print(round(statistics.median(map(float,sys.argv[1:]))))' "$@"; }
median3() { $py -c 'import sys,statistics; print(round(statistics.median(map(float,sys.argv[1:])),3))' "$@"; }

shape() { # workload -> rw bs depth
  case $1 in
    4k-randread) echo "randread 4k 32" ;;
    4k-randwrite) echo "randwrite 4k 32" ;;
    64k-randrw) echo "randrw 64k 16" ;;
    1m-write) echo "write 1M 16" ;;
    1m-read) echo "read 1M 16" ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
  esac
}

mkdir -p "$dir/home/.pki"
cells=0 met=0 cpu_ok=0 scells=0 smet=0 beyond=0 turn=0
beyond_client=0 unreachable=0 reachable=0 reach_met=0 ncpu=$(nproc)
header=""
for kind in $devices; do
  case $kind in
    stripe*) h=$(printf '%-13s %-5s %-4s %-13s %10s %10s %10s %7s   %s' device via jobs workload volume one-dev peer-one vol/one "CPU s/GiB: volume one peer") ;;
    *) h=$(printf '%-13s %-5s %-4s %-13s %10s %10s %10s %7s   %s' device via jobs workload tagstripe nbdkit qemu-nbd ts/best "CPU s/GiB: ts kit qemu; device alone") ;;
  esac
  [[ $h == "$header" ]] || { echo "$h"; header=$h; }
  for tr in $transports; do
    case $kind in
      stripe*) start_stripe "$kind" "$tr" ;;
      *) start "$kind" "$tr" ;;
    esac
    # A second of random reads to each server first, not counted: the first cell after a
    # start was at times a fraction of the same cell later (30-90 k against 160-320 k).
    for u in "$uri_ts" "$uri_kit" "$uri_qemu"; do
      secs=1 fio_run "$u" randread 4k 32 1 >/dev/null || true
    done
    for jobs in $jobs_list; do
      for w in $workloads; do
        read -r rw bs depth <<<"$(shape "$w")"
        ts=() kit=() qn=() cts=() ckit=() cqn=() kts=() kkit=() kqn=()
        for _ in $(seq "$runs"); do
          # Which server goes first turns from run to run: on the O_DIRECT devices the
          # first of two servers in a row ran 1 MiB writes 0.80-0.81x of the second,
          # whichever binary it was.
          order=(ts kit qemu)
          turn=$((turn + 1))
          for who in "${order[@]:turn%3}" "${order[@]:0:turn%3}"; do
            case $who in
              ts) read -r i c k <<<"$(measured "$pid_ts" "$uri_ts" "$rw" "$bs" "$depth" "$jobs")"; ts+=("$i"); cts+=("$c"); kts+=("$k") ;;
              kit) read -r i c k <<<"$(measured "$pid_kit" "$uri_kit" "$rw" "$bs" "$depth" "$jobs")"; kit+=("$i"); ckit+=("$c"); kkit+=("$k") ;;
              qemu) read -r i c k <<<"$(measured "$pid_qemu" "$uri_qemu" "$rw" "$bs" "$depth" "$jobs")"; qn+=("$i"); cqn+=("$c"); kqn+=("$k") ;;
            esac
          done
        done
        a=$(median "${ts[@]}") b=$(median "${kit[@]}") c=$(median "${qn[@]}")
        ca=$(median3 "${cts[@]}") cb=$(median3 "${ckit[@]}") cc=$(median3 "${cqn[@]}")
        note=""
        if [[ $kind == stripe* ]]; then
          ratio=$($py -c "print(f'{$a/max($b,1):.2f}')")
          scells=$((scells + 1))
          $py -c "import sys; sys.exit(0 if $a >= 0.9*$b else 1)" && smet=$((smet + 1))
        else
          best=$b
          [[ $kind == direct || $c -gt $b ]] && best=$c
          ratio=$($py -c "print(f'{$a/max($best,1):.2f}')")
          cells=$((cells + 1))
          $py -c "import sys; sys.exit(0 if $a >= 1.2*$best else 1)" && met=$((met + 1))
          $py -c "import sys; sys.exit(0 if $ca <= $cb else 1)" && cpu_ok=$((cpu_ok + 1))
          out_of_reach=0
          if [[ $kind != loop ]]; then
            alone "$kind-$jobs-$w" "$rw" "$bs" "$depth" "$jobs"
            if [[ -z $alone_iops || $alone_iops == 0 ]]; then
              note="; alone: fio moved nothing"
            else
              note="; alone $alone_iops"
              if $py -c "import sys; sys.exit(0 if 1.2*$best > $alone_iops else 1)"; then
                beyond=$((beyond + 1)) out_of_reach=1 note="$note (1.2x the peer is beyond it)"
              fi
            fi
          fi
          # The client's ceiling: fio's own CPU a request (the least of the three servers'
          # runs: a client waiting on a slow server spends more), so many requests a second
          # on as many cores as it has jobs (at most the machine's) with a server that cost
          # nothing.
          read -r kmin ceiling <<<"$($py -c 'import sys,statistics
def m(a): a=[float(x) for x in a.split() if x!="-"]; return statistics.median(a) if a else None
k=[x for x in map(m, sys.argv[1:4]) if x]
if not k: print("- -")
else: c=min(k); print(round(c,2), round(min(int(sys.argv[4]), int(sys.argv[5]))/c*1e6))' \
            "${kts[*]}" "${kkit[*]}" "${kqn[*]}" "$jobs" "$ncpu")"
          if [[ $ceiling != - ]]; then
            note="$note; client $kmin us a request: ceiling $ceiling"
            if $py -c "import sys; sys.exit(0 if 1.2*$best > $ceiling else 1)"; then
              beyond_client=$((beyond_client + 1)) out_of_reach=1 note="$note (1.2x the peer is beyond it)"
            fi
          fi
          ((out_of_reach == 0)) || unreachable=$((unreachable + 1))
          ((out_of_reach == 1)) || { reachable=$((reachable + 1)); $py -c "import sys; sys.exit(0 if $a >= 1.2*$best else 1)" && reach_met=$((reach_met + 1)); }
        fi
        if ((runs > 1)); then
          # The spread: each run's ratio (its servers measured back to back), least to most.
          note="$note; runs $($py -c 'import sys
t, k, q = (list(map(float, a.split())) for a in sys.argv[1:4])
stripe, direct = sys.argv[4] == "1", sys.argv[5] == "1"
r = sorted(a / max(b if stripe else (c if direct else max(b, c)), 1) for a, b, c in zip(t, k, q))
print(f"{r[0]:.2f}-{r[-1]:.2f}x")' "${ts[*]}" "${kit[*]}" "${qn[*]}" "$([[ $kind == stripe* ]] && echo 1 || echo 0)" "$([[ $kind == direct ]] && echo 1 || echo 0)")"
        fi
        printf '%-13s %-5s %-4s %-13s %10s %10s %10s %6sx   %s %s %s%s\n' "$kind" "$tr" "$jobs" "$w" "$a" "$b" "$c" "$ratio" "$ca" "$cb" "$cc" "$note"
      done
    done
    stop
  done
done
((cells == 0)) || echo "cells at >= 1.2x the best peer: $met of $cells; tagstripe's CPU per GiB at most nbdkit's: $cpu_ok of $cells; cells where 1.2x the best peer is beyond the device alone: $beyond, beyond the client's ceiling: $beyond_client, beyond either: $unreachable; of the other $reachable cells, $reach_met at >= 1.2x"
((scells == 0)) || echo "striped volume at >= 0.9x of the one device served alone: $smet of $scells"

[[ $tls == 1 ]] || exit 0
# TLS: 1 MiB reads, 4 jobs x QD4, on the shm file over Unix sockets, tagstripe and nbdkit
# (qemu-nbd left out: its TLS needs a TCP socket). Test certificates: a CA and a server
# certificate for localhost (what nbds+unix checks); libnbd finds the CA in
# $HOME/.pki/libnbd (fio's engine cannot pass tls-certificates).
pki="$dir/pki"
mkdir -p "$pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=bench CA" -keyout "$pki/ca-key.pem" -out "$pki/ca-cert.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$pki/server-key.pem" -out "$pki/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$pki/ext.cnf"
openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca-cert.pem" -CAkey "$pki/ca-key.pem" \
  -CAcreateserial -days 2 -extfile "$pki/ext.cnf" -out "$pki/server-cert.pem" 2>/dev/null
ln -sfn "$pki" "$dir/home/.pki/libnbd"
"$ts_bin" serve --listen "unix:$dir/ts.sock" --export disk --tls on --tls-certificates "$pki" \
  "$img" >"$dir/serve.out" 2>&1 &
pid_ts=$!
nbdkit --unix "$dir/kit.sock" --pidfile "$dir/kit.pid" --exportname disk \
  --tls=on --tls-certificates="$pki" file "$img"
wait_for "$dir/ts.sock"
wait_for "$dir/kit.pid"
pid_kit=$(cat "$dir/kit.pid")
servers=("$pid_ts" "$pid_kit")
for mode in plain tls; do
  s=nbd; [[ $mode == tls ]] && s=nbds
  ts=() kit=()
  for _ in $(seq "$runs"); do
    read -r i _ <<<"$(fio_run "$s+unix:///disk?socket=$dir/ts.sock" read 1M 4 4)"; ts+=("$i")
    read -r i _ <<<"$(fio_run "$s+unix:///disk?socket=$dir/kit.sock" read 1M 4 4)"; kit+=("$i")
  done
  a=$(median "${ts[@]}") b=$(median "${kit[@]}")
  printf '1 MiB reads, 4 jobs x QD4, %-5s tagstripe %6s  nbdkit %6s  %sx\n' "$mode:" "$a" "$b" \
    "$($py -c "print(f'{$a/$b:.2f}')")"
done
