// tileattn/arch/avx512/conversions.hpp: element conversions on AVX-512: bf16, fp16 and 8-bit
// storage to float and back, their finite checks, and 4-bit blocks to floats.
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes nothing.

#if TILEATTN_AVX512_HAS_BW_VL  // 16-bit lanes and masked ymm moves

namespace detail {
/// 16 bf16 (as 16-bit lanes of a ymm) -> 16 floats: each shifted into a float's upper half.
inline __m512 bf16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(intrinsics::slli_epi32<16>(intrinsics::cvtepu16_epi32(h)));
}
/// 16 floats -> 16 bf16 rounded to nearest even on the bits (exact for subnormals, NaN quiet).
inline __m256i ps_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(intrinsics::srli_epi32<16>(bits), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
  return intrinsics::cvtepi32_epi16(intrinsics::srli_epi32<16>(rounded));
}

// 16 bytes of 8-bit storage -> 16 floats, each exactly tileattn::to_float of its byte (NaN
// codes give a NaN; e5m2's keep their payload, quieted, as fp16's do).

/// e5m2 is the top byte of an fp16.
inline __m512 e5m2_to_ps(__m128i b) { return intrinsics::cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8)); }
/// e4m3fn S.EEEE.MMM placed as the fp16 S.0EEEE.MMM0000000 is its value times 2^-8 (fp16's
/// exponent bias is 15, e4m3's 7), subnormals included, so one exact multiply by 2^8 follows;
/// the NaN code S.1111.111 becomes a quiet NaN of its sign (as the scalar gives).
inline __m512 e4m3_to_ps(__m128i b) {
  const __m256i w = _mm256_cvtepu8_epi16(b);
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
  const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
  const __m512 x = _mm512_mul_ps(intrinsics::cvtph_ps(_mm256_or_si256(sign, magnitude)), _mm512_set1_ps(256.0f));
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
  constexpr int a_and_b_or_c = 0xEA;  // vpternlogd truth table of (a & b) | c
  return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(_mm512_castps_si512(x), nan,
                                                            _mm512_set1_epi32(static_cast<int>(0x80000000u)),
                                                            _mm512_set1_epi32(0x7fc00000), a_and_b_or_c));
}
/// int8 sign-extended and converted; int8_nan (-128) becomes a quiet NaN.
inline __m512 int8_to_ps(__m128i b) {
  const __m512 x = intrinsics::cvtepi32_ps(intrinsics::cvtepi8_epi32(b));
  const __mmask16 nan = _mm_cmpeq_epi8_mask(b, _mm_set1_epi8(int8_nan));
  return _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}
inline __m512 bytes_to_ps(const fp8_e4m3*, __m128i b) { return e4m3_to_ps(b); }
inline __m512 bytes_to_ps(const fp8_e5m2*, __m128i b) { return e5m2_to_ps(b); }
inline __m512 bytes_to_ps(const std::int8_t*, __m128i b) { return int8_to_ps(b); }

}  // namespace detail

#endif  // TILEATTN_AVX512_HAS_BW_VL

// ---- 16 values of a storage type <-> 16 floats in a register, and rows converted through them.

