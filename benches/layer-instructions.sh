#!/usr/bin/env bash
# The instructions the layers cost a 4 KiB write, counted by valgrind's callgrind (the same
# from run to run, where the time on a shared VM moves by 10-20%): the `layer-cost` example
# run twice per mode, with COUNT and 6 x COUNT writes, the difference divided by 5 x COUNT
# (the setup, counted in both, falls out). Prints instructions a write straight to the
# memory devices, through a tagged queue over each, and through the striped volume, and what
# each layer adds; then, the same way with the `session-cost` example, what the NBD
# protocol's state machine costs a 4 KiB request (32 at a time, half reads, half writes),
# without the copy of the requests into its buffer (a socket read's, counted alone).
# With KEEP=DIR, the larger run's callgrind profile of each mode is kept in DIR
# (`callgrind_annotate DIR/volume.out` shows where the instructions go; `session.out`).
#
# usage: benches/layer-instructions.sh [COUNT]   (COUNT 20000 by default; about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-20000}
command -v valgrind >/dev/null || { echo "valgrind is missing (Debian: valgrind)"; exit 2; }
cargo build --release -q -p tagstripe-benches --example layer-cost --example session-cost
bin=$PWD/target/release/examples/layer-cost
session_bin=$PWD/target/release/examples/session-cost
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ir() { # mode count file -> instructions ("session": the session-cost example)
  local run=("$bin" "$1" "$2")
  [[ $1 == session ]] && run=("$session_bin" "$2")
  [[ $1 == copy ]] && run=("$session_bin" "$2" copy)
  valgrind --tool=callgrind --callgrind-out-file="$3" "${run[@]}" >/dev/null 2>"$out/err" ||
    { cat "$out/err"; exit 1; }
  awk '/^summary:/ {print $2}' "$3"
}
declare -A per
for mode in device queued volume session copy; do
  a=$(ir "$mode" "$count" "$out/$mode-small.out")
  b=$(ir "$mode" $((6 * count)) "$out/$mode.out")
  per[$mode]=$(((b - a) / (5 * count)))
  if [[ -n ${KEEP:-} ]]; then mkdir -p "$KEEP" && cp "$out/$mode.out" "$KEEP/"; fi
done
printf '%-32s %8s\n' "a 4 KiB write, one at a time" "instr."
printf '%-32s %8d\n' "straight to a memory device" "${per[device]}"
printf '%-32s %8d   (the queue: %d)\n' "through a tagged queue" "${per[queued]}" \
  $((per[queued] - per[device]))
printf '%-32s %8d   (striping, split, accounting: %d)\n' "through the striped volume" \
  "${per[volume]}" $((per[volume] - per[queued]))
printf '%-32s %8d   (and the copy of the requests into its buffer: %d)\n' \
  "the NBD session, a 4 KiB request" $((per[session] - per[copy])) "${per[copy]}"
