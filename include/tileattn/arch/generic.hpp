// tileattn/arch/generic.hpp: portable scalar micro-kernels: the reference every SIMD arch
// file must match, and the fallback for targets without one.
//
// Every arch namespace provides the same functions with the same contracts, so ops/ and
// memory/ can call `arch::native::` without knowing which one it got: gemm, gemm_nt_rows,
// gemm_rows (K and V rows read in place), gemm_nt_rows_pairs and gemm_rows_pairs (the same
// with Q and P as bf16 pairs: in_place_pairs, in_place_pairs_min_rows), row_max,
// exp2_shift_sum_rows (and its one-row exp2_shift_sum), all_finite, scale, exp2, mul_add, add_alibi_bias,
// transpose, the 16-bit conversions to_float / from_float, the 8-bit (fp8_e4m3, fp8_e5m2,
// int8: core/quantized_types.hpp) to_float (and, for bf16 pair tiles,
// interleave_pairs, interleave_rounded, round_to_pairs). An arch whose gemm also
// multiplies bf16 pairs (bf16x2 operands, core/half_types.hpp) says so with
// bf16_dot_product = true; generic has such a gemm too, as the reference, but keeps
// bf16_dot_product false: converting bf16 to float tiles is faster in scalar code.
// arch/micro_kernel_set.hpp states this list as a concept, MicroKernelSet.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "tileattn/arch/philox.hpp"
#include "tileattn/arch/prepared_pairs.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::arch::generic {

inline constexpr const char* name = "generic";
/// Whether forward kernels multiply bf16 tiles as bf16 pairs (else they convert to float).
inline constexpr bool bf16_dot_product = false;

/// Whether this target's multiply-adds are fused (one rounding): with FMA, as the SIMD sets'.
/// The in-place products take it as a parameter, so that a dispatched avx2 set (arch/isa.hpp)
/// gets the fused sums an AVX2 + FMA build of generic gives, from a baseline build. AArch64
/// always fuses (__ARM_FEATURE_FMA), as its SIMD sets do.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
inline constexpr bool fused_multiply_add = true;
#else
inline constexpr bool fused_multiply_add = false;
#endif

/// The sum of 16 partial dot-product lanes in the order of the SIMD reduction (lane pairs
/// (l, l + 2) within each group of 4, then (l, l + 1), then groups (g, g + 1), (g, g + 2)).
inline float dot_lanes_sum(const float (&x)[16]) {
  float group[4];
  for (int g = 0; g < 4; ++g) {
    const float* l = x + 4 * g;
    group[g] = (l[0] + l[2]) + (l[1] + l[3]);
  }
  return (group[0] + group[1]) + (group[2] + group[3]);
}

/// a * b + c as this set's gemm (below, which calls it) computes it: one fused multiply-add
/// where the target has FMA (std::fma: a * b + c is contracted by GCC only from -O2 on), two
/// roundings where not. ops/ takes its scalar row-statistic updates and the visible-values
/// P V from here, so they round as the gemm does, and a dispatched build as a -march build.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

namespace detail {
/// c + a b, one step of gemm's sums: fused where this target fuses (mul_add: one rounding per
/// step, whether or not the compiler vectorizes the loop). Over bf16 pairs, as the hardware's
/// dot-product instruction sums a pair product, high halves first: c = (c + a.hi b.hi) + a.lo
/// b.lo (products of bf16 values are exact in float). vdpbf16ps matches this bit for bit on
/// normal numbers; it treats subnormal inputs, products and sums as zero, which this does
/// not (tests/arch/half_kernels_test.cpp bounds the difference).
inline float step(float a, float b, float c) { return mul_add(a, b, c); }
inline float step(bf16x2 a, bf16x2 b, float c) {
  return (c + to_float(a.hi) * to_float(b.hi)) + to_float(a.lo) * to_float(b.lo);
}
}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0. With TransA, A is given by its
/// transpose (K x M, row-major): element (i, p) at a[p * lda + i] (the backward's P^T and
/// dS^T, read from P and dS as they are). E is float, or bf16x2 (K counts pairs; each sums
/// as detail::step says).
template <bool Accumulate, bool TransA = false, class E>
  requires std::same_as<E, float> || std::same_as<E, bf16x2>
void gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c, index_t ldc) {
  for (index_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if constexpr (!Accumulate)
      for (index_t j = 0; j < n; ++j) ci[j] = 0.0f;
    for (index_t p = 0; p < k; ++p) {
      const E aip = TransA ? a[p * lda + i] : a[i * lda + p];
      const E* bp = b + p * ldb;
      for (index_t j = 0; j < n; ++j) ci[j] = detail::step(aip, bp[j], ci[j]);
    }
  }
}

/// C (M x N) = A (M x K) * B^T, B given by its N rows b_rows[j] (K elements each, float,
/// bf16, fp16 or 8-bit, anywhere in memory): Q K^T with the keys read in place
/// (ops::matmul_transposed). Each element is a dot product summed in 16 interleaved
/// partial sums (p mod 16), then those pairwise (dot_lanes_sum), as the SIMD sets sum it.
template <class E, bool Fused = fused_multiply_add>
void gemm_nt_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows,
                  float* c, index_t ldc) {
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      float lanes[16] = {};
      for (index_t p = 0; p < k; ++p) {
        if constexpr (Fused)
          lanes[p % 16] = std::fma(a[i * lda + p], tileattn::to_float(b_rows[j][p]), lanes[p % 16]);
        else
          lanes[p % 16] += a[i * lda + p] * tileattn::to_float(b_rows[j][p]);
      }
      c[i * ldc + j] = dot_lanes_sum(lanes);
    }
}

/// Brings rows[0..n) (`bytes` each) into cache ahead of the products that read them in
/// place; a hint, which the scalar set leaves to the hardware.
inline void touch_rows(const void* const*, index_t, index_t) {}

/// C (M x N) += A (M x K) * B, B's row p at b_rows[p] (N elements of E, anywhere in
/// memory): P V with the values read in place, summed over p in order as gemm does.
template <class E, bool Fused = fused_multiply_add>
void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
               index_t ldc) {
  for (index_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (index_t p = 0; p < k; ++p) {
      const float aip = a[i * lda + p];
      for (index_t j = 0; j < n; ++j) {
        if constexpr (Fused)
          ci[j] = std::fma(aip, tileattn::to_float(b_rows[p][j]), ci[j]);
        else
          ci[j] += aip * tileattn::to_float(b_rows[p][j]);
      }
    }
  }
}

/// Whether the in-place products of a decode step multiply bf16 pairs (gemm_nt_rows_pairs,
/// gemm_rows_pairs) where Q and K/V are bf16: a set's choice, like bf16_dot_product, but
/// only where its pairs are fast without a packed layout (vdpbf16ps at the FMA's rate).
inline constexpr bool in_place_pairs = false;
/// The fewest query rows per K/V group (a GQA group's heads times the new tokens) for which
/// they do, where in_place_pairs: 1 where pairs always pay.
inline constexpr index_t in_place_pairs_min_rows = 1;

/// C (M x N) = A B^T with A's rows bf16 pairs (lda pairs apart; K elements, the last pair's
/// high half zero when K is odd) and B given by its N bf16 rows b_rows[j] (K elements each,
/// anywhere in memory): Q K^T on pairs with the keys read in place. Pair p of a dot product
/// goes to lane p mod 16 in steps of detail::step (as vdpbf16ps sums it), then the lanes sum
/// as dot_lanes_sum.
inline void gemm_nt_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                               float* c, index_t ldc) {
  const bf16 zero{};
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      float lanes[16] = {};
      for (index_t p = 0; 2 * p < k; ++p) {
        const bf16x2 b{b_rows[j][2 * p], 2 * p + 1 < k ? b_rows[j][2 * p + 1] : zero};
        lanes[p % 16] = detail::step(a[i * lda + p], b, lanes[p % 16]);
      }
      c[i * ldc + j] = dot_lanes_sum(lanes);
    }
}

