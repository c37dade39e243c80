// tests/arch/micro_kernels_speed.cpp: a stand-alone timing tool (not a test): GFLOP/s of
// each compiled-in arch's gemm on attention-shaped tiles against a register-resident FMA
// loop, and the cost per element of exp2_shift_sum and transpose.
//
//   g++ -std=c++20 -O3 -march=native -Iinclude tests/arch/micro_kernels_speed.cpp -o speed
//   ./speed                  # every shape below, all arches compiled in
//   ./speed 128 512 128 1    # one shape (M N K accumulate)
//
// Times are the best of several runs in CPU time of this thread, so that other processes
// sharing the cores inflate them less than wall time would.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <immintrin.h>

#include "tileattn/arch/avx2.hpp"
#include "tileattn/arch/avx512.hpp"
#include "tileattn/arch/generic.hpp"

namespace {

using tileattn::index_t;

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Best per-call seconds of `body` over `trials` batches of `calls` calls.
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

/// Peak of independent FMA chains held in registers (12 accumulators: more than
/// latency x throughput on current x86 cores, and they fit 16 ymm registers too).
template <class Vec, Vec (*Fma)(Vec, Vec, Vec), Vec (*Set1)(float)>
double fma_peak_gflops(int floats_per_vector) {
  constexpr int chains = 12;
  constexpr long iterations = 4000000;
  double best = 1e30;
  for (int t = 0; t < 5; ++t) {
    Vec acc[chains];
    for (int i = 0; i < chains; ++i) acc[i] = Set1(0.001f * static_cast<float>(i));
    const Vec x = Set1(0.9999f), y = Set1(1e-5f);
    const double start = thread_seconds();
    for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
      for (int i = 0; i < chains; ++i) acc[i] = Fma(acc[i], x, y);
      // Keep every chain live and in its register across iterations.
      asm volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]), "+v"(acc[4]), "+v"(acc[5]));
      asm volatile("" : "+v"(acc[6]), "+v"(acc[7]), "+v"(acc[8]), "+v"(acc[9]), "+v"(acc[10]), "+v"(acc[11]));
    }
    best = std::min(best, thread_seconds() - start);
  }
  return static_cast<double>(iterations) * chains * 2 * floats_per_vector / best * 1e-9;
}

