// tileattn/arch/avx512/softmax_rows.hpp: the online softmax's row operations on AVX-512: vector
// 2^x, row max, the exponentials with their sums (and bf16 pairs of P), scale, the finite
// check of a score row, and the scalar helpers compiled for the target.
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes only arch/register_*.hpp, the parts every SIMD set shares.

namespace detail {
#include "tileattn/arch/register_exp2.hpp"

/// exp2_shift_sum_rows for one row; with Pairs the values go to `pairs` rounded to bf16
/// (vcvtne2ps2bf16: round to nearest even, subnormal results flushed to zero) instead of
/// back into x.
template <bool Pairs>
inline float exp2_shift_sum_row(float* xr, index_t n, __m512 f, __m512 s, [[maybe_unused]] bf16x2* pairs) {
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    const __m512 e0 = exp2<Pairs>(_mm512_fmadd_ps(_mm512_loadu_ps(xr + j), f, s));
    const __m512 e1 = exp2<Pairs>(_mm512_fmadd_ps(_mm512_loadu_ps(xr + j + lanes), f, s));
    if constexpr (Pairs) {
#if TILEATTN_AVX512_HAS_BF16
      _mm512_storeu_si512(pairs + j / 2, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
#endif
    } else {
      _mm512_storeu_ps(xr + j, e0);
      _mm512_storeu_ps(xr + j + lanes, e1);
    }
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  if constexpr (Pairs) {
#if TILEATTN_AVX512_HAS_BF16
    if (const index_t rest = n - j; rest > 0) {  // up to 31 values: two masked vectors
      const __mmask16 m0 = first_lanes(rest < lanes ? rest : lanes);
      const __mmask16 m1 = rest > lanes ? first_lanes(rest - lanes) : __mmask16(0);
      const __m512 e0 = _mm512_maskz_mov_ps(m0, exp2<Pairs>(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, xr + j), f, s)));
      const __m512 e1 = _mm512_maskz_mov_ps(m1, exp2<Pairs>(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, xr + j + lanes), f, s)));
      const index_t halves = (rest + 1) / 2 * 2;  // an odd count's pad is the zero of a masked lane
      const __mmask32 out = halves == 32 ? ~__mmask32(0) : (__mmask32(1) << halves) - 1;
      _mm512_mask_storeu_epi16(pairs + j / 2, out, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
      sum0 = _mm512_add_ps(sum0, e0);  // as the main loop and the float tail: masked lanes
      sum1 = _mm512_add_ps(sum1, e1);  // are +0, so the sums are the float path's
    }
#endif
  } else {
    for (bool odd = false; j < n; j += lanes, odd = !odd) {
      const __mmask16 mask = first_lanes(n - j < lanes ? n - j : lanes);
      const __m512 e = exp2<Pairs>(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, xr + j), f, s));
      _mm512_mask_storeu_ps(xr + j, mask, e);
      __m512& sum = odd ? sum1 : sum0;  // vector j / 16 into sum (j / 16) % 2, as the main loop
      sum = _mm512_mask_add_ps(sum, mask, sum, e);
    }
  }
  // Value j always lands in lane j % 16 of sum (j / 16) % 2, so zeros past the visible keys
  // (a key tile cut short at a query tile's last visible key, or not) leave the sum's
  // rounding unchanged: results never depend on the tiling.
  return intrinsics::reduce_add_ps(_mm512_add_ps(sum0, sum1));
}
}  // namespace detail

/// For each of `rows` rows of x (`ld` floats apart): x[r][j] = 2^(x[r][j] * scale[r] -
/// shift[r]) in place, the product and the shift in one FMA; sums[r] = the row's sum of the
/// new values. x = -inf gives 0. With `pairs`, the values are written there instead
/// (with AVX-512 BF16; else as well), rounded to bf16, row r at pairs + r * ld_pairs (ceil(n / 2)
/// pairs, an odd n padded with a zero): P as the operand of P V, with no second pass.
/// One call per score tile, so the polynomial's constants are loaded once for all its
/// rows; kept out of line (inlined into ops::online_softmax_step, GCC 12 schedules the
/// loop worse).
[[gnu::noinline]] inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n,
                                                  const float* scale, const float* shift,
                                                  float* sums, bf16x2* pairs = nullptr,
                                                  index_t ld_pairs = 0) {
  for (index_t r = 0; r < rows; ++r) {
    const __m512 f = _mm512_set1_ps(scale[r]), s = _mm512_set1_ps(-shift[r]);
#if TILEATTN_AVX512_HAS_BF16
    sums[r] = pairs ? detail::exp2_shift_sum_row<true>(x + r * ld, n, f, s, pairs + r * ld_pairs)
                    : detail::exp2_shift_sum_row<false>(x + r * ld, n, f, s, nullptr);
#else
    sums[r] = detail::exp2_shift_sum_row<false>(x + r * ld, n, f, s, nullptr);
    if (pairs) generic::round_to_pairs(x + r * ld, pairs + r * ld_pairs, n);
#endif
  }
}

/// True when no x[j] is Inf or NaN (exponent bits all ones).
inline bool all_finite(const float* x, index_t n) {
  using detail::lanes;
  __mmask16 bad = 0;
#if TILEATTN_AVX512_HAS_DQ
  constexpr int inf_or_nan = 0x01 | 0x08 | 0x10 | 0x80;  // QNaN, +Inf, -Inf, SNaN
  index_t j = 0;
  for (; j + lanes <= n; j += lanes) bad |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(x + j), inf_or_nan);
  if (j < n) bad |= _mm512_fpclass_ps_mask(_mm512_maskz_loadu_ps(detail::first_lanes(n - j), x + j), inf_or_nan);
#else
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m512i bits = _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(mask, x + j)), exponent);
    bad |= _mm512_cmpeq_epi32_mask(bits, exponent);
  }
#endif
  return bad == 0;
}

#include "tileattn/arch/register_rows.hpp"

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return _mm512_cvtss_f32(detail::exp2(_mm512_set1_ps(x))); }

/// generic::mul_add for this target: fused, as its gemm's vfmadd (std::fma, not a * b + c,
/// which GCC contracts only from -O2 on).
inline float mul_add(float a, float b, float c) { return std::fma(a, b, c); }
/// generic::add_alibi_bias compiled for this target (FMA).
inline void add_alibi_bias(float* x, index_t n, float slope, index_t diagonal) {
  for (index_t j = 0; j < n; ++j) x[j] += slope * static_cast<float>(std::abs(diagonal - j));
}
