// tileattn/arch/avx2.hpp: AVX2 + FMA micro-kernels: register-blocked tile gemm, vector 2^x,
// row max, scale, and a register transpose. Same contracts as arch/generic.hpp; compiles
// to nothing without AVX2 and FMA.
//
// gemm: arch/register_gemm.hpp over this set's VecTraits. A 6 x 16 block of C lives in 12
// ymm accumulators (6 rows x 2 vectors of 8 floats); with 2 loads of B and a broadcast of A
// per row that is 15 of the 16 ymm registers. Two FMA pipes at 4-5 cycles of latency need
// 8-10 FMAs in flight, so 12 independent accumulators keep both busy. C is swept in column
// panels of 2 vectors; an odd count ends with a 3-vector panel of 4 rows (again 12
// accumulators) rather than a lone vector; the last vector is masked (vmaskmovps) only when
// N is not a multiple of 8. Panels of B are packed into L1 from 18 rows of C on.
#pragma once

#include "tileattn/arch/isa.hpp"

#if (defined(__AVX2__) && defined(__FMA__)) || TILEATTN_ARCH_X86_DISPATCH

#define TILEATTN_ARCH_AVX2_COMPILED 1

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tileattn/arch/blocked_transpose.hpp"
#include "tileattn/arch/exp2.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"

// F16C (vcvtph2ps): every AVX2 CPU has it; a dispatched build compiles it in (arch/isa.hpp).
#if defined(__F16C__) || TILEATTN_ARCH_X86_DISPATCH
#define TILEATTN_AVX2_F16C 1
#endif

#if TILEATTN_ARCH_X86_DISPATCH
TILEATTN_TARGET_BEGIN(TILEATTN_AVX2_FEATURES)
#endif

namespace tileattn::arch::avx2 {

inline constexpr const char* name = "avx2";
/// No bf16 dot product in AVX2: bf16 tiles are converted to float when loaded.
inline constexpr bool bf16_dot_product = false;

namespace detail {

inline constexpr index_t lanes = 8;      // floats per ymm register
inline constexpr int block_vectors = 2;  // ymm vectors of C per row held in registers

/// Rows of C held in registers for a panel `vectors` wide: 12 accumulators, or 8.
constexpr int block_rows(int vectors) { return vectors == 3 ? 4 : vectors == 2 ? 6 : 8; }

/// A vmaskmovps mask with lanes [0, count) set, count in [0, 8].
inline __m256i first_lanes(index_t count) {
  alignas(64) static constexpr std::int32_t window[2 * lanes] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(window + lanes - count));
}

inline float reduce_add(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float reduce_max(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

/// The registers and blocking of the tile gemm (arch/register_gemm.hpp): a 6 x 16 block of C
/// (4 x 24 for a 3-register panel, 8 x 8 for one), full panels unmasked.
struct VecTraits {
  using reg = __m256;
  using mask = __m256i;
  static constexpr index_t lanes = detail::lanes;
  static constexpr bool masks_every_panel = false;  // vmaskmovps costs more than a plain move
  static constexpr index_t pack_min_rows = 18;      // fewer rows of C: B is read in place
  static constexpr int block_rows(int vectors) { return detail::block_rows(vectors); }
  /// Panels of 2 registers; an odd count ends with one of 3 rather than a lone register.
  static constexpr int panel_vectors(index_t remaining) {
    return remaining == 3 ? 3 : remaining == 1 ? 1 : block_vectors;
  }
  static mask first_lanes(index_t count) { return detail::first_lanes(count); }
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg load(const float* p, mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, mask m, reg v) { _mm256_maskstore_ps(p, m, v); }
  static reg load_or(const float* p, mask m, reg fill) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static float reduce_max(reg v) { return detail::reduce_max(v); }
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  /// 2^x's reduction (arch/register_exp2.hpp): x clamped to [flush_below, highest_input]
  /// (max(lo, NaN) keeps the NaN), n = floor(x), f = x - n (exact).
  struct Split {
    reg f, e;
  };
  static Split split_floor(reg x) {
    x = max(set1(exp2_poly::flush_below), x);
    x = min(set1(exp2_poly::highest_input), x);
    const reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return {sub(x, n), n};
  }
  /// p * 2^n for split_floor's n, n in [-126, 128] (x >= -126 or NaN: p * 2^n is normal or,
  /// n = 128, +inf), else +0 (exp2_poly::flush_below).
  static reg times_two_to_floor_normal(reg p, reg n, reg x) {
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));  // exact
    const reg normal = _mm256_cmp_ps(x, set1(exp2_poly::flush_below), _CMP_NLT_UQ);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23))), normal);
  }
};

/// The gemm's operands: float only (AVX2 has no bf16 dot product).
template <class E>
struct Operand;

template <>
struct Operand<float> {
  using vec = __m256;
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static vec load(const float* p, __m256i m) { return _mm256_maskload_ps(p, m); }
  static vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static void store_aligned(float* p, vec v) { _mm256_store_ps(p, v); }
  static vec madd(vec acc, vec a, vec b) { return _mm256_fmadd_ps(a, b, acc); }
};

