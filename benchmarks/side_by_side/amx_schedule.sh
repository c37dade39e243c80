#!/usr/bin/env bash
# benchmarks/side_by_side/amx_schedule.sh: the bf16 forward's AMX schedules side by side in one
# process per shape (forward_timer's SLABS: each slab height in turn within every repeat), with
# the AMX loop measured first at each thread count. For the Xeon (docs/performance.md).
#   SLABS="0 32" PANELS="128 512" R=7 THREADS="1 2" bash benchmarks/side_by_side/amx_schedule.sh
# PANELS 0: the micro-kernel set's panel (512 keys on AMX tiles); SLABS 0: no panels (the
# schedule before issue 29). TORCH=1 adds PyTorch's SDPA on each shape right after (bf16,
# the same BATCH and threads, benchmarks/side_by_side/torch_sdpa.py).
# SHAPES: "B N d Hq Hkv causal" entries separated by ';'. THREADS: 1 runs pinned to core 2,
# t > 1 to cores 0..t-1 (all cores unpinned).
set -u
cd "$(dirname "$0")/../.."
g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/forward_timer.cpp -o /tmp/tileattn_timer || exit 1
R=${R:-7}
CORES=$(nproc)
SHAPES=${SHAPES:-"1 2048 128 16 16 0;1 2048 128 16 16 1;4 512 64 16 16 1;1 2048 128 32 8 1"}
for t in ${THREADS:-1 2}; do
  pin=""
  if [ "$t" = 1 ]; then pin="taskset -c $((CORES > 2 ? 2 : 0))"; elif [ "$t" -lt "$CORES" ]; then pin="taskset -c 0-$((t - 1))"; fi
  CEILINGS=1 $pin /tmp/tileattn_timer 64 64 1 1 0 "$t" 1 fp32 | grep ceilings
  IFS=';' read -ra list <<< "$SHAPES"
  for shape in "${list[@]}"; do
    read -r b n d hq hkv c <<< "$shape"
    BATCH=$b SLABS="${SLABS:-0 64}" PANELS="${PANELS:-0}" $pin /tmp/tileattn_timer "$n" "$d" "$hq" "$hkv" "$c" "$t" "$R" bf16
    [ -n "${TORCH:-}" ] && BATCH=$b OMP_NUM_THREADS=$t $pin python3 benchmarks/side_by_side/torch_sdpa.py "$n" "$d" "$hq" "$hkv" "$c" "$t" "$R" bf16
  done
done
