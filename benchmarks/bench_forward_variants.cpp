// benchmarks/bench_forward_variants.cpp: the forward variants at full speed, each next to what
// a user without the feature would run:
//   gqa/...      32 query heads on 8 K/V heads, against the same call with K/V repeated to 32
//                heads (plain multi-head attention); causal, d = 128, N = 2048 and 4096
//   window/...   causal sliding window of 512 at N = 8192, against full causal attention
//   varlen/...   8 sequences of 100..3000 tokens packed with cu_seqlens, against the same
//                batch padded to 3000 with the padding masked off by a boolean key mask
//   head_dim/... every head_dim runs the same run-time-sized path: unlisted sizes (40, 72,
//                160, 192) next to the sizes of the old compile-time list, and DeepSeek's
//                192 / 128 (head_dim_v of its own); N = 2048, 16 heads, non-causal
// GFLOP/s counts unmasked work only: 4 * d per (query, visible key) pair, summed exactly, so
// work a kernel skips is never credited and work it wastes never pays. HBM_bytes are counted.
//
//   bench_forward_variants --benchmark_filter=window
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tileattn/ops/score_mods.hpp"
#include "tileattn/tileattn.hpp"

namespace {

using tileattn::index_t;

std::vector<float> random_normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

/// Unmasked FLOPs of one head of one sequence: 4 d per visible (query, key) pair.
double visible_flops(index_t nq, index_t nk, index_t d, bool causal, index_t window_left) {
  const tileattn::ops::KeyWindow w{nk - nq, window_left, causal ? 0 : -1, nk};
  double pairs = 0;
  for (index_t i = 0; i < nq; ++i) pairs += static_cast<double>(std::max<index_t>(0, w.end(i) - w.first(i)));
  return 4.0 * static_cast<double>(d) * pairs;
}

void set_counters(benchmark::State& state, double flops, const tileattn::IoCounts& io) {
  using benchmark::Counter;
  state.counters["GFLOP/s"] = Counter(flops * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["HBM_bytes"] = Counter(static_cast<double>(io.bytes_read + io.bytes_written));
}

/// Times opts on one [1, N, heads, d] problem with heads_kv K/V heads (V and O of dv, or d).
void run_fixed(benchmark::State& state, index_t n, index_t heads, index_t heads_kv, index_t d,
               tileattn::ForwardOptions opts, index_t dv = 0) {
  dv = dv > 0 ? dv : d;
  const auto q = random_normal(static_cast<std::size_t>(n * heads * d), 1);
  const auto k = random_normal(static_cast<std::size_t>(n * heads_kv * d), 2);
  const auto v = random_normal(static_cast<std::size_t>(n * heads_kv * dv), 3);
  std::vector<float> o(static_cast<std::size_t>(n * heads * dv));
  const auto qv = tileattn::make_bshd(q.data(), 1, n, heads, d), kv = tileattn::make_bshd(k.data(), 1, n, heads_kv, d),
             vv = tileattn::make_bshd(v.data(), 1, n, heads_kv, dv);
  const auto ov = tileattn::make_bshd(o.data(), 1, n, heads, dv);
  tileattn::IoCounts io;
  opts.io_counts = &io;
  tileattn::forward(qv, kv, vv, ov, opts);
  opts.io_counts = nullptr;
  for (auto _ : state) tileattn::forward(qv, kv, vv, ov, opts);
  // visible_flops counts 4 d per pair: 2 d for Q K^T and 2 dv for P V
  const double flops = visible_flops(n, n, d + dv, opts.causal, opts.window_left) / 2;
  set_counters(state, static_cast<double>(heads) * flops, io);
}

void bm_gqa(benchmark::State& state) {
  tileattn::ForwardOptions opts;
  opts.causal = true;
  run_fixed(state, state.range(0), 32, state.range(1), 128, opts);
}

void bm_window(benchmark::State& state) {
  tileattn::ForwardOptions opts;
  opts.causal = true;
  opts.window_left = state.range(1);  // -1: full causal
  run_fixed(state, state.range(0), 16, 16, 128, opts);
}

void bm_head_dim(benchmark::State& state) {
  run_fixed(state, 2048, 16, 16, state.range(0), {}, state.range(1));
}

const std::vector<index_t>& varlen_lengths() {
  static const std::vector<index_t> lengths{100, 3000, 450, 1200, 2600, 800, 1900, 1500};
  return lengths;
}

/// The 8 sequences packed with cu_seqlens (varlen:1) or padded to the longest with the
/// padding keys masked off (varlen:0). Causal, 16 heads, d = 128.
void bm_varlen(benchmark::State& state) {
  constexpr index_t heads = 16, d = 128;
  const bool packed = state.range(0) != 0;
  const auto& lengths = varlen_lengths();
  const index_t batch = static_cast<index_t>(lengths.size());
  const index_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::int32_t> cu{0};
  for (index_t len : lengths) cu.push_back(cu.back() + static_cast<std::int32_t>(len));
  const index_t rows = packed ? cu.back() : batch * longest;
  const auto q = random_normal(static_cast<std::size_t>(rows * heads * d), 4);
  const auto k = random_normal(q.size(), 5), v = random_normal(q.size(), 6);
  std::vector<float> o(q.size());
  tileattn::IoCounts io;
  tileattn::ForwardOptions opts;
  opts.causal = true;
  std::vector<std::uint8_t> key_mask;  // [batch, 1, 1, longest] broadcast over heads and queries
  if (packed) {
    const tileattn::VarlenSequences seqs{cu, cu, longest, longest};
    const auto view = [&](const std::vector<float>& x) { return tileattn::make_thd(x.data(), rows, heads, d); };
    const auto run = [&] {
      tileattn::forward_varlen(view(q), view(k), view(v), tileattn::make_thd(o.data(), rows, heads, d),
                               tileattn::PackedLseView{}, seqs, opts);
    };
    opts.io_counts = &io;
    run();
    opts.io_counts = nullptr;
    for (auto _ : state) run();
  } else {
    key_mask.assign(static_cast<std::size_t>(batch * longest), 0);
    for (index_t b = 0; b < batch; ++b)
      std::fill_n(key_mask.begin() + b * longest, lengths[static_cast<std::size_t>(b)], 1);
    // Padding sits at each sequence's end: top-left causal plus a key mask that a zero
    // query stride broadcasts, [B, 1, longest, longest].
    opts.alignment = tileattn::MaskAlignment::top_left;
    opts.mask = tileattn::ScoreMaskView{reinterpret_cast<const bool*>(key_mask.data()),
                                        {batch, 1, longest, longest}, {longest, 0, 0, 1}};
    const auto view = [&](const std::vector<float>& x) { return tileattn::make_bshd(x.data(), batch, longest, heads, d); };
    opts.io_counts = &io;
    tileattn::forward(view(q), view(k), view(v), tileattn::make_bshd(o.data(), batch, longest, heads, d), opts);
    opts.io_counts = nullptr;
    for (auto _ : state)
      tileattn::forward(view(q), view(k), view(v), tileattn::make_bshd(o.data(), batch, longest, heads, d), opts);
  }
  double flops = 0;
  for (index_t len : lengths) flops += heads * visible_flops(len, len, d, true, -1);
  set_counters(state, flops, io);
}

}  // namespace

BENCHMARK(bm_gqa)->ArgNames({"N", "heads_kv"})->ArgsProduct({{2048, 4096}, {8, 32}})
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
BENCHMARK(bm_window)->ArgNames({"N", "window"})->Args({8192, 512})->Args({8192, -1})
    ->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(bm_varlen)->ArgNames({"packed"})->Arg(1)->Arg(0)
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
BENCHMARK(bm_head_dim)->ArgNames({"d", "dv"})
    ->Args({32, 32})->Args({40, 40})->Args({64, 64})->Args({72, 72})->Args({80, 80})->Args({96, 96})
    ->Args({128, 128})->Args({160, 160})->Args({192, 192})->Args({256, 256})->Args({192, 128})
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);

BENCHMARK_MAIN();
