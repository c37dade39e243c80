#!/usr/bin/env bash
# benchmarks/side_by_side/decode.sh: tileattn's paged decode step and PyTorch's CPU SDPA on the
# same K/V held contiguously (docs/paged.md's Xeon table), one after the other in one session:
# R (default 9) timed runs each, median and min-max K/V GB/s, and the ratio of the medians.
# Fewer threads than cores are pinned to cores 0..t-1. tileattn's lines end with a hash of O:
# equal hashes across thread counts are bitwise-equal outputs.
#   bash benchmarks/side_by_side/decode.sh     # needs g++ and python3 with torch
#   SHAPES="8 4096 32 8 128" THREADS="16 2" DTYPES="fp32 bf16" R=9 bash benchmarks/side_by_side/decode.sh
set -u
cd "$(dirname "$0")/../.."
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/decode_timer.cpp -o /tmp/tileattn_decode_timer || exit 1
R=${R:-9}
THREADS=${THREADS:-16 2}
DTYPES=${DTYPES:-fp32 bf16}
SHAPES=${SHAPES:-"8 1024 32 8 128;8 4096 32 8 128;8 16384 32 8 128;1 16384 32 8 128;1 65536 32 8 128"}
CORES=$(nproc)
stats() { awk '{for (i = 1; i < NF; i++) { if ($i == "median") m = $(i+1); if ($i == "min") lo = $(i+1); if ($i == "max") hi = $(i+1); if ($i == "hash") h = $(i+1); if ($i == "of_stream") f = $(i+1) }}
               END { if (m != "") print m, lo, hi, h, f }'; }
echo "=== decode (1 query token): K/V GB/s median (min-max) of $R runs; ratio = tileattn / torch"
printf "%-5s %-22s %3s  %-25s %-25s %6s %9s  %s\n" type "B ctx Hq Hkv d" thr tileattn torch ratio of_stream "tileattn O hash"
IFS=';' read -r -a shapes <<< "$SHAPES"
for dt in $DTYPES; do
  for shape in "${shapes[@]}"; do
    for t in $THREADS; do
      pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
      a=$($pin /tmp/tileattn_decode_timer $shape $t $R $dt | stats)
      b=$(OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa_decode.py $shape $t $R $dt | stats)
      awk -v dt="$dt" -v s="$shape" -v t="$t" -v a="$a" -v b="$b" 'BEGIN {
        na = split(a, x, " "); nb = split(b, y, " ");
        sa = na >= 3 ? sprintf("%7.2f (%.2f-%.2f)", x[1], x[2], x[3]) : sprintf("%7s", "n/a");
        sb = nb >= 3 ? sprintf("%7.2f (%.2f-%.2f)", y[1], y[2], y[3]) : sprintf("%7s", "n/a");
        r = na >= 3 && nb >= 3 && y[1] > 0 ? sprintf("%6.2f", x[1] / y[1]) : "   n/a";
        printf "%-5s %-22s %3d  %-25s %-25s %6s %9s  %s\n", dt, s, t, sa, sb, r, na == 5 ? x[5] : "", na == 5 ? x[4] : "" }'
    done
  done
done
