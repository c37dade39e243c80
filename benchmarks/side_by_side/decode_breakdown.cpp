// benchmarks/side_by_side/decode_breakdown.cpp: what one key costs a decode step's in-place
// micro-kernels (kernels/key_loaders.hpp's InPlaceLoader), with the key tile's rows in
// L1/L2: Q K^T over the rows (gemm_nt_rows), the row maxima and the exponentials of the
// online softmax, P V over the rows (gemm_rows) and the streaming pass (touch_rows), for a
// GQA group of 4 query rows, a 128-key tile and head_dim 128, per storage type, with the rows
// of one head adjacent (stride 128: a head-major page) and 1024 elements apart (a
// token-major page of 8 K/V heads). ns per key, median of 5; compare with decode_timer's
// time per key and head to see what memory adds. Where the CPU has AVX-512 BF16 it also times
// prototypes of the bf16 products on vdpbf16ps (Q and P as bf16 pairs), the library's next
// step (docs/paged.md).
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/decode_breakdown.cpp -o /tmp/db
//   taskset -c 2 /tmp/db
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <cstdio>
#include <random>
#include <vector>

#include "tileattn/tileattn.hpp"

using namespace tileattn;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
double ns_per_key(index_t keys, F&& f) {
  constexpr int reps = 4000;
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    f();
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) f();
    runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps / static_cast<double>(keys) * 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

#if defined(__AVX512BF16__)
// Prototypes, not the library's kernels: what the bf16 products would cost on vdpbf16ps, to
// size issue 30's item 1 before building it. Same shapes: 4 query rows, keys read in place.

/// S (4 x n) = Q K^T with Q as bf16 pairs along head_dim (4 rows of d / 2 pairs) and K's
/// rows bf16 in place: 4 x 4 blocks of 16-lane accumulators, each lane summing pairs p = l
/// mod 16, reduced as gemm_nt_rows reduces them.
void qk_pairs(index_t n, index_t d, const std::uint32_t* q_pairs, const bf16* const* k_rows, float* s, index_t lds) {
  for (index_t j0 = 0; j0 < n; j0 += 4) {
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (index_t p = 0; p < d / 2; p += 16) {
      __m512i qv[4];
      for (int r = 0; r < 4; ++r) qv[r] = _mm512_loadu_si512(q_pairs + r * (d / 2) + p);
      for (int j = 0; j < 4; ++j) {
        const __m512i kv = _mm512_loadu_si512(k_rows[j0 + j] + 2 * p);
        for (int r = 0; r < 4; ++r) acc[r * 4 + j] = _mm512_dpbf16_ps(acc[r * 4 + j], (__m512bh)qv[r], (__m512bh)kv);
      }
    }
    const __m512 sums = tileattn::arch::avx512::detail::sum_lanes_16(acc);
    for (int r = 0; r < 4; ++r)
      _mm512_mask_storeu_ps(s + r * lds + j0 - r * 4, static_cast<__mmask16>(0xF << (r * 4)), sums);
  }
}

/// O (4 x d) += P V with P as bf16 pairs of keys (4 rows of n / 2 pairs) and V's rows bf16
/// in place, two rows interleaved into pairs in registers (vpunpck{l,h}wd: the columns come
/// out permuted within 128-bit lanes, undone once per tile, not counted here), 64 columns
/// at a time (16 accumulators).
void pv_pairs(index_t n, index_t d, const std::uint32_t* p_pairs, const bf16* const* v_rows, float* o) {
  for (index_t c0 = 0; c0 < d; c0 += 64) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_loadu_ps(o + r * d + c0 + 16 * v);
    for (index_t k = 0; k < n; k += 2) {
      const __m512i a0 = _mm512_loadu_si512(v_rows[k] + c0), a1 = _mm512_loadu_si512(v_rows[k] + c0 + 32);
      const __m512i b0 = _mm512_loadu_si512(v_rows[k + 1] + c0), b1 = _mm512_loadu_si512(v_rows[k + 1] + c0 + 32);
      const __m512i pairs[4] = {_mm512_unpacklo_epi16(a0, b0), _mm512_unpackhi_epi16(a0, b0),
                                _mm512_unpacklo_epi16(a1, b1), _mm512_unpackhi_epi16(a1, b1)};
      for (int r = 0; r < 4; ++r) {
        const __m512i pr = _mm512_set1_epi32(static_cast<int>(p_pairs[r * (n / 2) + k / 2]));
        for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)pr, (__m512bh)pairs[v]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(o + r * d + c0 + 16 * v, acc[r][v]);
  }
}
#endif

