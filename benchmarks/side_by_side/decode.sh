#!/usr/bin/env bash
# benchmarks/side_by_side/decode.sh: tileattn's paged decode step and PyTorch's CPU SDPA on the
# same K/V held contiguously (docs/paged.md's Xeon table), one after the other in one session:
# R (default 9) timed runs each, median and min-max K/V GB/s, and the ratio of the medians.
# Both read FLUSH_MB (default 1024) MiB before every run, so K/V come from memory (the Xeon's
# 300 MiB L3 holds a B 8, 4k bf16 cache whole). tileattn runs each LAYOUT (token: FlashAttention's
# [page, token, head, dim] pools; head: [page, head, token, dim], KvCacheConfig::layout);
# PyTorch has no 8-bit SDPA, so its column is n/a for int8 and fp8. Fewer threads than cores are
# pinned to cores 0..t-1. tileattn's lines end with a hash of O: equal hashes across thread
# counts are bitwise-equal outputs.
#   bash benchmarks/side_by_side/decode.sh     # needs g++ and python3 with torch
#   SHAPES="8 4096 32 8 128" THREADS="16 2" DTYPES="fp32 bf16 int8 fp8" LAYOUTS="token head" R=9 \
#     bash benchmarks/side_by_side/decode.sh
set -u
cd "$(dirname "$0")/../.."
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/decode_timer.cpp -o /tmp/tileattn_decode_timer || exit 1
R=${R:-9}
THREADS=${THREADS:-16 2}
DTYPES=${DTYPES:-fp32 bf16 int8 fp8}
LAYOUTS=${LAYOUTS:-token head}
SHAPES=${SHAPES:-"8 4096 32 8 128;8 16384 32 8 128;1 32768 32 8 128;1 131072 32 8 128"}
CORES=$(nproc)
stats() { awk '{for (i = 1; i < NF; i++) { if ($i == "median") m = $(i+1); if ($i == "min") lo = $(i+1); if ($i == "max") hi = $(i+1); if ($i == "hash") h = $(i+1); if ($i == "of_stream") f = $(i+1) }}
               END { if (m != "") print m, lo, hi, h, f }'; }
echo "=== decode (1 query token), caches flushed: K/V GB/s median (min-max) of $R runs; ratio = tileattn / torch"
printf "%-11s %-22s %3s  %-25s %-25s %6s %9s  %s\n" "type layout" "B ctx Hq Hkv d" thr tileattn torch ratio of_stream "tileattn O hash"
IFS=';' read -r -a shapes <<< "$SHAPES"
for dt in $DTYPES; do
  for shape in "${shapes[@]}"; do
    for t in $THREADS; do
      pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
      b=""
      case $dt in fp32|bf16) b=$(OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa_decode.py $shape $t $R $dt | stats) ;; esac
      for layout in $LAYOUTS; do
      a=$(LAYOUT=$layout $pin /tmp/tileattn_decode_timer $shape $t $R $dt | stats)
      awk -v dt="$dt $layout" -v s="$shape" -v t="$t" -v a="$a" -v b="$b" 'BEGIN {
        na = split(a, x, " "); nb = split(b, y, " ");
        sa = na >= 3 ? sprintf("%7.2f (%.2f-%.2f)", x[1], x[2], x[3]) : sprintf("%7s", "n/a");
        sb = nb >= 3 ? sprintf("%7.2f (%.2f-%.2f)", y[1], y[2], y[3]) : sprintf("%7s", "n/a");
        r = na >= 3 && nb >= 3 && y[1] > 0 ? sprintf("%6.2f", x[1] / y[1]) : "   n/a";
        printf "%-11s %-22s %3d  %-25s %-25s %6s %9s  %s\n", dt, s, t, sa, sb, r, na == 5 ? x[5] : "", na == 5 ? x[4] : "" }'
      done
    done
  done
done
