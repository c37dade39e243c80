// benchmarks/forward_scaling.cpp: thread scaling of the forward pass: GFLOP/s at 1, 2, 4, ...
// threads (the median of --repeats timed runs after one warm-up, with the slowest and
// fastest run: shared machines are noisy) and the speed-up over one thread, for each
// backend compiled in. Depends on nothing but tileattn (no Google Benchmark), so it builds
// on any machine with a compiler:
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude -Ibenchmarks benchmarks/forward_scaling.cpp
//   ./a.out [--seqlen 4096] [--head-dim 128] [--heads 16] [--causal] [--threads 1,2,4,8,16]
//           [--repeats 9] [--backend openmp|tbb] [--dtype fp32|bf16|fp16]
//
// --dtype stores Q, K, V and O in that type (the same N(0, 1) inputs, rounded). The ceiling
// column is the FMA loop's for fp32 and fp16 (fp16 computes on float tiles) and the
// vdpbf16ps loop's for bf16 where the CPU has AVX-512 BF16 (the FMA loop's elsewhere).
#include <tileattn/tileattn.hpp>

#include "ceilings.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Config {
  tileattn::index_t seqlen = 4096, head_dim = 128, heads = 16;
  bool causal = false;
  std::vector<int> threads{1, 2, 4, 8, 16};
  int repeats = 9;
  std::string backend;  // empty: every backend compiled in
  std::string dtype = "fp32";
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--seqlen") c.seqlen = std::stol(next());
    else if (a == "--head-dim") c.head_dim = std::stol(next());
    else if (a == "--heads") c.heads = std::stol(next());
    else if (a == "--causal") c.causal = true;
    else if (a == "--repeats") c.repeats = std::stoi(next());
    else if (a == "--backend") c.backend = next();
    else if (a == "--dtype") c.dtype = next();
    else if (a == "--threads") {
      c.threads.clear();
      std::stringstream list(next());
      for (std::string t; std::getline(list, t, ',');) c.threads.push_back(std::stoi(t));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  return c;
}

/// The scaling table with Q, K, V and O stored as T.
template <class T>
void run_table(const Config& c) {
  const auto n = static_cast<std::size_t>(c.seqlen * c.heads * c.head_dim);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<T> q(n), k(n), v(n), o(n);
  for (auto* x : {&q, &k, &v})
    for (T& e : *x) e = tileattn::from_float<T>(normal(rng));
  const auto view = [&](std::vector<T>& x) { return tileattn::make_bshd(x.data(), 1, c.seqlen, c.heads, c.head_dim); };
  const double flops = 4.0 * static_cast<double>(c.heads * c.seqlen) * static_cast<double>(c.seqlen * c.head_dim) / (c.causal ? 2 : 1);
  const bool bf16_loop = std::is_same_v<T, tileattn::bf16> && tileattn::bench::bf16_dot_peak_gflops(1) > 0;
  const auto ceiling = [&](int t) {
    return bf16_loop ? tileattn::bench::bf16_dot_peak_gflops(t) : tileattn::bench::fma_peak_gflops(t);
  };
  const char* ceiling_name = bf16_loop ? "vdpbf16ps" : "FMA";
  std::printf("forward %s%sB=1 H=%ld N=%ld d=%ld %s, micro-kernels %s, %d timed runs per row\n",
              std::is_same_v<T, float> ? "" : tileattn::type_name<T>(), std::is_same_v<T, float> ? "" : " ",
              static_cast<long>(c.heads), static_cast<long>(c.seqlen),
              static_cast<long>(c.head_dim), c.causal ? "causal" : "non-causal", tileattn::active_isa(),
              c.repeats);
  for (tileattn::Backend backend : {tileattn::Backend::openmp, tileattn::Backend::tbb}) {
    if (!tileattn::backend_available(backend)) continue;
    if (!c.backend.empty() && c.backend != tileattn::to_string(backend)) continue;
    double one_thread = 0;
    for (int t : c.threads) {
      tileattn::ForwardOptions opts;
      opts.causal = c.causal;
      opts.execution = {backend, t};
      const tileattn::TilePlan plan = tileattn::plan_forward(view(q), view(k), view(v), opts).tiles();
      std::vector<double> seconds;
      for (int r = 0; r <= c.repeats; ++r) {  // the first run warms up and is not counted
        const auto start = std::chrono::steady_clock::now();
        tileattn::forward(view(q), view(k), view(v), view(o), opts);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r > 0) seconds.push_back(s);
      }
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      const double gflops = flops / median * 1e-9, peak = ceiling(t);
      if (one_thread == 0) one_thread = gflops;
      std::printf("%-7s threads %3d: tiles %4ld x %3ld: GFLOP/s median %7.1f (min %7.1f, max %7.1f)  speed-up %5.2fx  "
                  "%4.0f%% of the %s loop (%7.1f GFLOP/s, %5.2fx its 1 thread)\n",
                  tileattn::to_string(backend), t, static_cast<long>(plan.query_tile_rows),
                  static_cast<long>(plan.key_tile_rows), gflops, flops / seconds.back() * 1e-9,
                  flops / seconds.front() * 1e-9, gflops / one_thread, 100 * gflops / peak, ceiling_name, peak,
                  peak / ceiling(c.threads.front()));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  if (c.dtype == "fp32") run_table<float>(c);
  else if (c.dtype == "bf16") run_table<tileattn::bf16>(c);
  else if (c.dtype == "fp16") run_table<tileattn::fp16>(c);
  else {
    std::fprintf(stderr, "unknown --dtype %s (fp32, bf16 or fp16)\n", c.dtype.c_str());
    return 2;
  }
}
