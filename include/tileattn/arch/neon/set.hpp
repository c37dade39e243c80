// tileattn/arch/neon/set.hpp: the body of one NEON micro-kernel set, namespace
// tileattn::arch::TILEATTN_NEON_SET; TILEATTN_NEON_HAS_BF16 says whether its gemm multiplies
// bf16 pairs (BFDOT). Included by arch/neon.hpp once per copy, under the copy's target; so no
// include guard, and the headers it uses come from arch/neon.hpp.
//
// gemm: arch/register_gemm.hpp over VecTraits below. NEON has 32 registers of 4 floats: a
// block of C is 6 rows x 3 vectors (18 accumulators, 3 loads of B, one broadcast of A) or
// 8 x 2. NEON has no masked loads: a partial vector (N ending inside it) goes through a
// 4-float buffer on the stack, and only there (masks_every_panel is false).
// Bits: each element of C is one fused chain over K, as generic's (fused on AArch64), so the
// float gemm is generic's bit for bit. BFDOT is not: it sums a pair's two products before
// adding them to C, rounding to odd and flushing subnormals (Arm ARM, BFDotAdd), so the pair
// gemm is within the float error bound of generic's (tests/arch/half_kernels_test.cpp).

namespace tileattn::arch::TILEATTN_NEON_SET {

#if TILEATTN_NEON_HAS_BF16
inline constexpr const char* name = "neon-bf16";
#else
inline constexpr const char* name = "neon";
#endif
/// With BF16, bf16 tiles are multiplied as bf16 pairs (BFDOT); without, converted to float.
inline constexpr bool bf16_dot_product = TILEATTN_NEON_HAS_BF16 != 0;

namespace detail {

inline constexpr index_t lanes = 4;  // floats per register

/// a > b ? a : b per lane: b where either is NaN, as x86's maxps (register_rows.hpp's max).
inline float32x4_t max_or_second(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
/// a < b ? a : b per lane: b where either is NaN, as minps.
inline float32x4_t min_or_second(float32x4_t a, float32x4_t b) { return vbslq_f32(vcltq_f32(a, b), a, b); }

/// v with the lanes from `count` on zeroed.
inline float32x4_t first_lanes_of(float32x4_t v, index_t count) {
  static constexpr std::uint32_t index[lanes] = {0, 1, 2, 3};
  const uint32x4_t in = vcltq_u32(vld1q_u32(index), vdupq_n_u32(static_cast<std::uint32_t>(count)));
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), in));
}

/// The registers and blocking of the tile gemm (arch/register_gemm.hpp). A mask is the count
/// of leading lanes that are in.
struct VecTraits {
  using reg = float32x4_t;
  using mask = index_t;
  static constexpr index_t lanes = detail::lanes;
  static constexpr bool masks_every_panel = false;  // a partial vector goes through memory
  static constexpr index_t pack_min_rows = 18;
  static constexpr int block_rows(int vectors) { return vectors == 3 ? 6 : 8; }
  /// Panels of 3 registers; 4 left end as 2 + 2, 2 and 1 as they are.
  static constexpr int panel_vectors(index_t remaining) {
    return remaining == 4 ? 2 : remaining >= 3 ? 3 : static_cast<int>(remaining);
  }
  static mask first_lanes(index_t count) { return count; }
  static reg zero() { return vdupq_n_f32(0.0f); }
  static reg load(const float* p) { return vld1q_f32(p); }
  static reg load(const float* p, mask m) {
    float t[lanes] = {};
    std::memcpy(t, p, static_cast<std::size_t>(m) * sizeof(float));
    return vld1q_f32(t);
  }
  static void store(float* p, reg v) { vst1q_f32(p, v); }
  static void store(float* p, mask m, reg v) {
    float t[lanes];
    vst1q_f32(t, v);
    std::memcpy(p, t, static_cast<std::size_t>(m) * sizeof(float));
  }
  static reg load_or(const float* p, mask m, reg fill) {
    float t[lanes];
    vst1q_f32(t, fill);
    std::memcpy(t, p, static_cast<std::size_t>(m) * sizeof(float));
    return vld1q_f32(t);
  }
  static reg set1(float x) { return vdupq_n_f32(x); }
  static reg max(reg a, reg b) { return max_or_second(a, b); }
  static reg min(reg a, reg b) { return min_or_second(a, b); }
  static reg mul(reg a, reg b) { return vmulq_f32(a, b); }
  static reg sub(reg a, reg b) { return vsubq_f32(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return vfmaq_f32(c, a, b); }
  static float reduce_max(reg v) { return vmaxvq_f32(v); }  // no NaN reaches it (row_max)
  /// 2^x's reduction (arch/register_exp2.hpp): x clamped to [flush_below, highest_input]
  /// (a NaN stays), n = floor(x), f = x - n (exact).
  struct Split {
    reg f, e;
  };
  static Split split_floor(reg x) {
    x = max(set1(exp2_poly::flush_below), x);
    x = min(set1(exp2_poly::highest_input), x);
    const reg n = vrndmq_f32(x);
    return {sub(x, n), n};
  }
  /// p * 2^n for split_floor's n (n in [-126, 128]), +0 where x < flush_below (-inf too).
  static reg times_two_to_floor_normal(reg p, reg n, reg x) {
    const int32x4_t biased = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));  // exact (NaN: p is NaN)
    const uint32x4_t normal = vmvnq_u32(vcltq_f32(x, set1(exp2_poly::flush_below)));  // NaN: in
    const reg scaled = vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(biased, 23)));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(scaled), normal));
  }
};

