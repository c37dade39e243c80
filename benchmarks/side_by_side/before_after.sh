#!/usr/bin/env bash
# benchmarks/side_by_side/before_after.sh: the bf16 forward built against an older commit's
# headers (BEFORE=DIR, an include/ directory, e.g. from `git archive OLD include | tar -x -C
# /tmp/old`) and against these, alternated twice on each workload, with PyTorch's SDPA on the
# H 16 N 2048 rows (the numbers of docs/performance.md's issue 45 tables). THREADS (default
# "2 16"; fewer than the cores are pinned to cores 0..t-1), R (default 7) runs a median.
# QSCALE rows: Q times 30, the rows whose 2^x fall below 2^-126 (forward_timer says why).
#   BEFORE=/tmp/old/include bash benchmarks/side_by_side/before_after.sh
set -u
cd "$(dirname "$0")/../.."
[ -n "${BEFORE:-}" ] || { echo "BEFORE=DIR (an include/ directory) is required"; exit 2; }
F="-std=c++20 -O3 -march=native -fopenmp"
g++ $F -Iinclude benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_after &
g++ $F -I"$BEFORE" benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_before &
wait
R=${R:-7}
CORES=$(nproc)
med() { grep -o 'median *[0-9.]*' | awk '{print $2}'; }
for t in ${THREADS:-2 16}; do
  pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
  CEILINGS=1 $pin /tmp/tileattn_after 64 64 1 1 0 "$t" 1 bf16 | grep ceilings
  for w in "1 2048 128 16 16 0" "1 2048 128 16 16 1" "4 512 64 16 16 1"; do
    set -- $w; b=$1; shift
    x=$(BATCH=$b $pin /tmp/tileattn_before "$@" "$t" "$R" bf16 | med)
    y=$(BATCH=$b $pin /tmp/tileattn_after "$@" "$t" "$R" bf16 | med)
    z=""; [ "$1" = 2048 ] && python3 -c "import torch" 2> /dev/null &&
      z=$(BATCH=$b OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa.py "$@" "$t" "$R" bf16 | med)
    x2=$(BATCH=$b $pin /tmp/tileattn_before "$@" "$t" "$R" bf16 | med)
    y2=$(BATCH=$b $pin /tmp/tileattn_after "$@" "$t" "$R" bf16 | med)
    echo "bf16 $t threads, B $b, N d Hq Hkv causal = $*: before $x $x2, after $y $y2, PyTorch ${z:-n/a}"
  done
done
for dt in bf16 fp32; do
  pin=""; [ 2 -lt "$CORES" ] && pin="taskset -c 0-1"
  echo "QSCALE 30, $dt, 2 threads, N 1024 d 128 H 16: before" \
    "$(QSCALE=30 $pin /tmp/tileattn_before 1024 128 16 16 0 2 3 $dt | med), after" \
    "$(QSCALE=30 $pin /tmp/tileattn_after 1024 128 16 16 0 2 3 $dt | med)"
done
