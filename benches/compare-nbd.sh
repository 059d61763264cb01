#!/usr/bin/env bash
# Side by side in one run: `tagstripe serve`, nbdkit's file plugin and qemu-nbd serving the
# same 512 MiB file in /dev/shm over Unix sockets, driven by fio's nbd engine (libnbd).
#   usage: benches/compare-nbd.sh [SECONDS] [RUNS]
# Workloads: 4 KiB random read/write 50/50 at 4 jobs x QD32, and 1 MiB sequential reads at
# 4 jobs x QD4, in the clear; then the 1 MiB reads over TLS (`serve --tls on`, `nbdkit
# --tls=on`, certificates made here by openssl, nbds+unix URIs) to show what TLS costs.
# Each cell is the median of RUNS runs (servers alternated, so drift hits all alike); the
# last column is tagstripe / nbdkit.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
runs=${2:-3}
for t in fio nbdkit qemu-nbd openssl; do
  command -v "$t" >/dev/null || { echo "$t is missing (Debian: fio, nbdkit, qemu-utils)"; exit 2; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine"; exit 2; }
cargo build --release -q -p tagstripe-cli
dir=$(mktemp -d /dev/shm/tagstripe-nbd.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
img="$dir/disk.img"
dd if=/dev/urandom of="$img" bs=1M count=512 status=none

# Test certificates: a CA and a server certificate for localhost (what nbds+unix checks).
pki="$dir/pki"
mkdir -p "$pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=bench CA" -keyout "$pki/ca-key.pem" -out "$pki/ca-cert.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$pki/server-key.pem" -out "$pki/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$pki/ext.cnf"
openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca-cert.pem" -CAkey "$pki/ca-key.pem" \
  -CAcreateserial -days 2 -extfile "$pki/ext.cnf" -out "$pki/server-cert.pem" 2>/dev/null

./target/release/tagstripe serve --listen "unix:$dir/ts.sock" --export disk \
  --tls on --tls-certificates "$pki" "$img" >"$dir/serve.out" 2>&1 &
pids+=($!)
nbdkit --unix "$dir/kit.sock" --pidfile "$dir/kit.pid" --exportname disk \
  --tls=on --tls-certificates="$pki" file "$img"
qemu-nbd -f raw -k "$dir/qemu.sock" -x disk --persistent --fork -e 16 \
  --pid-file "$dir/qemu.pid" "$img"
for f in "$dir/ts.sock" "$dir/kit.pid" "$dir/qemu.pid"; do
  for _ in $(seq 100); do [[ -e $f ]] && break; sleep 0.1; done
done
pids+=("$(cat "$dir/kit.pid")" "$(cat "$dir/qemu.pid")")

uri() {
  case $1 in
    # libnbd finds the CA in $HOME/.pki/libnbd (fio's engine cannot pass tls-certificates).
    *-tls) echo "nbds+unix:///disk?socket=$dir/${1%-tls}.sock" ;;
    *) echo "nbd+unix:///disk?socket=$dir/$1.sock" ;;
  esac
}
# fio, one workload against one server: prints IOPS (all jobs, reads and writes).
mkdir -p "$dir/home/.pki"
ln -s "$pki" "$dir/home/.pki/libnbd"
run() { # server rw bs depth
  HOME=$dir/home fio --name=w --ioengine=nbd --uri="$(uri "$1")" --rw="$2" --rwmixread=50 --bs="$3" \
    --iodepth="$4" --numjobs=4 --group_reporting --time_based --runtime="$secs" \
    --size=512M --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}
median() { python3 -c 'import sys,statistics; print(round(statistics.median(map(float,sys.argv[1:]))))' "$@"; }

printf '%-30s %12s %12s %12s %8s\n' workload tagstripe nbdkit qemu-nbd ts/kit
tls_rows=()
for w in "4k-randrw-4x32 randrw 4k 32" "1m-seqread-4x4 read 1M 4"; do
  set -- $w
  name=$1 rw=$2 bs=$3 depth=$4
  ts=() kit=() qn=()
  for _ in $(seq "$runs"); do
    ts+=("$(run ts "$rw" "$bs" "$depth")")
    kit+=("$(run kit "$rw" "$bs" "$depth")")
    qn+=("$(run qemu "$rw" "$bs" "$depth")")
  done
  a=$(median "${ts[@]}") b=$(median "${kit[@]}") c=$(median "${qn[@]}")
  printf '%-30s %12s %12s %12s %8s\n' "$name (IOPS)" "$a" "$b" "$c" \
    "$(python3 -c "print(f'{$a/$b:.2f}x')")"
done
# TLS: the 1 MiB reads again, through TLS (qemu-nbd left out: its TLS needs a TCP socket).
plain_ts=$a plain_kit=$b
ts=() kit=()
for _ in $(seq "$runs"); do
  ts+=("$(run ts-tls read 1M 4)")
  kit+=("$(run kit-tls read 1M 4)")
done
a=$(median "${ts[@]}") b=$(median "${kit[@]}")
printf '%-30s %12s %12s %12s %8s\n' "1m-seqread-4x4 TLS (IOPS)" "$a" "$b" "-" \
  "$(python3 -c "print(f'{$a/$b:.2f}x')")"
python3 -c "print(f'TLS keeps {$a/$plain_ts:.0%} of tagstripe\'s plain 1 MiB reads, {$b/$plain_kit:.0%} of nbdkit\'s')"