template <class E>
struct Operand;

template <>
struct Operand<float> {
  using vec = float32x4_t;
  static vec load(const float* p) { return vld1q_f32(p); }
  static vec load(const float* p, index_t m) { return VecTraits::load(p, m); }
  static vec broadcast(const float* p) { return vld1q_dup_f32(p); }
  static void store_aligned(float* p, vec v) { vst1q_f32(p, v); }
  static vec madd(vec acc, vec a, vec b) { return vfmaq_f32(acc, a, b); }
};

#if TILEATTN_NEON_HAS_BF16
/// bf16 pairs: 4 pairs a register; BFDOT adds each lane's pair product to the accumulator.
template <>
struct Operand<bf16x2> {
  using vec = bfloat16x8_t;
  static vec load(const bf16x2* p) { return vreinterpretq_bf16_u32(vld1q_u32(reinterpret_cast<const std::uint32_t*>(p))); }
  static vec load(const bf16x2* p, index_t m) {
    std::uint32_t t[lanes] = {};
    std::memcpy(t, p, static_cast<std::size_t>(m) * sizeof(bf16x2));
    return vreinterpretq_bf16_u32(vld1q_u32(t));
  }
  static vec broadcast(const bf16x2* p) {
    return vreinterpretq_bf16_u32(vld1q_dup_u32(reinterpret_cast<const std::uint32_t*>(p)));
  }
  static void store_aligned(bf16x2* p, vec v) { vst1q_u32(reinterpret_cast<std::uint32_t*>(p), vreinterpretq_u32_bf16(v)); }
  static float32x4_t madd(float32x4_t acc, vec a, vec b) { return vbfdotq_f32(acc, a, b); }
};
#endif

#include "tileattn/arch/register_gemm.hpp"

#include "tileattn/arch/register_exp2.hpp"

/// Transposes the 4 x 4 block whose rows are r[0..4) in place: r[c] becomes column c.
inline void transpose_square(float32x4_t r[4]) {
  const float32x4x2_t t0 = vtrnq_f32(r[0], r[1]), t1 = vtrnq_f32(r[2], r[3]);
  r[0] = vcombine_f32(vget_low_f32(t0.val[0]), vget_low_f32(t1.val[0]));
  r[1] = vcombine_f32(vget_low_f32(t0.val[1]), vget_low_f32(t1.val[1]));
  r[2] = vcombine_f32(vget_high_f32(t0.val[0]), vget_high_f32(t1.val[0]));
  r[3] = vcombine_f32(vget_high_f32(t0.val[1]), vget_high_f32(t1.val[1]));
}

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements; A given as its K x M transpose when TransA). Any M, N,
/// K >= 0.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b, index_t ldb, float* c,
          index_t ldc) {
  detail::register_gemm<detail::VecTraits, Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}

/// The same over bf16 pairs (K counts pairs): BFDOT where the copy has BF16, else generic's.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16x2* b, index_t ldb, float* c,
          index_t ldc) {
#if TILEATTN_NEON_HAS_BF16
  detail::register_gemm<detail::VecTraits, Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
#else
  generic::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
#endif
}

/// For each of `rows` rows of x (`ld` floats apart): x[r][j] = 2^(x[r][j] * scale[r] -
/// shift[r]) in place, the product and the shift in one FMA; sums[r] = the row's sum of the
/// new values (two accumulators, vector v into v % 2, as arch/avx2.hpp). With `pairs`, the
/// values are also written there rounded to bf16 pairs.
[[gnu::noinline]] inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n, const float* scale,
                                                  const float* shift, float* sums, bf16x2* pairs = nullptr,
                                                  index_t ld_pairs = 0) {
  using detail::lanes;
  using V = detail::VecTraits;
  for (index_t r = 0; r < rows; ++r) {
    float* xr = x + r * ld;
    const float32x4_t f = vdupq_n_f32(scale[r]), s = vdupq_n_f32(-shift[r]);
    float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = sum0;
    index_t j = 0;
    for (; j + 2 * lanes <= n; j += 2 * lanes) {
      const float32x4_t e0 = detail::exp2(vfmaq_f32(s, vld1q_f32(xr + j), f));
      const float32x4_t e1 = detail::exp2(vfmaq_f32(s, vld1q_f32(xr + j + lanes), f));
      vst1q_f32(xr + j, e0);
      vst1q_f32(xr + j + lanes, e1);
      sum0 = vaddq_f32(sum0, e0);
      sum1 = vaddq_f32(sum1, e1);
    }
    for (bool odd = false; j < n; j += lanes, odd = !odd) {
      const index_t count = n - j < lanes ? n - j : lanes;
      const float32x4_t e = detail::exp2(vfmaq_f32(s, V::load(xr + j, count), f));
      V::store(xr + j, count, e);
      float32x4_t& sum = odd ? sum1 : sum0;  // lanes past the end add zeros
      sum = vaddq_f32(sum, detail::first_lanes_of(e, count));
    }
    sums[r] = vaddvq_f32(vaddq_f32(sum0, sum1));
    if (pairs) generic::round_to_pairs(xr, pairs + r * ld_pairs, n);
  }
}