namespace detail {
inline __m512 load_floats(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_floats(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
#if TILEATTN_AVX512_HAS_BW_VL
inline __m512 load_floats(const bf16* p) { return bf16_to_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_floats(const bf16* p, __mmask16 m) { return bf16_to_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline __m512 load_floats(const fp16* p) { return intrinsics::cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_floats(const fp16* p, __mmask16 m) { return intrinsics::cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
/// 16 8-bit values (int8 unscaled: the kernels apply the scale) -> 16 floats.
template <quantized_type Byte>
inline __m512 load_floats(const Byte* p) {
  return bytes_to_ps(p, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <quantized_type Byte>
inline __m512 load_floats(const Byte* p, __mmask16 m) { return bytes_to_ps(p, _mm_maskz_loadu_epi8(m, p)); }
#else
template <class Half>
inline __m512 load_floats(const Half* p, __mmask16 m = 0xFFFF) {
  alignas(64) float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (m >> i) & 1 ? tileattn::to_float(p[i]) : 0.0f;
  return _mm512_load_ps(x);
}
#endif

#if TILEATTN_AVX512_HAS_BW_VL
inline void store_floats(float* p, __mmask16 m, __m512 x) { _mm512_mask_storeu_ps(p, m, x); }
inline void store_floats(bf16* p, __mmask16 m, __m512 x) { _mm256_mask_storeu_epi16(p, m, ps_to_bf16(x)); }
inline void store_floats(fp16* p, __mmask16 m, __m512 x) {
  _mm256_mask_storeu_epi16(p, m, intrinsics::cvtps_ph<_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC>(x));
}

/// dst[j] = src[j] through a float (exact, or rounded to nearest even into a 16-bit type), 16
/// lanes at a time, the tail through a mask.
template <class From, class To>
inline void convert(const From* src, To* dst, index_t n) {
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = first_lanes(n - j < lanes ? n - j : lanes);
    store_floats(dst + j, m, load_floats(src + j, m));
  }
}
#endif
}  // namespace detail

#if TILEATTN_AVX512_HAS_BW_VL

/// dst[j] = float(src[j]), exact (int8 unscaled; int8_nan gives NaN); 16 lanes at a time.
inline void to_float(const bf16* src, float* dst, index_t n) { detail::convert(src, dst, n); }
inline void to_float(const fp16* src, float* dst, index_t n) { detail::convert(src, dst, n); }
inline void to_float(const fp8_e4m3* src, float* dst, index_t n) { detail::convert(src, dst, n); }
inline void to_float(const fp8_e5m2* src, float* dst, index_t n) { detail::convert(src, dst, n); }
inline void to_float(const std::int8_t* src, float* dst, index_t n) { detail::convert(src, dst, n); }

/// dst[j] = src[j] rounded to nearest even (as bf16(float) and fp16(float) do).
inline void from_float(const float* src, bf16* dst, index_t n) { detail::convert(src, dst, n); }
inline void from_float(const float* src, fp16* dst, index_t n) { detail::convert(src, dst, n); }

namespace detail {
/// True when no 16-bit value x[j] has an all-ones exponent (Inf or NaN).
template <class Half>
inline bool no_all_ones_exponent(const Half* x, index_t n, short exponent_bits) {
  const __m512i exponent = _mm512_set1_epi16(exponent_bits);
  __mmask32 bad = 0;
  for (index_t j = 0; j < n; j += 32) {
    const __mmask32 m = n - j >= 32 ? ~__mmask32{0} : (__mmask32{1} << (n - j)) - 1;
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_maskz_loadu_epi16(m, x + j), exponent), exponent);
  }
  return bad == 0;
}
}  // namespace detail

/// True when no x[j] (bf16 or fp16 rows read in place) is Inf or NaN.
inline bool all_finite(const bf16* x, index_t n) { return detail::no_all_ones_exponent(x, n, 0x7f80); }
inline bool all_finite(const fp16* x, index_t n) { return detail::no_all_ones_exponent(x, n, 0x7c00); }

namespace detail {
/// True when no byte b of x[0..n) has (b & mask) == code; 64 bytes at a time.
inline bool no_byte_code(const void* x, index_t n, char mask, char code) {
  const auto* bytes = static_cast<const char*>(x);
  const __m512i masks = _mm512_set1_epi8(mask), codes = _mm512_set1_epi8(code);
  __mmask64 bad = 0;
  for (index_t j = 0; j < n; j += 64) {
    const __mmask64 m = n - j >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - j)) - 1;
    bad |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_and_si512(_mm512_maskz_loadu_epi8(m, bytes + j), masks), codes);
  }
  return bad == 0;
}
}  // namespace detail

/// True when no x[j] (8-bit rows read in place) is Inf or NaN: e4m3's NaN is S.1111.111 (it
/// has no Inf), e5m2's exponent all ones is Inf or NaN, int8's NaN is int8_nan (-128).
inline bool all_finite(const fp8_e4m3* x, index_t n) { return detail::no_byte_code(x, n, 0x7f, 0x7f); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return detail::no_byte_code(x, n, 0x7c, 0x7c); }
inline bool all_finite(const std::int8_t* x, index_t n) {
  return detail::no_byte_code(x, n, static_cast<char>(0xff), int8_nan);
}

#else  // AVX-512F alone (Xeon Phi): the 16-bit moves are generic's

using generic::from_float;
using generic::to_float;
inline bool all_finite(const bf16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e4m3* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const std::int8_t* x, index_t n) { return generic::all_finite(x, n); }

#endif  // TILEATTN_AVX512_HAS_BW_VL

// ---- 4-bit blocks (core/block_quantized_types.hpp) -> floats. A block's 16 possible values
// (nibble value times its scale, exact) fill one register: vpermps then looks up 16 nibbles
// at a time, so a block of 32 costs a broadcast, a multiply, a byte widening, two masks or
// shifts and two lookups, whatever its format. The same products as generic's table, so
// the same bits.

namespace detail {
/// 16 bytes -> their low and high nibbles as 16 dword indices each.
inline void nibble_indices(__m128i bytes, __m512i& low, __m512i& high) {
  const __m512i w = intrinsics::cvtepu8_epi32(bytes);
  low = _mm512_and_si512(w, _mm512_set1_epi32(0xf));
  high = intrinsics::srli_epi32<4>(w);
}
/// FP4 packs value 2i in byte i's low nibble: lows and highs interleaved, first 8 pairs.
inline __m512i interleave_low_half(__m512i low, __m512i high) {
  return _mm512_permutex2var_epi32(low, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), high);
}
inline __m512i interleave_high_half(__m512i low, __m512i high) {
  return _mm512_permutex2var_epi32(low, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                                   high);
}
/// A block's packed bytes: 16 (32 values) or 8 (16 values) in the low lanes.
template <class B>
inline __m128i block_bytes(const B& b) {
  if constexpr (B::values == 32) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  else return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs));
}
}  // namespace detail

/// 4-bit blocks of format B (q4_0, MXFP4, NVFP4) -> floats, B::values a block.
template <block_quantized_type B>
inline void dequantize_blocks(const B* src, float* dst, index_t blocks) {
  static_assert(B::values == 32 || B::values == 16);
  for (index_t c = 0; c < blocks; ++c, dst += B::values) {
    const __m512 table = _mm512_mul_ps(_mm512_loadu_ps(nibble_values<B>.data()), _mm512_set1_ps(block_scale(src[c])));
    __m512i low, high;
    detail::nibble_indices(detail::block_bytes(src[c]), low, high);
    if constexpr (halves_in_nibbles<B>) {  // values 0..15 are the low nibbles, 16..31 the high ones
      _mm512_storeu_ps(dst, intrinsics::permutexvar_ps(low, table));
      _mm512_storeu_ps(dst + 16, intrinsics::permutexvar_ps(high, table));
    } else {
      _mm512_storeu_ps(dst, intrinsics::permutexvar_ps(detail::interleave_low_half(low, high), table));
      if constexpr (B::values == 32)
        _mm512_storeu_ps(dst + 16, intrinsics::permutexvar_ps(detail::interleave_high_half(low, high), table));
    }
  }
}

