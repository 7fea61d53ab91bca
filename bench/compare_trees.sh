#!/usr/bin/env bash
# Run the inventory, sweep and bring-up benches in two trees of mctl, one after the other on this machine
# (bench/README.md "Session 11 (issue 26)"). Each tree must be a checkout with its own .venv
# (scripts/install); each bench starts its own 18-tray lab and takes it down.
#   sudo bench/compare_trees.sh BEFORE_DIR AFTER_DIR [OUT_DIR]
# Writes OUT_DIR/{inventory,health,bringup}-{before,after}.json and a log with the load at each start/end.
set -u
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_DIR AFTER_DIR [OUT_DIR]" >&2; exit 2; }
before=$1; after=$2; out=${3:-/tmp/mctl-compare}; mkdir -p "$out"
run() {  # which dir name bench args...
  which=$1; dir=$2; name=$3; shift 3
  echo "== $(date -u +%T) $which $name load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log"
  ( cd "$dir" && timeout 2400 .venv/bin/python "$@" > "$out/$name-$which.json" 2> "$out/$name-$which.err"
    echo "rc $?" >> "$out/$name-$which.err" )
  echo "   $(date -u +%T) done $(tail -1 "$out/$name-$which.err") load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log"
}
run before "$before" inventory bench/inventory_bench.py --trays 18 --rounds 7 --json
run after "$after" inventory bench/inventory_bench.py --trays 18 --rounds 7 --json
run after "$after" health bench/health_bench.py --trays 18 --sweeps 10 --json
run before "$before" health bench/health_bench.py --trays 18 --sweeps 10 --json
run before "$before" bringup bench/bringup_bench.py --trays 18 --json
run after "$after" bringup bench/bringup_bench.py --trays 18 --json
