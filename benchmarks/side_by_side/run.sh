#!/usr/bin/env bash
# benchmarks/side_by_side/run.sh: tileattn and PyTorch's CPU scaled_dot_product_attention on
# the same shapes and thread counts, one after the other in one session (the numbers of
# docs/performance.md's Xeon tables): 16 threads, then 2 pinned to cores 0-1 with taskset;
# R (default 9) timed runs each, median and min-max. BEFORE=DIR adds a build against an
# older commit's include/ directory, timed first (fp32 section only).
#
# Then a compact table, fp32 and bf16 (DTYPES), of TABLE_SHAPE (N d Hq Hkv, default 2048 128
# 16 16; batch 1) non-causal and causal at THREADS (default "16 2"; fewer threads than cores
# are pinned to cores 0..t-1): GFLOP/s median (min-max) of R runs for each, and the ratio of
# the medians, tileattn / PyTorch (and tileattn / OpenVINO where python3 imports openvino).
# Same inputs: N(0, 1), rounded to the type. CEILINGS=1 first prints the ceilings measured
# in tileattn's timer at each thread count (FMA, vdpbf16ps and AMX loops, streaming read).
#   bash benchmarks/side_by_side/run.sh                 # needs g++ and python3 with torch
#   TABLE_ONLY=1 R=15 bash benchmarks/side_by_side/run.sh   # only the fp32/bf16 table
set -u
cd "$(dirname "$0")/../.."
F="-std=c++20 -O3 -march=native -fopenmp"
g++ $F -Iinclude benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_timer || exit 1
[ -n "${BEFORE:-}" ] && g++ $F -I"$BEFORE" benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_timer_before
R=${R:-9}
if [ -z "${TABLE_ONLY:-}" ]; then
for shape in "2048 128 16 16 0" "2048 128 16 16 1" "4096 128 16 16 0" "2048 128 32 8 1"; do
  for t in 16 2; do
    pin=""; [ "$t" = 2 ] && pin="taskset -c 0,1"
    echo "--- N d Hq Hkv causal = $shape, $t threads"
    [ -n "${BEFORE:-}" ] && $pin /tmp/tileattn_timer_before $shape $t $R | sed 's/^/before  /'
    $pin /tmp/tileattn_timer $shape $t $R | sed 's/^/tileattn /'
    OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa.py $shape $t $R
  done
done
fi

# "median min max" from a timer's line (empty if it printed none).
stats() { awk '{for (i = 1; i < NF; i++) { if ($i == "median") m = $(i+1); if ($i == "min") lo = $(i+1); if ($i == "max") hi = $(i+1) }}
               END { if (m != "") print m, lo, hi }'; }
DTYPES=${DTYPES:-fp32 bf16}
THREADS=${THREADS:-16 2}
read -r TN TD THQ THKV <<< "${TABLE_SHAPE:-2048 128 16 16}"
CORES=$(nproc)
echo
# OpenVINO's SDPA as a third column where python3 can import openvino (bf16 and fp32, equal heads).
HAVE_OV=0; python3 -c "import openvino" 2> /dev/null && [ "$THQ" = "$THKV" ] && HAVE_OV=1
echo "=== N $TN d $TD H $THQ/$THKV B 1: GFLOP/s median (min-max) of $R runs; ratio = tileattn / peer medians"
[ -n "${CEILINGS:-}" ] && for t in $THREADS; do
  pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
  CEILINGS=1 $pin /tmp/tileattn_timer 64 64 1 1 0 $t 1 fp32 | grep ceilings
done
printf "%-5s %-6s %3s  %-25s %-25s %-25s %9s %9s\n" type mask thr tileattn torch openvino "/torch" "/openvino"
for dt in $DTYPES; do
  for c in 0 1; do
    for t in $THREADS; do
      pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
      a=$($pin /tmp/tileattn_timer $TN $TD $THQ $THKV $c $t $R $dt | stats)
      b=$(OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa.py $TN $TD $THQ $THKV $c $t $R $dt | stats)
      o=""; [ "$HAVE_OV" = 1 ] && [ "$dt" != fp16 ] &&
        o=$($pin python3 benchmarks/side_by_side/openvino_sdpa.py $TN $TD $THQ $THKV $c $t $R $dt | stats)
      awk -v dt="$dt" -v c="$c" -v t="$t" -v a="$a" -v b="$b" -v o="$o" 'function cell(n, x) {
          return n == 3 ? sprintf("%7.1f (%.1f-%.1f)", x[1], x[2], x[3]) : sprintf("%7s", "n/a") }
        function ratio(na, nb, y) { return na == 3 && nb == 3 && y[1] > 0 ? sprintf("%9.2f", x[1] / y[1]) : "      n/a" }
        BEGIN {
        na = split(a, x, " "); nb = split(b, y, " "); no = split(o, z, " ");
        printf "%-5s %-6s %3d  %-25s %-25s %-25s %s %s\n", dt, c ? "causal" : "full", t, cell(na, x), cell(nb, y),
               cell(no, z), ratio(na, nb, y), ratio(na, no, z) }'
    done
  done
done
