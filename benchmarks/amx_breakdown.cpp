// benchmarks/amx_breakdown.cpp: where the bf16 forward's time goes on one core, on an AMX
// machine: the bf16 pair gemm on the tile shapes the forward and backward give it, on AMX
// tiles and on vdpbf16ps, as a fraction of the register-resident AMX loop; the softmax pass
// per score; and the whole forward, with its tile plan, in cycles per score.
// Standard library only (no Google Benchmark), so it builds on a bare machine:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/amx_breakdown.cpp -o amx_breakdown
//   ./amx_breakdown [N]       # N (default 2048): the forward's sequence length, H 2, d 128
//   H=16 D=64 ./amx_breakdown 512   # the whole forward's lines at other heads and head dims
// Times: best of several runs in this thread's CPU time.
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "ceilings.hpp"

namespace {

using tileattn::bf16x2;
using tileattn::index_t;

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <class Body>
double best_seconds(Body body, long calls, int trials = 7) {
  double best = 1e30;
  for (int t = 0; t < trials; ++t) {
    const double start = thread_seconds();
    for (long c = 0; c < calls; ++c) body();
    best = std::min(best, (thread_seconds() - start) / static_cast<double>(calls));
  }
  return best;
}

std::vector<bf16x2> pairs(std::size_t n) {
  std::vector<bf16x2> v(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& p : v) p.lo = tileattn::bf16(nd(rng)), p.hi = tileattn::bf16(nd(rng));
  return v;
}

struct Shape {
  index_t m, n, k;  // k in pairs
  bool trans_a, accumulate;
  const char* what;
};

template <bool Acc, bool Trans, class Gemm>
double gemm_gflops(const Shape& s, Gemm gemm) {
  const index_t a_rows = Trans ? s.k : s.m, a_cols = Trans ? s.m : s.k;
  const index_t lda = (a_cols + 15) / 16 * 16, ldb = (s.n + 15) / 16 * 16, ldc = ldb;
  const auto a = pairs(static_cast<std::size_t>(a_rows * lda)), b = pairs(static_cast<std::size_t>(s.k * ldb));
  std::vector<float> c(static_cast<std::size_t>(s.m * ldc), 0.5f);
  const double flops = 4.0 * s.m * s.n * s.k;
  const long calls = std::max(1L, static_cast<long>(1e9 / flops));
  const double sec = best_seconds([&] { gemm(s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(), ldc); }, calls, 3);
  return flops / sec * 1e-9;
}

template <bool Acc, bool Trans>
void report(const Shape& s, double amx_peak) {
  namespace arch = tileattn::arch;
  const double avx = gemm_gflops<Acc, Trans>(s, [](auto... x) { arch::avx512::gemm<Acc, Trans>(x...); });
#if defined(TILEATTN_HAS_AMX_KERNELS)
  const double amx = arch::amx::tiles_in_use()
                         ? gemm_gflops<Acc, Trans>(s, [](auto... x) { arch::amx::gemm<Acc, Trans>(x...); })
                         : 0.0;
#else
  const double amx = 0.0;
#endif
  // The same with B read in place, alternated 5 times with the default: medians (the
  // shared machine's noise moves single runs by 2x).
  double in_place = 0.0, with = amx;
#if defined(TILEATTN_HAS_AMX_KERNELS)
  if (arch::amx::tiles_in_use()) {
    namespace d = arch::amx::detail;
    const auto run = [&] { return gemm_gflops<Acc, Trans>(s, [](auto... x) { arch::amx::gemm<Acc, Trans>(x...); }); };
    std::vector<double> a, c;
    for (int rep = 0; rep < 5; ++rep) {
      a.push_back(run());
      const index_t pack_default = d::pack_min_rows;
      d::pack_min_rows = index_t{1} << 40;
      c.push_back(run());
      d::pack_min_rows = pack_default;
    }
    std::sort(a.begin(), a.end());
    std::sort(c.begin(), c.end());
    with = a[2], in_place = c[2];
  }
#endif
  std::printf("  %-34s %4ld x %4ld x %4ld pairs: AMX %7.1f GFLOP/s (%4.1f%% of the AMX loop; B in place %7.1f), "
              "vdpbf16ps %6.1f\n", s.what, static_cast<long>(s.m), static_cast<long>(s.n), static_cast<long>(s.k), with,
              amx_peak > 0 ? 100.0 * with / amx_peak : 0.0, in_place, avx);
}

}  // namespace