#include "tileattn/arch/register_gemm.hpp"

#include "tileattn/arch/register_exp2.hpp"

/// Transposes the 8 x 8 block whose rows are r[0..8) in place: r[c] becomes column c.
inline void transpose_square(__m256 r[8]) {
  __m256 t[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {  // r[4g + j], 128-bit lane L: rows 4g..4g+3 of column 4L + j
    const __m256 u0 = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    const __m256 u1 = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    const __m256 u3 = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    r[4 * g] = u0;
    r[4 * g + 1] = u1;
    r[4 * g + 2] = u2;
    r[4 * g + 3] = u3;
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // column j: low lanes of both groups; 4 + j: high lanes
    t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
    t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b,
          index_t ldb, float* c, index_t ldc) {
  detail::register_gemm<detail::VecTraits, Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}

/// For each of `rows` rows of x (`ld` floats apart): x[r][j] = 2^(x[r][j] * scale[r] -
/// shift[r]) in place, the product and the shift in one FMA; sums[r] = the row's sum of the
/// new values. x = -inf gives 0. One call per score tile (constants loaded once); out of
/// line, as in arch/avx512/softmax_rows.hpp.
[[gnu::noinline]] inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n,
                                                  const float* scale, const float* shift,
                                                  float* sums, bf16x2* pairs = nullptr,
                                                  index_t ld_pairs = 0) {
  using detail::lanes;
  for (index_t r = 0; r < rows; ++r) {
    float* xr = x + r * ld;
    const __m256 f = _mm256_set1_ps(scale[r]), s = _mm256_set1_ps(-shift[r]);
    __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
    index_t j = 0;
    for (; j + 2 * lanes <= n; j += 2 * lanes) {
      const __m256 e0 = detail::exp2(_mm256_fmadd_ps(_mm256_loadu_ps(xr + j), f, s));
      const __m256 e1 = detail::exp2(_mm256_fmadd_ps(_mm256_loadu_ps(xr + j + lanes), f, s));
      _mm256_storeu_ps(xr + j, e0);
      _mm256_storeu_ps(xr + j + lanes, e1);
      sum0 = _mm256_add_ps(sum0, e0);
      sum1 = _mm256_add_ps(sum1, e1);
    }
    for (bool odd = false; j < n; j += lanes, odd = !odd) {
      const __m256i mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
      const __m256 e = detail::exp2(_mm256_fmadd_ps(_mm256_maskload_ps(xr + j, mask), f, s));
      _mm256_maskstore_ps(xr + j, mask, e);
      __m256& sum = odd ? sum1 : sum0;  // vector j / 8 into sum (j / 8) % 2, as the main loop:
      sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));  // zeros past the
    }                                                                          // end change nothing
    sums[r] = detail::reduce_add(_mm256_add_ps(sum0, sum1));
    if (pairs) generic::round_to_pairs(xr, pairs + r * ld_pairs, n);  // never on AVX2 kernels
  }
}

/// True when no x[j] is Inf or NaN (exponent bits all ones).
inline bool all_finite(const float* x, index_t n) {
  using detail::lanes;
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  for (index_t j = 0; j < n; j += lanes) {
    const __m256i mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(_mm256_maskload_ps(x + j, mask)), exponent);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(bits, exponent));
  }
  return _mm256_testz_si256(bad, bad) != 0;
}

#include "tileattn/arch/register_rows.hpp"
#include "tileattn/arch/register_transpose.hpp"

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return _mm256_cvtss_f32(detail::exp2(_mm256_set1_ps(x))); }

/// dst[j] = float(src[j]), exact: bf16 is the upper half of a float; fp16 goes through F16C
/// where the target has it. The tail (and fp16 without F16C) is generic's.
inline void to_float(const bf16* src, float* dst, index_t n) {
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
    _mm256_storeu_ps(dst + j, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  generic::to_float(src + j, dst + j, n - j);
}

inline void to_float(const fp16* src, float* dst, index_t n) {
  index_t j = 0;
#if defined(TILEATTN_AVX2_F16C)
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
#endif
  generic::to_float(src + j, dst + j, n - j);
}

/// dst[j] = src[j] rounded to nearest even, NaN kept quiet, as bf16(float) does: integer
/// rounding on the bits (exact for subnormals too), 8 lanes at a time.
inline void from_float(const float* src, bf16* dst, index_t n) {
  index_t j = 0;
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_loadu_ps(src + j);
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(bias, odd));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, quiet), nan);
    const __m256i halves = _mm256_srli_epi32(rounded, 16);  // 8 x 16 bits in 32-bit lanes
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256(halves, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), packed);
  }
  generic::from_float(src + j, dst + j, n - j);
}

inline void from_float(const float* src, fp16* dst, index_t n) {
  index_t j = 0;
#if defined(TILEATTN_AVX2_F16C)
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  generic::from_float(src + j, dst + j, n - j);
}

