#!/usr/bin/env bash
# benchmarks/side_by_side/run.sh: tileattn and PyTorch's CPU scaled_dot_product_attention on
# the same shapes and thread counts, one after the other in one session (the numbers of
# docs/performance.md's Xeon tables): 16 threads, then 2 pinned to cores 0-1 with taskset;
# R (default 9) timed runs each, median and min-max. BEFORE=DIR adds a build against an
# older commit's include/ directory, timed first.
#   bash benchmarks/side_by_side/run.sh            # needs g++ and python3 with torch
set -u
cd "$(dirname "$0")/../.."
F="-std=c++20 -O3 -march=native -fopenmp"
g++ $F -Iinclude benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_timer
[ -n "${BEFORE:-}" ] && g++ $F -I"$BEFORE" benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_timer_before
R=${R:-9}
for shape in "2048 128 16 16 0" "2048 128 16 16 1" "4096 128 16 16 0" "2048 128 32 8 1"; do
  for t in 16 2; do
    pin=""; [ "$t" = 2 ] && pin="taskset -c 0,1"
    echo "--- N d Hq Hkv causal = $shape, $t threads"
    [ -n "${BEFORE:-}" ] && $pin /tmp/tileattn_timer_before $shape $t $R | sed 's/^/before  /'
    $pin /tmp/tileattn_timer $shape $t $R | sed 's/^/tileattn /'
    OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa.py $shape $t $R
  done
done
