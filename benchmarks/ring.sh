#!/usr/bin/env bash
# benchmarks/ring.sh: ring attention (bench_ring, distributed/ring.hpp) at P = 2 and 4 ranks
# on this machine: causal zig-zag, causal contiguous and non-causal, forward and backward,
# fp32. Each rank gets threads = nproc / P (at least 1), so P x threads <= cores where the
# machine has the cores; where it does not (4 ranks on 2 cores), bench_ring says it is
# oversubscribed and the waits then include time-sharing, not only transfers. Every rank
# is a process on this host: the ring runs over shared memory, not a network.
#
# Build (Open MPI), then run:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTILEATTN_WITH_MPI=ON -DTILEATTN_BUILD_INSTANTIATIONS=ON
#   cmake --build build --target bench_ring
#   bash benchmarks/ring.sh                       # about 3 minutes on 2 cores at the defaults
#   SEQLEN=8192 REPS=9 RANKS="2 4 8" THREADS=2 BENCH_RING=build-x/benchmarks/bench_ring bash benchmarks/ring.sh
# Environment (defaults): BENCH_RING (build/benchmarks/bench_ring), SEQLEN (4096), HEADS (8),
# HEADS_KV (8), HEAD_DIM (128), DTYPE (fp32), REPS (5), BACKWARD (1), RANKS ("2 4"),
# THREADS (nproc / P), CASES ("causal-zigzag causal-contiguous noncausal"), MPI_THREAD
# (serialized: transfers move on the ring's progress thread; funneled: between kernels),
# MPIRUN_FLAGS (extra).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BENCH_RING:-$repo/build/benchmarks/bench_ring}"
[ -x "$bin" ] || { echo "ring.sh: no $bin (build target bench_ring, or set BENCH_RING)" >&2; exit 1; }

seqlen=${SEQLEN:-4096} heads=${HEADS:-8} heads_kv=${HEADS_KV:-8} head_dim=${HEAD_DIM:-128}
dtype=${DTYPE:-fp32} reps=${REPS:-5} backward=${BACKWARD:-1} ranks=${RANKS:-"2 4"}
cases=${CASES:-"causal-zigzag causal-contiguous noncausal"}
mpi_thread=${MPI_THREAD:-serialized}  # serialized: the ring's progress thread; funneled: none
cores=$(nproc)
mpirun=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
# shellcheck disable=SC2206
mpirun+=(${MPIRUN_FLAGS:-})

echo "# ring.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), $cores cores, $(mpirun --version | head -1)"
echo "# N $seqlen, H $heads/$heads_kv, d $head_dim, $dtype, reps $reps, backward $backward, ranks: $ranks"
start=$SECONDS
status=0
for p in $ranks; do
  threads=${THREADS:-$(( cores / p > 0 ? cores / p : 1 ))}
  for c in $cases; do
    case $c in
      causal-zigzag) flags=(--causal 1 --sharding zigzag) ;;
      causal-contiguous) flags=(--causal 1 --sharding contiguous) ;;
      noncausal) flags=(--causal 0 --sharding zigzag) ;;  # without a mask every sharding is balanced
      *) echo "ring.sh: unknown case $c" >&2; exit 2 ;;
    esac
    cmd=(env OMP_NUM_THREADS="$threads" "${mpirun[@]}" -np "$p" -x OMP_NUM_THREADS "$bin" --seqlen "$seqlen"
         --heads "$heads" --heads-kv "$heads_kv" --head-dim "$head_dim" --dtype "$dtype" "${flags[@]}"
         --reps "$reps" --backward "$backward" --threads "$threads" --mpi-thread "$mpi_thread")
    echo
    echo "---------------------------------------------------------------------------------"
    echo "+ ${cmd[*]}"
    "${cmd[@]}" || { status=$?; echo "ring.sh: the run above failed (exit $status)"; }
  done
done
echo
echo "# ring.sh: done in $(( SECONDS - start )) s"
exit "$status"