/// C (M x N) += A B with A's rows bf16 pairs of K (lda pairs apart; the last pair's high
/// half zero when K is odd) and B's row p at b_rows[p] (N bf16 values, anywhere in memory):
/// P V on pairs with the values read in place, rows 2q and 2q + 1 paired (a zero row past
/// the last), summed over the pairs in order.
inline void gemm_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                            float* c, index_t ldc) {
  const bf16 zero{};
  for (index_t i = 0; i < m; ++i)
    for (index_t q = 0; 2 * q < k; ++q)
      for (index_t j = 0; j < n; ++j) {
        const bf16x2 b{b_rows[2 * q][j], 2 * q + 1 < k ? b_rows[2 * q + 1][j] : zero};
        c[i * ldc + j] = detail::step(a[i * lda + q], b, c[i * ldc + j]);
      }
}

/// max(x[0..n)), -inf for n == 0.
inline float row_max(const float* x, index_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (index_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

/// For each of `rows` rows of x (`ld` floats apart): x[r][j] = 2^(x[r][j] * scale[r] -
/// shift[r]) in place, the product and the shift in one fused multiply-add; sums[r] = the
/// row's sum of the new values. x = -inf gives 0. With `pairs`, the values are also
/// written there rounded to bf16, row r at pairs + r * ld_pairs (ceil(n / 2) pairs, an odd
/// n padded with a zero); an arch may then leave x as it was (avx512 does).
inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n, const float* scale,
                                const float* shift, float* sums, bf16x2* pairs = nullptr,
                                                  index_t ld_pairs = 0) {
  for (index_t r = 0; r < rows; ++r) {
    float* xr = x + r * ld;
    float sum = 0.0f;
    for (index_t j = 0; j < n; ++j) {
      xr[j] = std::exp2(std::fma(xr[j], scale[r], -shift[r]));
      sum += xr[j];
    }
    sums[r] = sum;
    if (pairs)  // P as bf16 pairs for P V, an odd n padded with a zero
      for (index_t j = 0; j < n; j += 2)
        pairs[r * ld_pairs + j / 2] = {bf16(xr[j]), j + 1 < n ? bf16(xr[j + 1]) : bf16{}};
  }
}

/// One row of exp2_shift_sum_rows: x[j] = 2^(x[j] * scale - shift); returns the sum.
inline float exp2_shift_sum(float* x, index_t n, float scale, float shift) {
  float sum = 0.0f;
  exp2_shift_sum_rows(x, n, 1, n, &scale, &shift, &sum);
  return sum;
}

/// True when no x[j] is Inf or NaN.
inline bool all_finite(const float* x, index_t n) {
  for (index_t j = 0; j < n; ++j)
    if (!std::isfinite(x[j])) return false;
  return true;
}

/// x[j] *= factor.
inline void scale(float* x, index_t n, float factor) {
  for (index_t j = 0; j < n; ++j) x[j] *= factor;
}

/// dst[j] = float(src[j]) (exact): bf16, fp16, fp8_e4m3, fp8_e5m2, or int8 unscaled (-128,
/// int8_nan, gives NaN).
template <class Half>
void to_float(const Half* src, float* dst, index_t n) {
  for (index_t j = 0; j < n; ++j) dst[j] = tileattn::to_float(src[j]);
}

/// dst[0, blocks x B::values) = the values of `blocks` contiguous 4-bit blocks (q4_0, MXFP4,
/// NVFP4: core/block_quantized_types.hpp), exact: each block's 16-entry table of nibble values
/// times its scale, then one lookup per nibble (the vector sets do the same in registers).
template <block_quantized_type B>
void dequantize_blocks(const B* src, float* dst, index_t blocks) {
  float table[16];
  for (index_t c = 0; c < blocks; ++c, dst += B::values) {
    const float scale = block_scale(src[c]);
    for (int q = 0; q < 16; ++q) table[q] = nibble_values<B>[static_cast<std::size_t>(q)] * scale;
    for (int i = 0; i < B::values; ++i) dst[i] = table[nibble(src[c], i)];
  }
}

/// dst[j] = src[j] rounded to bf16 or fp16 (to nearest even; core/half_types.hpp).
template <class Half>
void from_float(const float* src, Half* dst, index_t n) {
  for (index_t j = 0; j < n; ++j) dst[j] = Half(src[j]);
}

/// dst[c] = (a[c], b[c]) for c < n: two rows interleaved into pairs (b == nullptr: zeros).
inline void interleave_pairs(const bf16* a, const bf16* b, bf16x2* dst, index_t n) {
  for (index_t c = 0; c < n; ++c) dst[c] = {a[c], b ? b[c] : bf16{}};
}

/// dst[c] = (bf16(a[c]), bf16(b[c])) for c < n: two float rows rounded and interleaved into
/// pairs (b == nullptr: zeros); the backward's P and dS as transposed A operands.
inline void interleave_rounded(const float* a, const float* b, bf16x2* dst, index_t n) {
  for (index_t c = 0; c < n; ++c) dst[c] = {bf16(a[c]), b ? bf16(b[c]) : bf16{}};
}

/// dst (ceil(n / 2) pairs) = x[0..n) rounded to bf16, in order, an odd n padded with a zero.
inline void round_to_pairs(const float* x, bf16x2* dst, index_t n) {
  for (index_t j = 0; j < n; j += 2) dst[j / 2] = {bf16(x[j]), j + 1 < n ? bf16(x[j + 1]) : bf16{}};
}

namespace detail {
inline unsigned code_of(bf16 x) { return x.bits; }
inline unsigned code_of(fp16 x) { return x.bits; }
inline unsigned code_of(fp8_e4m3 x) { return x.bits; }
inline unsigned code_of(fp8_e5m2 x) { return x.bits; }
inline unsigned code_of(std::int8_t x) { return static_cast<std::uint8_t>(x); }
inline unsigned code_of(bf16x2 x) { return code_of(x.lo) | code_of(x.hi) << 16; }

/// True when no x[j]'s code c has (c & mask) == special, nor (c >> 16 & mask) == special
/// when Halves (both halves of a pair).
template <bool Halves = false, class T>
inline bool no_special_code(const T* x, index_t n, unsigned mask, unsigned special) {
  for (index_t j = 0; j < n; ++j) {
    const unsigned c = code_of(x[j]);
    if ((c & mask) == special || (Halves && (c >> 16 & mask) == special)) return false;
  }
  return true;
}
}  // namespace detail

/// True when no value of the n pairs is Inf or NaN.
inline bool all_finite(const bf16x2* x, index_t n) { return detail::no_special_code<true>(x, n, 0x7f80, 0x7f80); }

/// True when no x[j] (bf16 or fp16 storage, read in place) is Inf or NaN.
inline bool all_finite(const bf16* x, index_t n) { return detail::no_special_code(x, n, 0x7f80, 0x7f80); }
inline bool all_finite(const fp16* x, index_t n) { return detail::no_special_code(x, n, 0x7c00, 0x7c00); }

/// True when no x[j] (8-bit storage, read in place) is Inf or NaN: e4m3 has no Inf and its
/// NaN is S.1111.111; e5m2's exponent is all ones; int8's NaN is int8_nan (-128).
inline bool all_finite(const fp8_e4m3* x, index_t n) { return detail::no_special_code(x, n, 0x7f, 0x7f); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return detail::no_special_code(x, n, 0x7c, 0x7c); }
inline bool all_finite(const std::int8_t* x, index_t n) {
  return detail::no_special_code(x, n, 0xff, static_cast<std::uint8_t>(int8_nan));
}

/// 2^x for one value (running-max corrections); 2^-inf = 0.
inline float exp2(float x) { return std::exp2(x); }

/// x[j] += slope * |diagonal - j| for j < n: ALiBi's linear bias on a row of scores (the
/// column of distance 0 at `diagonal`). Scalar in every set, but compiled for the set's
/// target, so the multiply-add is fused where that target fuses it (as a -march build does).
inline void add_alibi_bias(float* x, index_t n, float slope, index_t diagonal) {
  for (index_t j = 0; j < n; ++j) x[j] += slope * static_cast<float>(std::abs(diagonal - j));
}

/// dst[c * ldd + r] = src[r * lds + c] for a rows x cols block (keys into K^T).
inline void transpose(index_t rows, index_t cols, const float* src, index_t lds, float* dst,
                      index_t ldd) {
  for (index_t c = 0; c < cols; ++c)
    for (index_t r = 0; r < rows; ++r) dst[c * ldd + r] = src[r * lds + c];
}

/// B operands read in place (arch/prepared_pairs.hpp): one slab of all rows.
TILEATTN_PAIRS_READ_IN_PLACE

}  // namespace tileattn::arch::generic