/// True when no x[j] is Inf or NaN (exponent bits all ones).
inline bool all_finite(const float* x, index_t n) {
  const uint32x4_t exponent = vdupq_n_u32(0x7f800000u);
  uint32x4_t bad = vdupq_n_u32(0);
  index_t j = 0;
  for (; j + detail::lanes <= n; j += detail::lanes)
    bad = vorrq_u32(bad, vceqq_u32(vandq_u32(vld1q_u32(reinterpret_cast<const std::uint32_t*>(x + j)), exponent), exponent));
  return vmaxvq_u32(bad) == 0 && generic::all_finite(x + j, n - j);
}

#include "tileattn/arch/register_rows.hpp"
#include "tileattn/arch/register_transpose.hpp"

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return vgetq_lane_f32(detail::exp2(vdupq_n_f32(x)), 0); }

/// dst[j] = float(src[j]), exact: bf16 is the upper half of a float.
inline void to_float(const bf16* src, float* dst, index_t n) {
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const uint16x8_t h = vld1q_u16(reinterpret_cast<const std::uint16_t*>(src + j));
    vst1q_f32(dst + j, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
    vst1q_f32(dst + j + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
  }
  generic::to_float(src + j, dst + j, n - j);
}

/// int8 sign-extended and converted, int8_nan (-128) a quiet NaN; 8 at a time.
inline void to_float(const std::int8_t* src, float* dst, index_t n) {
  index_t j = 0;
  const float32x4_t nan = vdupq_n_f32(std::numeric_limits<float>::quiet_NaN());
  for (; j + 8 <= n; j += 8) {
    const int16x8_t w = vmovl_s8(vld1_s8(src + j));
    const int32x4_t q[2] = {vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)};
    for (int h = 0; h < 2; ++h) {
      const uint32x4_t is_nan = vceqq_s32(q[h], vdupq_n_s32(int8_nan));
      vst1q_f32(dst + j + 4 * h, vbslq_f32(is_nan, nan, vcvtq_f32_s32(q[h])));
    }
  }
  generic::to_float(src + j, dst + j, n - j);
}

/// The other storage types (fp16, fp8): generic's scalar conversions.
template <class Half>
void to_float(const Half* src, float* dst, index_t n) {
  generic::to_float(src, dst, n);
}

/// dst[j] = src[j] rounded to nearest even, NaN kept quiet, as bf16(float): integer
/// rounding on the bits (exact for subnormals too), 4 lanes at a time.
inline void from_float(const float* src, bf16* dst, index_t n) {
  index_t j = 0;
  const uint32x4_t one = vdupq_n_u32(1), bias = vdupq_n_u32(0x7fff), quiet = vdupq_n_u32(0x00400000);
  for (; j + 4 <= n; j += 4) {
    const float32x4_t x = vld1q_f32(src + j);
    const uint32x4_t bits = vreinterpretq_u32_f32(x);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), one);
    const uint32x4_t rounded = vaddq_u32(bits, vaddq_u32(bias, odd));
    const uint32x4_t is_nan = vmvnq_u32(vceqq_f32(x, x));
    const uint32x4_t result = vbslq_u32(is_nan, vorrq_u32(bits, quiet), rounded);
    vst1_u16(reinterpret_cast<std::uint16_t*>(dst + j), vshrn_n_u32(result, 16));
  }
  generic::from_float(src + j, dst + j, n - j);
}
inline void from_float(const float* src, fp16* dst, index_t n) { generic::from_float(src, dst, n); }

/// generic::mul_add for this target: fused, as the gemm's vfmaq.
inline float mul_add(float a, float b, float c) { return std::fma(a, b, c); }

using generic::add_alibi_bias;
using generic::gemm_nt_rows;  // fused on AArch64 (generic::fused_multiply_add)
using generic::gemm_rows;
using generic::touch_rows;
using generic::in_place_pairs;
using generic::in_place_pairs_min_rows;
using generic::gemm_nt_rows_pairs;
using generic::gemm_rows_pairs;
using generic::interleave_pairs;
using generic::interleave_rounded;
using generic::round_to_pairs;
using generic::dequantize_blocks;
using generic::dropout_keep_bits;
using generic::apply_keep_bits;
inline bool all_finite(const bf16x2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const bf16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e4m3* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const std::int8_t* x, index_t n) { return generic::all_finite(x, n); }

/// B operands read in place (arch/prepared_pairs.hpp): one slab of all rows.
TILEATTN_PAIRS_READ_IN_PLACE

}  // namespace tileattn::arch::TILEATTN_NEON_SET
