// benchmarks/bench_dropout.cpp: the forward and backward with attention dropout next to the
// same calls without it (issue 46: the forward with dropout within 1.15x of the forward
// without). Each pair differs only in DropoutOptions::p (0 or 0.1); fp32 and bf16, d 64 and
// 128, causal and not, N = 2048, 16 heads, on every thread of the machine. GFLOP/s counts
// the unmasked work of the undropped call (4 d per visible pair; 10 d in the backward), so
// the pair's ratio of GFLOP/s is its ratio of times.
//
//   bench_dropout --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true
//                 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace {

using tileattn::index_t;

template <class T>
std::vector<T> random_normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<T> x(n);
  for (T& e : x) e = tileattn::from_float<T>(normal(rng));
  return x;
}

/// Visible (query, key) pairs of one head: N^2, or N (N + 1) / 2 causal.
double visible_pairs(index_t n, bool causal) {
  return causal ? static_cast<double>(n) * static_cast<double>(n + 1) / 2 : static_cast<double>(n) * static_cast<double>(n);
}

struct Problem {
  index_t n = 2048, heads = 16, d = 128;
};

/// One call of the forward (or backward) of s, p = 0 meaning no dropout.
template <class T>
void run(benchmark::State& state, const Problem& s, bool causal, float p, bool backward) {
  const auto size = static_cast<std::size_t>(s.n * s.heads * s.d);
  const auto q = random_normal<T>(size, 1), k = random_normal<T>(size, 2), v = random_normal<T>(size, 3),
             dout = random_normal<T>(size, 4);
  std::vector<T> o(size), dq(size), dk(size), dv(size);
  std::vector<float> lse(static_cast<std::size_t>(s.heads * s.n));
  const auto view = [&](const std::vector<T>& x) { return tileattn::make_bshd<const T>(x.data(), 1, s.n, s.heads, s.d); };
  const auto out = [&](std::vector<T>& x) { return tileattn::make_bshd(x.data(), 1, s.n, s.heads, s.d); };
  tileattn::BackwardOptions opts;
  opts.causal = causal;
  opts.dropout = {p, 0x5eed, 1};
  const auto lse_view = tileattn::make_lse(lse.data(), 1, s.heads, s.n);
  tileattn::forward(view(q), view(k), view(v), out(o), lse_view, opts);
  for (auto _ : state) {
    if (backward)
      tileattn::backward(view(q), view(k), view(v), view(o), lse_view, view(dout), out(dq), out(dk), out(dv), opts);
    else
      tileattn::forward(view(q), view(k), view(v), out(o), lse_view, opts);
  }
  const double flops = (backward ? 10.0 : 4.0) * static_cast<double>(s.d) * visible_pairs(s.n, causal) * s.heads;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_dropout(benchmark::State& state) {
  Problem s;
  const float p = static_cast<float>(state.range(0)) / 100.0f;
  s.d = state.range(2);
  const bool causal = state.range(3) != 0, backward = state.range(4) != 0;
  if (state.range(1) == 0) run<float>(state, s, causal, p, backward);
  else run<tileattn::bf16>(state, s, causal, p, backward);
}

// Each pair side by side (p 0, then 10, the first argument varying fastest): p, dtype, d,
// causal, backward. Run with --benchmark_enable_random_interleaving=true so that a drift in
// the machine's speed spreads over both of a pair.
BENCHMARK(bm_dropout)
    ->ArgNames({"p%", "bf16", "d", "causal", "bwd"})
    ->ArgsProduct({{0, 10}, {1, 0}, {128, 64}, {0, 1}, {0}})
    ->ArgsProduct({{0, 10}, {1}, {128}, {1}, {1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
