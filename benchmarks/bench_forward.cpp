// benchmarks/bench_forward.cpp: Google Benchmark of the forward pass: tileattn::forward against
// standard (materializing) attention on Eigen, with FLOP-rate and HBM-byte counters.
//
// Workloads: batch 1, 16 heads, N = seqlen_q = seqlen_k in {512, 1024, 2048, 4096},
// head_dim 64 and 128, non-causal and causal. Both run on all hardware threads (the
// default Execution; OMP_NUM_THREADS limits both alike).
//
// Counters, per benchmark:
//   GFLOP/s    useful FLOPs 4*B*H*Nq*Nk*d (halved when causal) per second of real time
//   HBM_bytes  bytes one call moves between main memory and SRAM: tileattn's are counted
//              by a call with ForwardOptions::io_counts, the baseline's come from
//              standard_attention_hbm_bytes() (FlashAttention's Algorithm 0 count)
//   HBM_GB/s   HBM_bytes per second of real time
//
//   bench_forward --benchmark_filter='N:2048/d:128/causal:0'
//   bench_forward --benchmark_format=json --benchmark_out=forward.json
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>

#include "standard_attention.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/tileattn.hpp"
#include "workload.hpp"

namespace {

using tileattn::index_t;
using tileattn::bench::AttentionShape;
using tileattn::bench::AttentionWorkload;

constexpr index_t batch = 1;
constexpr index_t heads = 16;

AttentionShape shape_of(const benchmark::State& state) {
  const index_t n = state.range(0);
  return {batch, heads, n, n, state.range(1), state.range(2) != 0};
}

/// Inputs depend only on (N, d): benchmarks are registered so that consecutive ones share
/// them, and this one-entry cache fills them once, outside every timed loop.
AttentionWorkload& workload_for(const AttentionShape& shape) {
  static std::unique_ptr<AttentionWorkload> cached;
  if (!cached || cached->shape.seqlen_q != shape.seqlen_q ||
      cached->shape.seqlen_k != shape.seqlen_k || cached->shape.head_dim != shape.head_dim ||
      cached->shape.heads != shape.heads || cached->shape.batch != shape.batch) {
    cached.reset();  // free the old buffers before allocating the new ones
    cached = std::make_unique<AttentionWorkload>(shape);
  }
  cached->shape.causal = shape.causal;
  return *cached;
}

void set_counters(benchmark::State& state, const AttentionShape& shape, double hbm_bytes) {
  using benchmark::Counter;
  state.counters["GFLOP/s"] = Counter(shape.flops() * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["HBM_bytes"] = Counter(hbm_bytes);
  state.counters["HBM_GB/s"] = Counter(hbm_bytes * 1e-9, Counter::kIsIterationInvariantRate);
}

void BM_forward_tileattn(benchmark::State& state) {
  const AttentionShape shape = shape_of(state);
  AttentionWorkload& w = workload_for(shape);
  tileattn::ForwardOptions options;
  options.causal = shape.causal;

  // One untimed call with IO counting: the byte counter, and a warm-up (threads started,
  // scratch arenas and output pages touched).
  tileattn::IoCounts io;
  options.io_counts = &io;
  tileattn::forward(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), options);
  options.io_counts = nullptr;

  for (auto _ : state) {
    tileattn::forward(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), options);
    benchmark::DoNotOptimize(w.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, shape, static_cast<double>(io.bytes_read + io.bytes_written));
  const tileattn::TilePlan plan =
      tileattn::plan_forward(w.q_view(), w.k_view(), w.v_view(), options).tiles();
  state.SetLabel("Br=" + std::to_string(plan.query_tile_rows) +
                 " Bc=" + std::to_string(plan.key_tile_rows));
}

void BM_forward_standard(benchmark::State& state) {
  const AttentionShape shape = shape_of(state);
  AttentionWorkload& w = workload_for(shape);
  static tileattn::bench::StandardAttention standard;  // per-worker workspaces, kept
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));

  // Untimed warm-up: sizes the workspaces (S alone is N*N floats per worker).
  standard(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), scale, shape.causal);
  for (auto _ : state) {
    standard(w.q_view(), w.k_view(), w.v_view(), w.o_view(), w.lse_view(), scale, shape.causal);
    benchmark::DoNotOptimize(w.o.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, shape,
               static_cast<double>(tileattn::bench::standard_attention_hbm_bytes(
                   shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k, shape.head_dim)));
  state.SetLabel("eigen");
}

void register_benchmarks() {
  for (index_t n : {512, 1024, 2048, 4096}) {
    // Large N: one iteration already takes a good fraction of a second; a shorter minimum
    // keeps the whole default run to a few minutes on 2 cores. Small N keep the default
    // (0.5 s), which --benchmark_min_time overrides.
    const bool large = n >= 2048;
    for (index_t d : {64, 128}) {
      for (index_t causal : {0, 1}) {
        for (auto [name, fn] : {std::pair{"forward_tileattn", &BM_forward_tileattn},
                                std::pair{"forward_standard", &BM_forward_standard}}) {
          auto* b = benchmark::RegisterBenchmark(name, fn)
                        ->Args({n, d, causal})
                        ->ArgNames({"N", "d", "causal"})
                        ->UseRealTime()
                        ->Unit(benchmark::kMillisecond);
          if (large) b->MinTime(0.2);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Recorded in the console header and the JSON "context": what the numbers were taken with.
  benchmark::AddCustomContext("tileattn_version", tileattn::version);
  benchmark::AddCustomContext("tileattn_micro_kernels", tileattn::active_isa());
  benchmark::AddCustomContext("tileattn_sram_budget_bytes",
                              std::to_string(tileattn::per_core_cache_bytes()));
  benchmark::AddCustomContext("tileattn_workers", std::to_string(tileattn::worker_count({})));
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
