// benchmarks/side_by_side/forward_timer.cpp: times tileattn::forward (whichever headers it
// is built against) on one shape: median, min and max GFLOP/s of R runs after one warm-up.
// Standard library only, so an older commit's headers build it too (before / after tables;
// without core/half_types.hpp only fp32 runs):
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/forward_timer.cpp
//   ./a.out N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16|fp16]
// CEILINGS=1 first prints the machine's ceilings on THREADS threads, measured in this process
// (benchmarks/ceilings.hpp: FMA loop, vdpbf16ps loop, AMX loop, streaming read), and whether
// bf16 products run on AMX tiles here.
// Inputs are N(0, 1) from a fixed seed, rounded to the type; O is the type, no LSE. The fp32
// line is the same as before the type argument; the others name their type after the threads.
// BATCH=b (default 1) times b sequences of N. QSCALE=x multiplies Q by x before rounding (scores
// x times as spread: 30 at d 128 puts most of a row's 2^x results below 2^-126, the rows
// where subnormal floats cost a microcode assist each). SLABS="0 32 64" and PANELS="128 512" (headers
// with AMX panels, arch/prepared_pairs.hpp) time each AMX slab height and panel width in turn
// within every repeat, one line each ("slab 0": no panels, the whole tile at once), so their
// ratios come from one run. DROPOUT="0 10" (percent; headers with DropoutOptions) does the same
// for the drop probability: issue 46's forward with dropout against the one without.
#include <tileattn/tileattn.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#if __has_include(<tileattn/core/half_types.hpp>)
#define TIMER_HAS_HALF_TYPES 1
#endif
#if __has_include("../ceilings.hpp") && __has_include(<tileattn/arch/amx_support.hpp>)
#include "../ceilings.hpp"
#define TIMER_HAS_CEILINGS 1
#endif

#if __has_include(<tileattn/arch/prepared_pairs.hpp>)
#define TIMER_HAS_SLABS 1
#endif
#if __has_include(<tileattn/ops/dropout.hpp>)
#define TIMER_HAS_DROPOUT 1
#endif

/// The numbers in environment variable `name` (AMX slab heights, panel widths), or one entry,
/// -1: the headers' default.
std::vector<long> settings(const char* name) {
  std::vector<long> out;
#if TIMER_HAS_SLABS
  if (const char* e = std::getenv(name))
    for (char* p = const_cast<char*>(e); *p;) {
      char* end = p;
      const long v = std::strtol(p, &end, 10);
      if (end == p) break;
      out.push_back(v);
      p = end;
    }
#endif
  if (out.empty()) out.push_back(-1);
  return out;
}

