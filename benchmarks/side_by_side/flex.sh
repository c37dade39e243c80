#!/usr/bin/env bash
# benchmarks/side_by_side/flex.sh: tileattn's forward_flex and PyTorch's flex_attention
# (torch.compile'd on the CPU) on bench_flex's three workloads at H 16, d 128, B 1 (causal N
# 4096; document 8 x 1024 packed in 8192; block-sparse N 8192 at 10% of 128 x 128 blocks, the
# same layout on both sides), one after the other in one session: R (default 9) timed runs
# each after a warm-up (torch's: the compiling call, timed apart), GFLOP/s median (min-max)
# counting 4 d FLOPs per visible score, and the ratio of the medians, tileattn / torch, at
# THREADS (default "16 2"; fewer threads than cores are pinned to cores 0..t-1 with taskset).
# Block masks (128 x 128 blocks) are built once, outside the timing, on both sides.
# Columns: "compile s" is torch's first call (shorter when inductor's on-disk cache already
# holds the kernels; TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 compiles cold); "mask" is ok when both sides counted the same
# visible scores and block layout (flex_timer.cpp, torch_flex.py), else MISMATCH.
#   bash benchmarks/side_by_side/flex.sh                       # needs g++ and python3 with torch
#   DTYPES="fp32 bf16" R=15 bash benchmarks/side_by_side/flex.sh
#   THREADS=2 R=2 FLEX_SCALE=0.25 bash benchmarks/side_by_side/flex.sh   # quick smoke test
# WORKLOADS (default "causal document block_sparse") picks some; FLEX_SCALE=s scales every
# length by s (rounded to multiples of 128).
set -u
cd "$(dirname "$0")/../.."
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/flex_timer.cpp -o /tmp/tileattn_flex_timer || exit 1
R=${R:-9}
THREADS=${THREADS:-16 2}
DTYPES=${DTYPES:-fp32}
WORKLOADS=${WORKLOADS:-causal document block_sparse}
CORES=$(nproc)
err=$(mktemp); trap 'rm -f "$err"' EXIT
# "median min max visible blocks" from a timer's line (empty if it printed none).
stats() { awk '{for (i = 1; i < NF; i++) { if ($i == "median") m = $(i+1); if ($i == "min") lo = $(i+1); if ($i == "max") hi = $(i+1);
                                            if ($i == "visible") vis = $(i+1); if ($i == "blocks") b = $(i+1) }}
               END { if (m != "") print m, lo, hi, vis, b }'; }
echo "=== flex attention, B 1, H 16, d 128${FLEX_SCALE:+, lengths x $FLEX_SCALE}: GFLOP/s (4 d per visible score) median (min-max) of $R runs; ratio = tileattn / torch"
printf "%-5s %-12s %5s %3s  %-25s %-25s %6s  %9s  %s\n" type workload N thr tileattn torch ratio "compile s" mask
for dt in $DTYPES; do
  for w in $WORKLOADS; do
    for t in $THREADS; do
      pin=""; [ "$t" -lt "$CORES" ] && pin="taskset -c 0-$((t - 1))"
      line=$($pin /tmp/tileattn_flex_timer $w $t $R $dt)
      a=$(stats <<< "$line")
      n=$(awk '{for (i = 1; i < NF; i++) if ($i == "N") { print $(i+1); exit }}' <<< "$line")
      b=$(OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_flex.py $w $t $R $dt 2>"$err" | stats)
      c=$(sed -n 's/.*compile (first call) \([0-9.]*\) s.*/\1/p' "$err")
      [ -z "$b" ] && { echo "torch_flex.py $w $t $R $dt failed:" >&2; tail -5 "$err" >&2; }
      awk -v dt="$dt" -v w="$w" -v n="$n" -v t="$t" -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
        na = split(a, x, " "); nb = split(b, y, " ");
        sa = na >= 3 ? sprintf("%7.1f (%.1f-%.1f)", x[1], x[2], x[3]) : sprintf("%7s", "n/a");
        sb = nb >= 3 ? sprintf("%7.1f (%.1f-%.1f)", y[1], y[2], y[3]) : sprintf("%7s", "n/a");
        r = na >= 3 && nb >= 3 && y[1] > 0 ? sprintf("%6.2f", x[1] / y[1]) : "   n/a";
        m = na == 5 && nb == 5 ? (x[4] == y[4] && x[5] == y[5] ? "ok" : "MISMATCH") : "";
        printf "%-5s %-12s %5s %3d  %-25s %-25s %6s  %9s  %s\n", dt, w, n, t, sa, sb, r, c == "" ? "n/a" : c, m }'
    done
  done
done
