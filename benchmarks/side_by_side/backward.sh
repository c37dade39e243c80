#!/usr/bin/env bash
# benchmarks/side_by_side/backward.sh: tileattn's forward + backward and PyTorch's CPU SDPA
# forward + backward (autograd) on the same shapes and thread counts, one after the other
# in one session (docs/backward.md's Xeon table): R (default 7) timed runs each, median and
# min-max GFLOP/s (3.5x the forward's FLOPs), and the ratio of the medians. Fewer threads
# than cores are pinned to cores 0..t-1. tileattn's lines end with a hash of dQ, dK, dV:
# equal hashes across thread counts are bitwise-equal gradients.
#   bash benchmarks/side_by_side/backward.sh     # needs g++ and python3 with torch
#   SHAPES="2048 128 16 16 0" THREADS="16 2" DTYPES="fp32 bf16" R=7 bash benchmarks/side_by_side/backward.sh
set -u
cd "$(dirname "$0")/../.."
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/backward_timer.cpp -o /tmp/tileattn_bwd_timer || exit 1
R=${R:-7}
THREADS=${THREADS:-16 2}
DTYPES=${DTYPES:-fp32 bf16}
SHAPES=${SHAPES:-"2048 128 16 16 0;2048 64 16 16 1;2048 128 4 4 0"}
CORES=$(nproc)
stats() { awk '{for (i = 1; i < NF; i++) { if ($i == "median") m = $(i+1); if ($i == "min") lo = $(i+1); if ($i == "max") hi = $(i+1); if ($i == "hash") h = $(i+1) }}
               END { if (m != "") print m, lo, hi, h }'; }
echo "=== forward + backward, B 1: GFLOP/s (3.5x forward FLOPs) median (min-max) of $R runs; ratio = tileattn / torch"
printf "%-5s %-22s %3s  %-25s %-25s %6s  %s\n" type "N d Hq Hkv causal" thr tileattn torch ratio "tileattn grad hash"
IFS=';' read -r -a shapes <<< "$SHAPES"
for dt in $DTYPES; do
  for shape in "${shapes[@]}"; do
    for t in $THREADS; do
      pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
      a=$($pin /tmp/tileattn_bwd_timer $shape $t $R $dt | stats)
      b=$(OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa_backward.py $shape $t $R $dt | stats)
      awk -v dt="$dt" -v s="$shape" -v t="$t" -v a="$a" -v b="$b" 'BEGIN {
        na = split(a, x, " "); nb = split(b, y, " ");
        sa = na >= 3 ? sprintf("%7.1f (%.1f-%.1f)", x[1], x[2], x[3]) : sprintf("%7s", "n/a");
        sb = nb >= 3 ? sprintf("%7.1f (%.1f-%.1f)", y[1], y[2], y[3]) : sprintf("%7s", "n/a");
        r = na >= 3 && nb >= 3 && y[1] > 0 ? sprintf("%6.2f", x[1] / y[1]) : "   n/a";
        printf "%-5s %-22s %3d  %-25s %-25s %6s  %s\n", dt, s, t, sa, sb, r, na == 4 ? x[4] : "" }'
    done
  done
done