template <class T, class Round>
int time_forward(long n, long d, long hq, long hkv, bool causal, int threads, int repeats, const char* type,
                 Round round) {
  using namespace tileattn;
  const long batch = std::getenv("BATCH") ? std::max(1L, atol(std::getenv("BATCH"))) : 1;
  std::vector<T> q(batch * n * hq * d), k(batch * n * hkv * d), v(batch * n * hkv * d), o(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const float qscale = std::getenv("QSCALE") ? static_cast<float>(std::atof(std::getenv("QSCALE"))) : 1.0f;
  for (auto* x : {&q, &k, &v})
    for (T& e : *x) e = round(nd(rng) * (x == &q ? qscale : 1.0f));
  ForwardOptions opts;
  opts.causal = causal;
  opts.execution = {Backend::openmp, threads};
  struct Run {
    long slab, panel, dropout;  // dropout: p in percent, -1: none
  };
  std::vector<Run> runs;
  for (const long slab : settings("SLABS"))
    for (const long panel : settings("PANELS"))
      for (const long dropout : settings("DROPOUT")) runs.push_back({slab, panel, dropout});
  std::vector<std::vector<double>> s(runs.size());
  for (int r = 0; r <= repeats; ++r)
    for (std::size_t i = 0; i < runs.size(); ++i) {
#if TIMER_HAS_SLABS
      arch::tile_slab_rows = runs[i].slab < 0 ? 64 : runs[i].slab;
      arch::dot_product_slab_rows = runs[i].slab < 0 ? 64 : runs[i].slab;
      tileattn::detail::panel_keys = runs[i].panel < 0 ? 0 : runs[i].panel;
#endif
#if TIMER_HAS_DROPOUT
      opts.dropout = {runs[i].dropout < 0 ? 0.0f : static_cast<float>(runs[i].dropout) / 100.0f, 1234,
                      static_cast<std::uint64_t>(r)};
#endif
      const auto t0 = std::chrono::steady_clock::now();
      forward(make_bshd<const T>(q.data(), batch, n, hq, d), make_bshd<const T>(k.data(), batch, n, hkv, d),
              make_bshd<const T>(v.data(), batch, n, hkv, d), make_bshd(o.data(), batch, n, hq, d), opts);
      if (r > 0) s[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  const double flops = 4.0 * batch * hq * n * n * d / (causal ? 2 : 1);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::sort(s[i].begin(), s[i].end());
    char tag[64] = "";
    if (batch > 1) std::snprintf(tag, sizeof tag, " B %ld", batch);
    if (qscale != 1.0f) std::snprintf(tag + std::strlen(tag), sizeof tag - std::strlen(tag), " Q x%g", qscale);
    if (runs[i].slab >= 0) std::snprintf(tag + std::strlen(tag), sizeof tag - std::strlen(tag), " slab %ld", runs[i].slab);
    if (runs[i].panel >= 0) std::snprintf(tag + std::strlen(tag), sizeof tag - std::strlen(tag), " panel %ld", runs[i].panel);
    if (runs[i].dropout >= 0)
      std::snprintf(tag + std::strlen(tag), sizeof tag - std::strlen(tag), " dropout %ld%%", runs[i].dropout);
    std::printf("N %ld d %ld H %ld/%ld %s threads %2d%s%s%s: GFLOP/s median %7.1f min %7.1f max %7.1f\n", n, d, hq,
                hkv, causal ? "causal" : "full  ", threads, *type ? " " : "", type, tag,
                flops / s[i][s[i].size() / 2] * 1e-9, flops / s[i].back() * 1e-9, flops / s[i].front() * 1e-9);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16|fp16]\n", argv[0]);
    return 2;
  }
  const long n = atol(argv[1]), d = atol(argv[2]), hq = atol(argv[3]), hkv = atol(argv[4]);
  const bool causal = atoi(argv[5]);
  const int threads = atoi(argv[6]), repeats = atoi(argv[7]);
  const std::string type = argc > 8 ? argv[8] : "fp32";
  if (repeats < 1) {
    std::fprintf(stderr, "REPEATS must be >= 1\n");
    return 2;
  }
#if TIMER_HAS_CEILINGS
  if (const char* c = std::getenv("CEILINGS"); c && *c == '1') {
    namespace b = tileattn::bench;
    std::printf("ceilings, %d threads: FMA loop %.1f GFLOP/s, vdpbf16ps loop %.1f, AMX loop %.1f, stream read %.1f GB/s;"
                " AMX tiles %s (%s)\n",
                threads, b::fma_peak_gflops(threads), b::bf16_dot_peak_gflops(threads), b::amx_bf16_peak_gflops(threads),
                b::stream_read_gbps(threads),
#if defined(TILEATTN_HAS_AMX_KERNELS)
                tileattn::arch::amx::tiles_in_use() ? "in use" : "not in use",
#else
                "not compiled",
#endif
                tileattn::arch::amx_support::describe(tileattn::arch::amx_support::status()));
  }
#endif
  if (type == "fp32")
    return time_forward<float>(n, d, hq, hkv, causal, threads, repeats, "", [](float x) { return x; });
#if TIMER_HAS_HALF_TYPES
  if (type == "bf16")
    return time_forward<tileattn::bf16>(n, d, hq, hkv, causal, threads, repeats, "bf16",
                                        [](float x) { return tileattn::bf16(x); });
  if (type == "fp16")
    return time_forward<tileattn::fp16>(n, d, hq, hkv, causal, threads, repeats, "fp16",
                                        [](float x) { return tileattn::fp16(x); });
#endif
  std::fprintf(stderr, "unknown or unsupported type '%s' (these headers: fp32%s)\n", type.c_str(),
#if TIMER_HAS_HALF_TYPES
               ", bf16, fp16"
#else
               ""
#endif
  );
  return 2;
}