template <class E>
void run(const char* name, index_t row_stride) {
  constexpr index_t g = 4, bc = 128, d = 128;
  std::vector<E> k_buf(static_cast<std::size_t>(bc * row_stride)), v_buf(k_buf.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const float spread = sizeof(E) == 1 ? 20.0f : 1.0f;  // 8-bit: integers / fp8 values of a few tens
  for (auto* buf : {&k_buf, &v_buf})
    for (auto& x : *buf) x = E(std::clamp(normal(rng) * spread, -100.0f, 100.0f));
  std::vector<const E*> k_rows(bc), v_rows(bc);
  for (index_t j = 0; j < bc; ++j) {
    k_rows[static_cast<std::size_t>(j)] = k_buf.data() + j * row_stride;
    v_rows[static_cast<std::size_t>(j)] = v_buf.data() + j * row_stride;
  }
  std::vector<float> q(g * d), s(g * bc), o(g * d, 0.0f);
  for (auto& x : q) x = normal(rng);
  float scale[g], shift[g], sums[g];
  std::fill_n(scale, g, 0.1f);
  std::fill_n(shift, g, 3.0f);
  float sink = 0;
  const double qk = ns_per_key(bc, [&] { arch::native::gemm_nt_rows(g, bc, d, q.data(), d, k_rows.data(), s.data(), bc); });
  const double max = ns_per_key(bc, [&] {
    for (index_t i = 0; i < g; ++i) sink += arch::native::row_max(s.data() + i * bc, bc);
  });
  const double exp = ns_per_key(bc, [&] {
    std::fill(s.begin(), s.end(), 1.0f);
    arch::native::exp2_shift_sum_rows(s.data(), bc, g, bc, scale, shift, sums);
  });
  const double pv = ns_per_key(bc, [&] { arch::native::gemm_rows(g, d, bc, s.data(), bc, v_rows.data(), o.data(), d); });
  const double touch = ns_per_key(bc, [&] {
    arch::native::touch_rows(reinterpret_cast<const void* const*>(k_rows.data()), bc, d * static_cast<index_t>(sizeof(E)));
    arch::native::touch_rows(reinterpret_cast<const void* const*>(v_rows.data()), bc, d * static_cast<index_t>(sizeof(E)));
  });
  std::printf("%-5s rows %4ld apart  ns/key: QK %6.2f  row max %5.2f  exp (with a refill) %5.2f  PV %6.2f  "
              "touch %5.2f  sum %6.2f%s\n",
              name, static_cast<long>(row_stride), qk, max, exp, pv, touch, qk + max + exp + pv + touch,
              sink == 12345.0f ? " " : "");
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<E, bf16>) {
    std::vector<std::uint32_t> q_pairs(g * d / 2), p_pairs(g * bc / 2);
    for (auto& x : q_pairs) x = static_cast<std::uint32_t>(rng()) & 0x3F803F80u;  // pairs of +-1-ish bf16
    for (auto& x : p_pairs) x = static_cast<std::uint32_t>(rng()) & 0x3F003F00u;
    const double qk_p = ns_per_key(bc, [&] { qk_pairs(bc, d, q_pairs.data(), k_rows.data(), s.data(), bc); });
    const double pv_p = ns_per_key(bc, [&] { pv_pairs(bc, d, p_pairs.data(), v_rows.data(), o.data()); });
    std::printf("      prototype on vdpbf16ps (bf16 pairs): QK %6.2f  PV %6.2f ns/key\n", qk_p, pv_p);
  }
#endif
}

}  // namespace

int main() {
  std::printf("micro-kernel set: %s; 4 query rows, 128 keys, head_dim 128\n", arch::native_name());
  for (index_t stride : {index_t{128}, index_t{1024}}) {
    run<float>("fp32", stride);
    run<bf16>("bf16", stride);
    run<std::int8_t>("int8", stride);
    run<fp8_e4m3>("fp8", stride);
  }
}