int main(int argc, char** argv) {
  const index_t seqlen = argc > 1 ? std::atol(argv[1]) : 2048;
  const double amx_peak = tileattn::bench::amx_bf16_peak_gflops(1);
  std::printf("1 thread: AMX loop %.1f GFLOP/s, vdpbf16ps loop %.1f, FMA loop %.1f; AMX tiles %s\n", amx_peak,
              tileattn::bench::bf16_dot_peak_gflops(1), tileattn::bench::fma_peak_gflops(1),
              tileattn::arch::amx_support::describe(tileattn::arch::amx_support::status()));
  const Shape shapes[] = {
      {1024, 128, 64, false, false, "S = Q K^T, Br 1024, Bc 128, d 128"},
      {1024, 128, 64, false, true, "O += P V, Br 1024, Bc 128, d 128"},
      {1024, 128, 256, false, true, "O += P V, Br 1024, Bc 512, d 128"},
      {256, 256, 1024, false, false, "long K: 256 x 256 x 1024 pairs"},
      {128, 512, 64, false, false, "S = Q K^T, Br 128, Bc 512, d 128"},
      {64, 512, 64, false, false, "S = Q K^T, Br 64, Bc 512, d 128"},
      {256, 256, 64, false, false, "S = Q K^T, Br 256, Bc 256, d 128"},
      {128, 128, 256, false, true, "O += P V, Br 128, Bc 512, d 128"},
      {128, 128, 128, false, true, "O += P V, Br 128, Bc 256, d 128"},
      {128, 128, 32, true, true, "dV += P^T dO, Br 64, Bc 128, d 128"},
      {113, 203, 48, false, false, "odd sizes"},
  };
  for (const Shape& s : shapes) {
    if (s.trans_a) report<true, true>(s, amx_peak);
    else if (s.accumulate) report<true, false>(s, amx_peak);
    else report<false, false>(s, amx_peak);
  }
#if defined(TILEATTN_HAS_AMX_KERNELS)
  if (tileattn::arch::amx::tiles_in_use()) {  // the panel schedule's products: one 64-row slab of a 512-key panel, d 128
    namespace amx = tileattn::arch::amx;
    constexpr index_t slab = 64, panel = 512, dp = 64, dv = 128;
    const auto q = pairs(slab * dp), k_t = pairs(dp * panel), v = pairs(panel / 2 * dv), p = pairs(slab * panel / 2);
    std::vector<float> s(slab * panel), o(slab * dv, 0.5f);
    auto* kp = static_cast<bf16x2*>(std::aligned_alloc(64, dp * panel * sizeof(bf16x2)));
    auto* vp = static_cast<bf16x2*>(std::aligned_alloc(64, panel / 2 * dv * sizeof(bf16x2)));
    tileattn::arch::PreparedPairs kpp{}, vpp{};
    const double pack = best_seconds([&] {
      kpp = amx::prepare_pairs(dp, panel, k_t.data(), panel, kp);
      vpp = amx::prepare_pairs(panel / 2, dv, v.data(), dv, vp);
    }, 200);
    std::printf("  panel of 512 keys, d 128: packing K^T and V %.2f us (%.3f ns per score over a 1024-row query tile)\n",
                pack * 1e6, pack * 1e9 / (1024.0 * panel));
    {
      amx::begin_products();
      const double qk = best_seconds([&] { amx::gemm_prepared<false>(slab, panel, dp, q.data(), dp, kpp, s.data(), panel); }, 2000);
      const double pv = best_seconds([&] { amx::gemm_prepared<true>(slab, dv, panel / 2, p.data(), panel / 2, vpp, o.data(), dv); }, 2000);
      amx::end_products();
      const double flops = 4.0 * slab * panel * dp;
      std::printf("  slab 64 x panel 512: S = Q K^T %.1f GFLOP/s (%.1f%% of the loop), O += P V %.1f (%.1f%%); "
                  "%.3f ns per score for both\n", flops / qk * 1e-9,
                  100 * flops / qk * 1e-9 / amx_peak, flops / pv * 1e-9, 100 * flops / pv * 1e-9 / amx_peak,
                  (qk + pv) * 1e9 / (slab * panel));
    }
    // S = Q K^T of a 64-row slab with A resident in the tiles (arch::amx::detail::
    // scores_a_resident; by default up to d 64) against 32 x 32 blocks, at d 128 and 64:
    // alternated 7 times, medians.
    for (const index_t pairs_k : {index_t{64}, index_t{32}}) {
      const auto qd = pairs(slab * pairs_k), kd = pairs(pairs_k * panel);
      auto* kdp = static_cast<bf16x2*>(std::aligned_alloc(64, pairs_k * panel * sizeof(bf16x2)));
      const tileattn::arch::PreparedPairs kdpp = amx::prepare_pairs(pairs_k, panel, kd.data(), panel, kdp);
      std::vector<double> on, off;
      const index_t resident_default = amx::detail::resident_a_max_pairs;
      amx::begin_products();
      for (int rep = 0; rep < 7; ++rep)
        for (const bool resident : {true, false}) {
          amx::detail::resident_a_max_pairs = resident ? 64 : 0;
          const double t = best_seconds([&] {
            amx::gemm_prepared<false>(slab, panel, pairs_k, qd.data(), pairs_k, kdpp, s.data(), panel);
          }, 1000, 3);
          (resident ? on : off).push_back(4.0 * slab * panel * pairs_k / t * 1e-9);
        }
      amx::end_products();
      amx::detail::resident_a_max_pairs = resident_default;
      std::sort(on.begin(), on.end());
      std::sort(off.begin(), off.end());
      std::printf("  slab 64 x panel 512, d %ld: S = Q K^T with A resident %.1f GFLOP/s (%.1f%% of the loop; "
                  "%.1f-%.1f), 32 x 32 blocks %.1f (%.1f-%.1f): %.2fx\n", static_cast<long>(2 * pairs_k), on[3],
                  100 * on[3] / amx_peak, on[0], on[6], off[3], off[0], off[6], on[3] / off[3]);
      std::free(kdp);
    }
    // The next step measured: a slab's softmax (row max, 2^x, sum, bf16 pairs, O rescaled)
    // issued two rows at a time between the next slab's 32 x 32 blocks of Q K^T, against
    // the same work one after the other. Two score buffers; P V after either way.
    {
      std::vector<float> s2(slab * panel), factor(slab, 0.09f), shift(slab), sums(slab);
      std::vector<bf16x2> pp(slab * panel / 2);
      for (std::size_t i = 0; i < s.size(); ++i) s[i] = s2[i] = static_cast<float>(i % 13) * 0.3f - 2.0f;
      const auto softmax_rows = [&](float* x, index_t r0, index_t rows) {
        for (index_t r = r0; r < r0 + rows; ++r) {
          shift[r] = tileattn::arch::native::row_max(x + r * panel, panel) * 0.09f;
          tileattn::arch::native::scale(o.data() + r * dv, dv, 0.999f);
        }
        tileattn::arch::native::exp2_shift_sum_rows(x + r0 * panel, panel, rows, panel, factor.data() + r0,
                                                    shift.data() + r0, sums.data() + r0, pp.data() + r0 * panel / 2,
                                                    panel / 2);
      };
      amx::begin_products();
      const double sequential = best_seconds([&] {
        amx::gemm_prepared<false>(slab, panel, dp, q.data(), dp, kpp, s2.data(), panel);
        softmax_rows(s.data(), 0, slab);
        amx::gemm_prepared<true>(slab, dv, panel / 2, pp.data(), panel / 2, vpp, o.data(), dv);
      }, 2000);
      const double interleaved = best_seconds([&] {
        amx::detail::EdgeBuffers buf;
        const amx::detail::BOperand b{reinterpret_cast<const std::uint32_t*>(kpp.data), 0, kpp.packed_tiles};
        index_t done = 0;
        for (index_t j = 0; j < panel; j += 32)
          for (index_t i = 0; i < slab; i += 32) {
            amx::detail::block<2, 2>(32, 32, dp, q.data() + i * dp, dp, b, j, s2.data() + i * panel + j, panel, false,
                                     buf);
            softmax_rows(s.data(), done, 2);
            done += 2;
          }
        amx::gemm_prepared<true>(slab, dv, panel / 2, pp.data(), panel / 2, vpp, o.data(), dv);
      }, 2000);
      amx::end_products();
      std::printf("  a slab's Q K^T, softmax and P V: %.3f ns per score one after the other, %.3f with the softmax "
                  "interleaved between the next slab's Q K^T blocks\n", sequential * 1e9 / (slab * panel),
                  interleaved * 1e9 / (slab * panel));
    }
    std::free(kp);
    std::free(vp);
  }
#endif
  {  // the softmax pass over one 128 x 512 score tile, writing bf16 pairs
    constexpr index_t rows = 128, cols = 512;
    std::vector<float> x(rows * cols), scale(rows, 0.18f), shift(rows, 0.5f), sums(rows);
    std::vector<bf16x2> p(rows * cols / 2);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.3f - 2.0f;
    const double sec = best_seconds([&] {
      tileattn::arch::native::exp2_shift_sum_rows(x.data(), cols, rows, cols, scale.data(), shift.data(), sums.data(),
                                                  p.data(), cols / 2);
    }, 50);
    std::printf("  softmax pass (exp2, sum, bf16 pairs) on 128 x 512: %.3f ns per score\n", sec * 1e9 / (rows * cols));
    const double max_sec = best_seconds([&] {
      float m = 0;
      for (index_t r = 0; r < rows; ++r) m += tileattn::arch::native::row_max(x.data() + r * cols, cols);
      asm volatile("" : : "x"(m));
    }, 50);
    std::printf("  row max on 128 x 512: %.3f ns per score\n", max_sec * 1e9 / (rows * cols));
  }
  if (const char* sweep = std::getenv("SWEEP"); sweep && *sweep == '1') {
    // The forward under other SRAM budgets (tile plans) and B packing thresholds.
    const index_t h = 2, d = 128;
    std::vector<tileattn::bf16> q(seqlen * h * d), k(q.size()), v(q.size()), o(q.size());
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto* t : {&q, &k, &v})
      for (auto& e : *t) e = tileattn::bf16(nd(rng));
    const auto qv = tileattn::make_bshd<const tileattn::bf16>(q.data(), 1, seqlen, h, d);
    const auto kv = tileattn::make_bshd<const tileattn::bf16>(k.data(), 1, seqlen, h, d);
    const auto vv = tileattn::make_bshd<const tileattn::bf16>(v.data(), 1, seqlen, h, d);
    for (const bool causal : {false, true})
      for (const std::size_t budget : {std::size_t{0}, std::size_t{1} << 20, std::size_t{512} << 10, std::size_t{256} << 10})
          for (const index_t pack : {index_t{128}, index_t{1} << 40}) {
            tileattn::ForwardOptions opts;
            opts.causal = causal;
            opts.sram_budget_bytes = budget;
            opts.execution = {tileattn::Backend::serial, 1};
#if defined(TILEATTN_HAS_AMX_KERNELS)
            tileattn::arch::amx::detail::pack_min_rows = pack;
#endif
            const tileattn::TilePlan plan = tileattn::plan_forward(qv, kv, vv, opts).tiles();
            const double sec = best_seconds([&] {
              tileattn::forward(qv, kv, vv, tileattn::make_bshd(o.data(), 1, seqlen, h, d), opts);
            }, 1, 5);
            const double scores = static_cast<double>(h) * seqlen * seqlen / (causal ? 2 : 1);
            std::printf("sweep %s budget %7zu Br %4ld Bc %4ld pack_from %6ld: %6.1f GFLOP/s\n",
                        causal ? "causal" : "full  ", budget, static_cast<long>(plan.query_tile_rows),
                        static_cast<long>(plan.key_tile_rows), static_cast<long>(std::min<index_t>(pack, 99999)),
                        4.0 * d * scores / sec * 1e-9);
          }
    return 0;
  }
  for (const bool causal : {false, true}) {  // the whole forward on one thread (H and D from the environment)
    const index_t h = std::getenv("H") ? std::atol(std::getenv("H")) : 2;
    const index_t d = std::getenv("D") ? std::atol(std::getenv("D")) : 128;
    std::vector<tileattn::bf16> q(seqlen * h * d), k(q.size()), v(q.size()), o(q.size());
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto* t : {&q, &k, &v})
      for (auto& e : *t) e = tileattn::bf16(nd(rng));
    tileattn::ForwardOptions opts;
    opts.causal = causal;
    opts.execution = {tileattn::Backend::serial, 1};
    const auto qv = tileattn::make_bshd<const tileattn::bf16>(q.data(), 1, seqlen, h, d);
    const auto kv = tileattn::make_bshd<const tileattn::bf16>(k.data(), 1, seqlen, h, d);
    const auto vv = tileattn::make_bshd<const tileattn::bf16>(v.data(), 1, seqlen, h, d);
    const tileattn::TilePlan plan = tileattn::plan_forward(qv, kv, vv, opts).tiles();
    const double sec = best_seconds([&] { tileattn::forward(qv, kv, vv, tileattn::make_bshd(o.data(), 1, seqlen, h, d), opts); }, 1, 5);
    const double scores = static_cast<double>(h) * seqlen * seqlen / (causal ? 2 : 1);
    std::printf("forward bf16 N %ld H %ld d %ld %s, 1 thread, Br %ld Bc %ld: %.1f GFLOP/s, %.3f ns per score\n",
                static_cast<long>(seqlen), static_cast<long>(h), static_cast<long>(d), causal ? "causal" : "full",
                static_cast<long>(plan.query_tile_rows), static_cast<long>(plan.key_tile_rows),
                4.0 * d * scores / sec * 1e-9, sec * 1e9 / scores);
  }
}
