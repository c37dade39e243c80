// tileattn/arch/avx512/pair_layout.hpp: operand layouts on AVX-512: the register transpose that
// writes K rows as a K^T tile, and bf16 pairs (rows interleaved or rounded into the pair
// layout the dot products read).
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes only arch/register_*.hpp, the parts every SIMD set shares.

namespace detail {
/// Transposes the 16 x 16 block whose rows are r[0..16) in place: r[c] becomes column c.
/// Three rounds of lane shuffles: pairs of rows, 4 x 4 blocks within 128-bit lanes, lanes.
inline void transpose_square(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved
    t[2 * i] = intrinsics::unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = intrinsics::unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {  // r[4g + j], 128-bit lane L: rows 4g..4g+3 of column 4L + j
    r[4 * g] = intrinsics::shuffle_ps<0x44>(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = intrinsics::shuffle_ps<0xEE>(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = intrinsics::shuffle_ps<0x44>(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = intrinsics::shuffle_ps<0xEE>(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // gather the four row groups' lanes of each column
    t[j] = intrinsics::shuffle_f32x4<0x88>(r[j], r[4 + j]);
    t[4 + j] = intrinsics::shuffle_f32x4<0xDD>(r[j], r[4 + j]);
    t[8 + j] = intrinsics::shuffle_f32x4<0x88>(r[8 + j], r[12 + j]);
    t[12 + j] = intrinsics::shuffle_f32x4<0xDD>(r[8 + j], r[12 + j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    r[j] = intrinsics::shuffle_f32x4<0x88>(t[j], t[8 + j]);
    r[8 + j] = intrinsics::shuffle_f32x4<0xDD>(t[j], t[8 + j]);
    r[4 + j] = intrinsics::shuffle_f32x4<0x88>(t[4 + j], t[12 + j]);
    r[12 + j] = intrinsics::shuffle_f32x4<0xDD>(t[4 + j], t[12 + j]);
  }
}

}  // namespace detail

#include "tileattn/arch/register_transpose.hpp"

#if TILEATTN_AVX512_HAS_BW_VL  // 16-bit lanes and masked ymm moves

namespace detail {
/// 16 values of a row from x on (lanes in m; the rest zero) as bf16 in the 16-bit lanes of a
/// ymm: bf16 as it is, float rounded to nearest even.
inline __m256i bf16_lanes(const bf16* x, __mmask16 m) { return _mm256_maskz_loadu_epi16(m, x); }
inline __m256i bf16_lanes(const float* x, __mmask16 m) { return ps_to_bf16(_mm512_maskz_loadu_ps(m, x)); }

/// dst[c] = (a[c], b[c]) as bf16 for c < n (b == nullptr: zeros), 16 pairs at a time.
template <class Row>
inline void interleave_rows(const Row* a, const Row* b, bf16x2* dst, index_t n) {
  for (index_t c = 0; c < n; c += lanes) {
    const __mmask16 m = first_lanes(n - c < lanes ? n - c : lanes);
    const __m512i lo = intrinsics::cvtepu16_epi32(bf16_lanes(a + c, m));
    const __m512i hi = b ? intrinsics::cvtepu16_epi32(bf16_lanes(b + c, m)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, intrinsics::slli_epi32<16>(hi)));
  }
}
}  // namespace detail

/// dst[c] = (a[c], b[c]) for c < n: two rows of bf16 interleaved into pairs, the B operand
/// of a product that sums over rows (V in P V); b == nullptr pairs a with zeros.
inline void interleave_pairs(const bf16* a, const bf16* b, bf16x2* dst, index_t n) {
  detail::interleave_rows(a, b, dst, n);
}

/// dst[c] = (bf16(a[c]), bf16(b[c])): two float rows rounded (to nearest even) and
/// interleaved into pairs (b == nullptr: zeros): the backward's P and dS as transposed A
/// operands of bf16 products.
inline void interleave_rounded(const float* a, const float* b, bf16x2* dst, index_t n) {
  detail::interleave_rows(a, b, dst, n);
}

/// dst (ceil(n / 2) pairs) = x[0..n) rounded to bf16, in order, an odd n padded with a zero:
/// the backward's dS as the A operand of dS K.
inline void round_to_pairs(const float* x, bf16x2* dst, index_t n) {
  using detail::lanes;
  auto* out = reinterpret_cast<bf16*>(dst);
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    _mm256_mask_storeu_epi16(out + j, m, detail::ps_to_bf16(_mm512_maskz_loadu_ps(m, x + j)));
  }
  if (n % 2) out[n] = bf16{};
}

/// True when no value of the n pairs is Inf or NaN (bf16 exponent bits all ones).
inline bool all_finite(const bf16x2* x, index_t n) {
  using detail::lanes;
  const __m512i exponent = _mm512_set1_epi16(0x7f80);
  __mmask32 bad = 0;
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m512i bits = _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + j), exponent);
    bad |= _mm512_cmpeq_epi16_mask(bits, exponent);
  }
  return bad == 0;
}

#else  // AVX-512F alone (Xeon Phi): the 16-bit moves are generic's

using generic::interleave_pairs;
using generic::interleave_rounded;
using generic::round_to_pairs;
inline bool all_finite(const bf16x2* x, index_t n) { return generic::all_finite(x, n); }

#endif  // TILEATTN_AVX512_HAS_BW_VL