namespace detail {
// 8 bytes of 8-bit storage (the low half of an xmm) -> 8 floats, each exactly
// tileattn::to_float of its byte (NaN codes give a NaN; e5m2's keep their payload, quieted).

/// int8 sign-extended and converted; int8_nan (-128) becomes a quiet NaN.
inline __m256 int8_to_ps(__m128i b) {
  const __m256i q = _mm256_cvtepi8_epi32(b);
  const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(q, _mm256_set1_epi32(int8_nan)));
  return _mm256_blendv_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
}
#if defined(TILEATTN_AVX2_F16C)
/// e5m2 is the top byte of an fp16.
inline __m256 e5m2_to_ps(__m128i b) { return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8)); }
/// e4m3fn S.EEEE.MMM as the fp16 S.0EEEE.MMM0000000 is its value times 2^-8, subnormals
/// included (arch/avx512/conversions.hpp's e4m3_to_ps); the NaN code S.1111.111 becomes a quiet NaN of its sign.
inline __m256 e4m3_to_ps(__m128i b) {
  const __m128i w = _mm_cvtepu8_epi16(b), low7 = _mm_set1_epi16(0x7f);
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
  const __m128i magnitude = _mm_slli_epi16(_mm_and_si128(w, low7), 7);
  const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sign, magnitude)), _mm256_set1_ps(256.0f));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(_mm_and_si128(w, low7), low7)));
  const __m256 signed_nan = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)),
                                         _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  return _mm256_blendv_ps(x, signed_nan, nan);
}
#endif

/// dst[j] = to_float(src[j]) for 8-bit src, 8 at a time through `convert`; the tail is generic's.
template <class Byte, class Convert>
inline void bytes_to_float(const Byte* src, float* dst, index_t n, Convert convert) {
  index_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dst + j, convert(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + j))));
  generic::to_float(src + j, dst + j, n - j);
}
}  // namespace detail

/// dst[j] = to_float(src[j]) for 8-bit storage (int8 unscaled; int8_nan gives NaN), exact;
/// fp8 goes through F16C where the target has it, else it is generic's.
inline void to_float(const std::int8_t* src, float* dst, index_t n) {
  detail::bytes_to_float(src, dst, n, detail::int8_to_ps);
}
#if defined(TILEATTN_AVX2_F16C)
inline void to_float(const fp8_e4m3* src, float* dst, index_t n) {
  detail::bytes_to_float(src, dst, n, detail::e4m3_to_ps);
}
inline void to_float(const fp8_e5m2* src, float* dst, index_t n) {
  detail::bytes_to_float(src, dst, n, detail::e5m2_to_ps);
}
#else
inline void to_float(const fp8_e4m3* src, float* dst, index_t n) { generic::to_float(src, dst, n); }
inline void to_float(const fp8_e5m2* src, float* dst, index_t n) { generic::to_float(src, dst, n); }
#endif

/// generic::mul_add for this target: fused, as its gemm's vfmadd (std::fma, not a * b + c,
/// which GCC contracts only from -O2 on).
inline float mul_add(float a, float b, float c) { return std::fma(a, b, c); }
/// generic::add_alibi_bias compiled for this target (FMA).
inline void add_alibi_bias(float* x, index_t n, float slope, index_t diagonal) {
  for (index_t j = 0; j < n; ++j) x[j] += slope * static_cast<float>(std::abs(diagonal - j));
}

// bf16 pair operands are never used with AVX2 (bf16_dot_product is false); generic's
// versions keep the interface the same as every arch's.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16x2* b,
          index_t ldb, float* c, index_t ldc) {
  generic::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}
#if TILEATTN_ARCH_X86_DISPATCH
// Here generic is compiled for the baseline, whose sums are not fused: take the fused ones
// an AVX2 + FMA build of generic has (std::fma, inlined as vfmadd where GCC inlines them).
template <class E>
void gemm_nt_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
                  index_t ldc) {
  generic::gemm_nt_rows<E, true>(m, n, k, a, lda, b_rows, c, ldc);
}
template <class E>
void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
               index_t ldc) {
  generic::gemm_rows<E, true>(m, n, k, a, lda, b_rows, c, ldc);
}
#else
using generic::gemm_nt_rows;
using generic::gemm_rows;
#endif
using generic::touch_rows;
using generic::in_place_pairs;  // (false: the pair products below are never called)
using generic::in_place_pairs_min_rows;
using generic::gemm_nt_rows_pairs;
using generic::gemm_rows_pairs;
using generic::interleave_pairs;
using generic::interleave_rounded;
using generic::round_to_pairs;
using generic::dequantize_blocks;  // (AVX2 has no 16-lane table lookup: the scalar one)
using generic::dropout_keep_bits;  // (scalar Philox: AVX2's vector one is not written yet)
using generic::apply_keep_bits;
inline bool all_finite(const bf16x2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const bf16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e4m3* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const std::int8_t* x, index_t n) { return generic::all_finite(x, n); }

/// B operands read in place (arch/prepared_pairs.hpp): one slab of all rows.
TILEATTN_PAIRS_READ_IN_PLACE

}  // namespace tileattn::arch::avx2

#if TILEATTN_ARCH_X86_DISPATCH
TILEATTN_TARGET_END
#endif

#endif  // (__AVX2__ && __FMA__) || TILEATTN_ARCH_X86_DISPATCH
