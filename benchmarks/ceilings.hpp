// benchmarks/ceilings.hpp: the machine's own ceilings, measured in the benchmark's process so
// every kernel figure can be read as a fraction of them: a register-resident FMA loop (fp32
// peak), a register-resident vdpbf16ps loop (bf16 peak, where the CPU has AVX-512 BF16) and
// a register-resident AMX tdpbf16ps loop (where the process may use AMX tiles: arch/amx.hpp)
// and a streaming read (memory bandwidth). Needs nothing but the standard library
// (sgemm_ceiling.hpp adds OpenBLAS's large-GEMM rate). Each is measured once per thread
// count and cached.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <thread>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#if __has_include("tileattn/arch/amx.hpp")
#include "tileattn/arch/amx.hpp"
#endif

namespace tileattn::bench {

using Clock = std::chrono::steady_clock;

/// Runs body(t) on `threads` threads at once; returns the wall time in seconds.
template <class Body>
double run_on_threads(int threads, Body body) {
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

namespace detail {
using vec16 = float __attribute__((vector_size(64)));

/// 2 FMA pipes x 4-cycle latency need >= 8 independent chains; 16 leaves slack for
/// narrower (AVX2) targets where the compiler splits each into two.
inline float fma_chains(long iterations) {
  constexpr int chains = 16;
  vec16 acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = vec16{} + static_cast<float>(c) * 1e-3f;
  const vec16 a = vec16{} + 0.999999f, b = vec16{} + 1e-7f;
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < chains; ++c) acc[c] = acc[c] * a + b;
  vec16 sum{};
  for (int c = 0; c < chains; ++c) sum += acc[c];
  float s = 0;
  for (int l = 0; l < 16; ++l) s += sum[l];
  return s;
}

#if defined(__AVX512BF16__)
/// The FMA loop's shape with vdpbf16ps: 16 independent chains of acc += a . b over bf16 pairs
/// (32 multiplies and 32 adds per instruction: 64 flops, twice an fp32 FMA's 32).
inline float bf16_dot_chains(long iterations) {
  constexpr int chains = 16;
  __m512 acc[chains];
  for (int c = 0; c < chains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];  // a store and a scalar sum (GCC 12 warns inside _mm512_reduce_add_ps)
  _mm512_store_ps(lanes, sum);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
#endif

#if defined(TILEATTN_HAS_AMX_KERNELS) && !defined(TILEATTN_AMX_EMULATE)
/// The AMX loop: four 16 x 16 fp32 accumulator tiles, each += a 16 x 32 bf16 tile times a
/// 32 x 16 one per tdpbf16ps (16 x 16 x 32 multiply-adds: 16384 flops), operands loaded once,
/// four independent accumulators in flight (the gemm's 2 x 2 blocking without its loads).
__attribute__((target("amx-tile,amx-bf16"))) inline float amx_bf16_chains(long iterations) {
  static const arch::amx::detail::TileConfig config{};
  alignas(64) std::uint32_t operand[16 * 16];
  for (std::uint32_t& x : operand) x = 0x3c003c00u;  // pairs of 2^-7: finite sums, no zeros
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  __asm__ __volatile__("" ::: "memory");  // GCC's tileloadd names no memory operand
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
#endif

template <class Measure>
double best_of(int repeats, Measure measure) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) best = std::max(best, measure());
  return best;
}
}  // namespace detail

/// fp32 GFLOP/s of a register-resident FMA loop on `threads` threads (best of 3).
inline double fma_peak_gflops(int threads) {
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  constexpr long iterations = 20'000'000;
  volatile float sink = 0;
  const double gflops = detail::best_of(3, [&] {
    const double seconds = run_on_threads(threads, [&](int) { sink = detail::fma_chains(iterations); });
    return 2.0 * 16 * 16 * iterations * threads / seconds * 1e-9;
  });
  return cache[threads] = gflops;
}

/// bf16 GFLOP/s (2 per multiply-add) of a register-resident vdpbf16ps loop on `threads`
/// threads (best of 3); 0 where the target has no AVX-512 BF16.
inline double bf16_dot_peak_gflops(int threads) {
#if defined(__AVX512BF16__)
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  constexpr long iterations = 20'000'000;
  volatile float sink = 0;
  const double gflops = detail::best_of(3, [&] {
    const double seconds = run_on_threads(threads, [&](int) { sink = detail::bf16_dot_chains(iterations); });
    return 2.0 * 32 * 16 * iterations * threads / seconds * 1e-9;
  });
  return cache[threads] = gflops;
#else
  (void)threads;
  return 0.0;
#endif
}

/// bf16 GFLOP/s (2 per multiply-add) of a register-resident AMX tdpbf16ps loop on `threads`
/// threads (best of 3); 0 where the process may not use AMX tiles or they are not compiled.
inline double amx_bf16_peak_gflops(int threads) {
#if defined(TILEATTN_HAS_AMX_KERNELS) && !defined(TILEATTN_AMX_EMULATE)
  if (!arch::amx_support::available()) return 0.0;
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  constexpr long iterations = 2'000'000;
  volatile float sink = 0;
  const double gflops = detail::best_of(3, [&] {
    const double seconds = run_on_threads(threads, [&](int) { sink = detail::amx_bf16_chains(iterations); });
    return 4.0 * 16384 * iterations * threads / seconds * 1e-9;
  });
  return cache[threads] = gflops;
#else
  (void)threads;
  return 0.0;
#endif
}

/// GB/s of a streaming read of 1 GiB split over `threads` threads (best of 3).
inline double stream_read_gbps(int threads) {
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  const std::size_t floats = (std::size_t{1} << 30) / sizeof(float);
  std::vector<float> data(floats, 1.0f);
  std::vector<float> partial(static_cast<std::size_t>(threads));
  const double gbps = detail::best_of(3, [&] {
    const double seconds = run_on_threads(threads, [&](int t) {
      const std::size_t begin = floats * t / threads, end = floats * (t + 1) / threads;
      detail::vec16 acc{};
      const auto* v = reinterpret_cast<const detail::vec16*>(data.data());
      for (std::size_t i = begin / 16; i < end / 16; ++i) acc += v[i];
      float s = 0;
      for (int l = 0; l < 16; ++l) s += acc[l];
      partial[static_cast<std::size_t>(t)] = s;
    });
    return static_cast<double>(floats * sizeof(float)) / seconds * 1e-9;
  });
  return cache[threads] = gbps;
}

}  // namespace tileattn::bench
