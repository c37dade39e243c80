// tileattn/arch/avx512/intrinsics.hpp: the AVX-512 intrinsics the kernels call in place of
// GCC 12's unmasked forms, and the lane masks every part of the set uses.
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes nothing.

/// The AVX-512 intrinsics whose unmasked forms, in GCC 12's headers, merge into an
/// _mm512_undefined_*() placeholder (`__m512 __Y = __Y;`), which GCC 12 reports as used
/// uninitialized once inlined into a kernel: some 900 false -Wuninitialized and
/// -Wmaybe-uninitialized lines a Release build (GCC bug 105593, fixed in GCC 13's headers). A
/// diagnostic pragma around the header does not help: GCC 12 does not keep pragmas in a
/// precompiled header, which the tests use. Their zero-masking forms with every lane
/// selected are the same instructions (GCC and clang emit the unmasked encodings: no mask
/// register, the same bits) and start from _mm512_setzero_*(). The kernels call these.
namespace intrinsics {
inline __m512 max_ps(__m512 a, __m512 b) { return _mm512_maskz_max_ps(0xFFFF, a, b); }
inline __m512 min_ps(__m512 a, __m512 b) { return _mm512_maskz_min_ps(0xFFFF, a, b); }
template <int Imm>
__m512 roundscale_ps(__m512 a) { return _mm512_maskz_roundscale_ps(0xFFFF, a, Imm); }
#if TILEATTN_AVX512_HAS_DQ
template <int Imm>
__m512 reduce_ps(__m512 a) { return _mm512_maskz_reduce_ps(0xFFFF, a, Imm); }
#endif
template <int Imm>
__m512 shuffle_f32x4(__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, Imm); }
template <int Imm>
__m512 shuffle_ps(__m512 a, __m512 b) { return _mm512_maskz_shuffle_ps(0xFFFF, a, b, Imm); }
inline __m512 unpacklo_ps(__m512 a, __m512 b) { return _mm512_maskz_unpacklo_ps(0xFFFF, a, b); }
inline __m512 unpackhi_ps(__m512 a, __m512 b) { return _mm512_maskz_unpackhi_ps(0xFFFF, a, b); }
inline __m512d unpacklo_pd(__m512d a, __m512d b) { return _mm512_maskz_unpacklo_pd(0xFF, a, b); }
inline __m512d unpackhi_pd(__m512d a, __m512d b) { return _mm512_maskz_unpackhi_pd(0xFF, a, b); }
template <int Imm>
__m256d extractf64x4_pd(__m512d a) { return _mm512_maskz_extractf64x4_pd(0xF, a, Imm); }
inline __m512i cvtepu16_epi32(__m256i a) { return _mm512_maskz_cvtepu16_epi32(0xFFFF, a); }
inline __m512i cvtepi8_epi32(__m128i a) { return _mm512_maskz_cvtepi8_epi32(0xFFFF, a); }
inline __m512 cvtepi32_ps(__m512i a) { return _mm512_maskz_cvtepi32_ps(0xFFFF, a); }
inline __m256i cvtepi32_epi16(__m512i a) { return _mm512_maskz_cvtepi32_epi16(0xFFFF, a); }
inline __m512 cvtph_ps(__m256i a) { return _mm512_maskz_cvtph_ps(0xFFFF, a); }
inline __m512i cvtepu8_epi32(__m128i a) { return _mm512_maskz_cvtepu8_epi32(0xFFFF, a); }
inline __m512 permutexvar_ps(__m512i index, __m512 a) { return _mm512_maskz_permutexvar_ps(0xFFFF, index, a); }
template <int Imm>
__m256i cvtps_ph(__m512 a) { return _mm512_maskz_cvtps_ph(0xFFFF, a, Imm); }
template <unsigned Imm>
__m512i slli_epi32(__m512i a) { return _mm512_maskz_slli_epi32(0xFFFF, a, Imm); }
template <unsigned Imm>
__m512i srli_epi32(__m512i a) { return _mm512_maskz_srli_epi32(0xFFFF, a, Imm); }
/// _mm512_reduce_add_ps and _mm512_reduce_max_ps, step for step as GCC 12's headers do them
/// (halves, then quarters, then pairs: the same order, so the same bits), on the masked
/// extracts above.
inline float reduce_add_ps(__m512 x) {
  const __m256 a = _mm256_add_ps(_mm256_castpd_ps(extractf64x4_pd<1>(_mm512_castps_pd(x))),
                                 _mm256_castpd_ps(extractf64x4_pd<0>(_mm512_castps_pd(x))));
  const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_extractf128_ps(a, 0));
  const __m128 c = _mm_add_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(c) + _mm_cvtss_f32(_mm_shuffle_ps(c, c, _MM_SHUFFLE(1, 1, 1, 1)));
}
inline float reduce_max_ps(__m512 x) {
  const __m256 a = _mm256_max_ps(_mm256_castpd_ps(extractf64x4_pd<1>(_mm512_castps_pd(x))),
                                 _mm256_castpd_ps(extractf64x4_pd<0>(_mm512_castps_pd(x))));
  const __m128 b = _mm_max_ps(_mm256_extractf128_ps(a, 1), _mm256_extractf128_ps(a, 0));
  const __m128 c = _mm_max_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ps(c, _mm_shuffle_ps(c, c, _MM_SHUFFLE(0, 1, 0, 1))));
}
}  // namespace intrinsics

namespace detail {
inline constexpr index_t lanes = 16;  // floats per zmm register

/// Lanes [0, count) set, count in [1, 16].
inline __mmask16 first_lanes(index_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}
}  // namespace detail