std::vector<float> filled(std::size_t n) {
  std::vector<float> v(n + 16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;
  return v;
}

/// Per-arch entry points, so every arch runs through the same timing code.
struct Arch {
  const char* name;
  void (*gemm_overwrite)(index_t, index_t, index_t, const float*, index_t, const float*, index_t,
                         float*, index_t);
  void (*gemm_accumulate)(index_t, index_t, index_t, const float*, index_t, const float*, index_t,
                          float*, index_t);
  float (*exp2_shift_sum)(float*, index_t, float, float);
  void (*transpose)(index_t, index_t, const float*, index_t, float*, index_t);
  double peak;
};

double gemm_gflops(const Arch& arch, index_t m, index_t n, index_t k, bool accumulate) {
  const index_t lda = (k + 15) / 16 * 16, ldb = (n + 15) / 16 * 16, ldc = ldb;
  std::vector<float> a = filled(static_cast<std::size_t>(m * lda)),
                     b = filled(static_cast<std::size_t>(k * ldb)),
                     c = filled(static_cast<std::size_t>(m * ldc));
  const auto gemm = accumulate ? arch.gemm_accumulate : arch.gemm_overwrite;
  const long calls = std::max(1L, 400000000L / (2 * m * n * k));
  const double s = best_seconds([&] { gemm(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc); }, calls);
  return 2.0 * static_cast<double>(m * n * k) / s * 1e-9;
}

void report_gemm(const Arch& arch, index_t m, index_t n, index_t k, bool accumulate) {
  const double g = gemm_gflops(arch, m, n, k, accumulate);
  std::printf("  %-8s gemm %4ld x %4ld x %4ld %s  %7.1f GFLOP/s  %5.1f%% of FMA peak\n", arch.name,
              static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
              accumulate ? "C+=AB" : "C =AB", g, 100.0 * g / arch.peak);
}

void report_elementwise(const Arch& arch) {
  constexpr index_t rows = 128, cols = 512;  // one (Br, Bc) score tile
  std::vector<float> s = filled(static_cast<std::size_t>(rows * cols));
  const double exp_s = best_seconds([&] {
    for (index_t r = 0; r < rows; ++r) arch.exp2_shift_sum(s.data() + r * cols, cols, 0.18f, 0.5f);
  }, 20);
  std::printf("  %-8s exp2_shift_sum on a 128 x 512 tile: %7.2f us (%.3f ns/element)\n", arch.name,
              exp_s * 1e6, exp_s * 1e9 / (rows * cols));
  if (arch.transpose) {
    constexpr index_t keys = 512, head_dim = 128, row_stride = 16 * head_dim;  // BSHD, 16 heads
    std::vector<float> k = filled(static_cast<std::size_t>(keys * row_stride)),
                       k_t = filled(static_cast<std::size_t>(head_dim * keys));
    const double t_s = best_seconds([&] {
      arch.transpose(keys, head_dim, k.data(), row_stride, k_t.data(), keys);
    }, 20);
    std::printf("  %-8s transpose of a 512 x 128 K tile (BSHD, 16 heads): %7.2f us (%.3f ns/element)\n",
                arch.name, t_s * 1e6, t_s * 1e9 / (keys * head_dim));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Arch> arches;
  arches.push_back({"generic", tileattn::arch::generic::gemm<false>, tileattn::arch::generic::gemm<true>,
                    tileattn::arch::generic::exp2_shift_sum, nullptr, 0.0});
#if defined(__AVX2__) && defined(__FMA__)
  {
    const double peak = fma_peak_gflops<__m256, _mm256_fmadd_ps, _mm256_set1_ps>(8);
    arches.push_back({"avx2", tileattn::arch::avx2::gemm<false>, tileattn::arch::avx2::gemm<true>,
                      tileattn::arch::avx2::exp2_shift_sum, tileattn::arch::avx2::transpose, peak});
    arches.front().peak = peak;  // generic is auto-vectorized at best to the same width
  }
#endif
#if defined(__AVX512F__)
  {
    const double peak = fma_peak_gflops<__m512, _mm512_fmadd_ps, _mm512_set1_ps>(16);
    arches.push_back({"avx512", tileattn::arch::avx512::gemm<false>, tileattn::arch::avx512::gemm<true>,
                      tileattn::arch::avx512::exp2_shift_sum, tileattn::arch::avx512::transpose, peak});
  }
#endif
  for (const Arch& a : arches)
    if (a.peak > 0) std::printf("%-8s register-resident FMA peak: %.1f GFLOP/s\n", a.name, a.peak);

  if (argc >= 4) {
    const index_t m = std::atol(argv[1]), n = std::atol(argv[2]), k = std::atol(argv[3]);
    const bool accumulate = argc >= 5 && std::atoi(argv[4]) != 0;
    for (const Arch& a : arches) report_gemm(a, m, n, k, accumulate);
    return 0;
  }
  struct Shape {
    index_t m, n, k;
    bool accumulate;
    const char* what;
  };
  const Shape shapes[] = {
      {512, 128, 128, false, "S = Q K^T, d = 128, Br 512 x Bc 128"},
      {512, 128, 128, true, "O += P V, d = 128, Br 512 x Bc 128"},
      {128, 512, 128, false, "S = Q K^T, d = 128"}, {128, 128, 512, true, "O += P V, d = 128"},
      {128, 512, 64, false, "S = Q K^T, d = 64"},   {128, 64, 512, true, "O += P V, d = 64"},
      {128, 80, 512, true, "O += P V, d = 80"},     {64, 256, 256, true, "O += P V, d = 256"},
      {113, 203, 96, false, "odd sizes"},
  };
  for (const Shape& s : shapes) {
    std::printf("%s\n", s.what);
    for (const Arch& a : arches) report_gemm(a, s.m, s.n, s.k, s.accumulate);
  }
  std::printf("elementwise\n");
  for (const Arch& a : arches) report_elementwise(a);
}
