// tileattn/arch/avx512.hpp: AVX-512F micro-kernels: register-blocked tile gemm, vector 2^x,
// row max, scale, and a register transpose. Same contracts as arch/generic.hpp; compiles
// to nothing without AVX-512F.
//
// gemm. An 8 x 48 block of C lives in 24 zmm accumulators (8 rows x 3 vectors of 16
// floats); per step of K, 3 loads of B and 8 broadcasts of A feed 24 FMAs. Cores retire
// one (Zen 4) or two (Zen 5, Intel) zmm FMAs per cycle at 4 cycles of latency, so up to 8
// FMAs must be in flight: 24 independent accumulators cover that with room, and 11 loads
// per 24 FMAs stay under two load ports. C is swept in column panels of 3 vectors (2 + 2
// for the last 4, so no panel is left with a lone vector), the last vector of a panel
// through a mask (partial when N is not a multiple of 16); each panel in blocks of 8
// rows, then one block of the 1-7 rows left. When M is large enough to reuse it, each panel of B is first copied, 128
// rows of K at a time, into a contiguous 24 KiB buffer that stays in L1: B tiles have
// power-of-two leading dimensions (Bc = 512, d = 128), whose rows otherwise fall into a
// few L1 sets and evict each other.
//
// One body, compiled once per feature set: the file includes itself with TILEATTN_AVX512_SET
// naming the namespace and TILEATTN_AVX512_HAS_* the features. Built with AVX-512F flags it
// is arch::avx512 with the flags' features, as the compiler macros say; in a dispatched build
// (arch/isa.hpp) it is arch::avx512 (x86-64-v4 plus AVX-512 BF16) and arch::avx512_no_bf16
// (x86-64-v4), each under its target pragma.
#if !defined(TILEATTN_AVX512_SET)
#if !defined(TILEATTN_ARCH_AVX512_HPP)
#define TILEATTN_ARCH_AVX512_HPP

#include "tileattn/arch/isa.hpp"

#if defined(__AVX512F__) || TILEATTN_ARCH_DISPATCH
#define TILEATTN_ARCH_AVX512_COMPILED 1

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tileattn/arch/blocked_transpose.hpp"
#include "tileattn/arch/exp2.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"


#if defined(__AVX512F__)  // fixed: the features the flags enable
#define TILEATTN_AVX512_SET avx512
#if defined(__AVX512BF16__)
#define TILEATTN_AVX512_HAS_BF16 1
#else
#define TILEATTN_AVX512_HAS_BF16 0
#endif
#if defined(__AVX512DQ__)
#define TILEATTN_AVX512_HAS_DQ 1
#else
#define TILEATTN_AVX512_HAS_DQ 0
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define TILEATTN_AVX512_HAS_BW_VL 1
#else
#define TILEATTN_AVX512_HAS_BW_VL 0
#endif
#include "tileattn/arch/avx512.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
#else  // dispatched: both copies, under their targets
#define TILEATTN_AVX512_HAS_DQ 1
#define TILEATTN_AVX512_HAS_BW_VL 1
TILEATTN_TARGET_BEGIN(TILEATTN_AVX512_BF16_FEATURES)
#define TILEATTN_AVX512_SET avx512
#define TILEATTN_AVX512_HAS_BF16 1
#include "tileattn/arch/avx512.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
TILEATTN_TARGET_END
TILEATTN_TARGET_BEGIN(TILEATTN_AVX512_FEATURES)
#define TILEATTN_AVX512_SET avx512_no_bf16
#define TILEATTN_AVX512_HAS_BF16 0
#include "tileattn/arch/avx512.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
TILEATTN_TARGET_END
#endif
#undef TILEATTN_AVX512_HAS_DQ
#undef TILEATTN_AVX512_HAS_BW_VL

#endif  // __AVX512F__ || TILEATTN_ARCH_DISPATCH
#endif  // TILEATTN_ARCH_AVX512_HPP
#else  // the body, included by the part above

namespace tileattn::arch::TILEATTN_AVX512_SET {

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
inline __m512 scalef_ps(__m512 a, __m512 b) { return _mm512_maskz_scalef_ps(0xFFFF, a, b); }
template <int Imm>
__m512 roundscale_ps(__m512 a) { return _mm512_maskz_roundscale_ps(0xFFFF, a, Imm); }
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

inline constexpr const char* name = "avx512";
/// With AVX-512 BF16 (vdpbf16ps), bf16 tiles are multiplied as bf16 pairs into float
/// accumulators; without it they are converted to float when loaded. Where arch/amx.hpp is
/// compiled (x86-64 Linux), arch::native is arch::amx, whose pairs run on AMX tiles when the
/// process may use them; this constant is avx512's own choice, for builds without it
/// (TILEATTN_NO_AMX): targets with AMX keep float tiles, since on the 16-core Xeon we
/// measure on a vdpbf16ps loop runs at 79 GFLOP/s per core, under half its FMA loop, and
/// the bf16 forward on pairs at 0.55-0.66x the one on float tiles (docs/precision.md).
/// -DTILEATTN_BF16_DOT_PRODUCT=0 or 1 overrides the choice.
#if TILEATTN_AVX512_HAS_BF16 && defined(TILEATTN_BF16_DOT_PRODUCT)
inline constexpr bool bf16_dot_product = TILEATTN_BF16_DOT_PRODUCT != 0;
#elif TILEATTN_AVX512_HAS_BF16 && !defined(__AMX_BF16__)
inline constexpr bool bf16_dot_product = true;
#else
inline constexpr bool bf16_dot_product = false;
#endif

namespace detail {

inline constexpr index_t lanes = 16;        // floats per zmm register
inline constexpr int block_rows = 8;        // rows of C held in registers
inline constexpr int block_vectors = 3;     // zmm vectors of C per row held in registers

/// Lanes [0, count) set, count in [1, 16].
inline __mmask16 first_lanes(index_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

/// How the gemm loads, broadcasts and multiplies one element type of A and B: float (one
/// FMA per element) or, with AVX-512 BF16, bf16 pairs (vdpbf16ps: two products per 32-bit
/// lane, into the same float accumulators). The register blocking is shared.
template <class E>
struct Operand;

template <>
struct Operand<float> {
  using vec = __m512;
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static vec load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static void store_aligned(float* p, vec v) { _mm512_store_ps(p, v); }
  static __m512 madd(__m512 acc, vec a, vec b) { return _mm512_fmadd_ps(a, b, acc); }
};

#if TILEATTN_AVX512_HAS_BF16
template <>
struct Operand<bf16x2> {
  using vec = __m512i;
  static vec load(const bf16x2* p) { return _mm512_loadu_si512(p); }
  static vec load(const bf16x2* p, __mmask16 m) { return _mm512_maskz_loadu_epi32(m, p); }
  static vec broadcast(const bf16x2* p) { return _mm512_set1_epi32(std::bit_cast<std::int32_t>(*p)); }
  static void store_aligned(bf16x2* p, vec v) { _mm512_store_si512(p, v); }
  static __m512 madd(__m512 acc, vec a, vec b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);  // acc + a.hi b.hi + a.lo b.lo
  }
};
#endif

/// C (Rows x Vectors*16, the last vector limited to the lanes in `last`) (+)= A B over the
/// whole K. Everything unrolls at compile time into straight-line FMAs on registers.
/// The last vector's loads and stores always go through the mask (all ones for a full
/// panel): a masked zmm load costs what a plain one does, and one instantiation instead
/// of two per shape cuts the compile time of every TU that runs a forward pass by a third.
template <int Rows, int Vectors, bool Accumulate, bool TransA, class E>
inline void gemm_block(index_t k, const E* a, index_t lda, const E* b, index_t ldb,
                       float* c, index_t ldc, __mmask16 last) {
  using Op = Operand<E>;
  __m512 acc[static_cast<std::size_t>(Rows)][static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if constexpr (!Accumulate) {
        acc[r][v] = _mm512_setzero_ps();
      } else if (v == Vectors - 1) {
        acc[r][v] = _mm512_maskz_loadu_ps(last, c + r * ldc + v * lanes);
      } else {
        acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * lanes);
      }
    }
  }
  for (index_t p = 0; p < k; ++p) {
    const E* bp = b + p * ldb;
    typename Op::vec bv[static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      bv[v] = v == Vectors - 1 ? Op::load(bp + v * lanes, last) : Op::load(bp + v * lanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const typename Op::vec ar = Op::broadcast(TransA ? a + p * lda + r : a + r * lda + p);
#pragma GCC unroll 4
      for (int v = 0; v < Vectors; ++v) acc[r][v] = Op::madd(acc[r][v], ar, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if (v == Vectors - 1)
        _mm512_mask_storeu_ps(c + r * ldc + v * lanes, last, acc[r][v]);
      else
        _mm512_storeu_ps(c + r * ldc + v * lanes, acc[r][v]);
    }
  }
}

/// The last `rows_left` (< Rows) rows of a panel: one block instantiated for that count.
template <int Rows, int Vectors, bool Accumulate, bool TransA, class E>
inline void gemm_row_tail(index_t rows_left, index_t k, const E* a, index_t lda,
                          const E* b, index_t ldb, float* c, index_t ldc, __mmask16 last) {
  if constexpr (Rows > 0) {
    if (rows_left == Rows)
      gemm_block<Rows, Vectors, Accumulate, TransA>(k, a, lda, b, ldb, c, ldc, last);
    else
      gemm_row_tail<Rows - 1, Vectors, Accumulate, TransA>(rows_left, k, a, lda, b, ldb, c, ldc, last);
  }
}

/// One column panel of C (all M rows, Vectors*16 columns) in blocks of block_rows rows.
template <int Vectors, bool Accumulate, bool TransA, class E>
inline void gemm_panel(index_t m, index_t k, const E* a, index_t lda, const E* b,
                       index_t ldb, float* c, index_t ldc, __mmask16 last) {
  index_t i = 0;
  for (; i + block_rows <= m; i += block_rows)
    gemm_block<block_rows, Vectors, Accumulate, TransA>(k, a + (TransA ? i : i * lda), lda, b, ldb, c + i * ldc,
                                                        ldc, last);
  if (i < m)
    gemm_row_tail<block_rows - 1, Vectors, Accumulate, TransA>(m - i, k, a + (TransA ? i : i * lda), lda, b, ldb,
                                                       c + i * ldc, ldc, last);
}

inline constexpr index_t pack_depth = 128;               // rows of B per packed buffer
inline constexpr index_t pack_min_rows = 3 * block_rows;  // fewer rows of C: B is read in place

/// packed (depth x Vectors*16, contiguous) = B (depth x Vectors*16), masked lanes zeroed.
template <int Vectors, class E>
inline void pack_panel(index_t depth, const E* b, index_t ldb, E* packed, __mmask16 last) {
  using Op = Operand<E>;
  for (index_t p = 0; p < depth; ++p) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      const E* from = b + p * ldb + v * lanes;
      Op::store_aligned(packed + (p * Vectors + v) * lanes,
                        v == Vectors - 1 ? Op::load(from, last) : Op::load(from));
    }
  }
}

/// gemm_panel, with B copied into an L1-resident buffer pack_depth rows of K at a time
/// when there are enough rows of C to reuse each copy. The accumulators pass through C
/// between depth blocks exactly (fp32 stores and loads), so results do not depend on it.
template <int Vectors, bool Accumulate, bool TransA, class E>
inline void gemm_panel_packed(index_t m, index_t k, const E* a, index_t lda, const E* b,
                              index_t ldb, float* c, index_t ldc, __mmask16 last) {
  if (m < pack_min_rows || k == 0) {
    gemm_panel<Vectors, Accumulate, TransA>(m, k, a, lda, b, ldb, c, ldc, last);
    return;
  }
  constexpr index_t packed_ld = Vectors * lanes;
  alignas(64) E packed[static_cast<std::size_t>(pack_depth * packed_ld)];
  for (index_t p0 = 0; p0 < k; p0 += pack_depth) {
    const index_t depth = k - p0 < pack_depth ? k - p0 : pack_depth;
    pack_panel<Vectors>(depth, b + p0 * ldb, ldb, packed, last);
    if (p0 == 0)
      gemm_panel<Vectors, Accumulate, TransA>(m, depth, a, lda, packed, packed_ld, c, ldc, last);
    else
      gemm_panel<Vectors, true, TransA>(m, depth, a + (TransA ? p0 * lda : p0), lda, packed, packed_ld, c, ldc, last);
  }
}

template <bool Accumulate, bool TransA, class E>
inline void gemm_panel_of(int vectors, index_t m, index_t k, const E* a, index_t lda,
                          const E* b, index_t ldb, float* c, index_t ldc, __mmask16 last) {
  switch (vectors) {
    case 1: gemm_panel_packed<1, Accumulate, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
    case 2: gemm_panel_packed<2, Accumulate, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
    default: gemm_panel_packed<3, Accumulate, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
  }
}

/// 2^x on 16 lanes; see arch/exp2.hpp for the method and the accuracy. ForBf16: the
/// degree-4 polynomial, for values rounded to bf16 next (exp2_poly::bf16_target).
template <bool ForBf16 = false>
inline __m512 exp2(__m512 x) {
  namespace c = exp2_poly;
  x = intrinsics::max_ps(_mm512_set1_ps(c::lowest_input), x);  // max(lo, NaN) keeps the NaN
  x = intrinsics::min_ps(_mm512_set1_ps(c::highest_input), x);
  const __m512 n = intrinsics::roundscale_ps<_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC>(x);
  const __m512 f = _mm512_sub_ps(x, n);  // exact, in [-1/2, 1/2]
  __m512 p;
  if constexpr (ForBf16) {
    namespace b = exp2_poly::bf16_target;
    p = _mm512_set1_ps(b::c4);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(b::c3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(b::c2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(b::c1));
  } else {
    p = _mm512_set1_ps(c::c6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c1));
  }
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return intrinsics::scalef_ps(p, n);  // p * 2^n, rounded once (also into the subnormals)
}

/// Transposes the 16 x 16 block whose rows are r[0..16) in place: r[c] becomes column c.
/// Three rounds of lane shuffles: pairs of rows, 4 x 4 blocks within 128-bit lanes, lanes.
inline void transpose_16x16(__m512 r[16]) {
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

/// One block of transpose(): up to 16 x 16, masked unless Full.
template <bool Full>
inline void transpose_block(index_t rows, index_t cols, const float* src, index_t lds,
                            float* dst, index_t ldd) {
  const __mmask16 col_mask = Full ? __mmask16(0xFFFF) : first_lanes(cols);
  const __mmask16 row_mask = Full ? __mmask16(0xFFFF) : first_lanes(rows);
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (Full) r[i] = _mm512_loadu_ps(src + i * lds);
    else r[i] = i < rows ? _mm512_maskz_loadu_ps(col_mask, src + i * lds) : _mm512_setzero_ps();
  }
  transpose_16x16(r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (Full) _mm512_storeu_ps(dst + i * ldd, r[i]);
    else if (i < cols) _mm512_mask_storeu_ps(dst + i * ldd, row_mask, r[i]);
  }
}

}  // namespace detail

namespace detail {
/// Calls panel(vectors, j, last) for the column panels C is swept in: `vectors` zmm
/// vectors from column j on (3, or 2 + 2 for four, or what is left), the last one limited
/// to the lanes in `last`.
template <class Panel>
inline void for_each_column_panel(index_t n, Panel&& panel) {
  const index_t last_lanes = n % lanes == 0 ? lanes : n % lanes;
  index_t remaining = (n + lanes - 1) / lanes;  // vectors of C per row still to do
  for (index_t j = 0; remaining > 0;) {
    const int vectors = remaining == 4 ? 2 : remaining < block_vectors ? static_cast<int>(remaining)
                                                                        : block_vectors;
    remaining -= vectors;
    panel(vectors, j, first_lanes(remaining == 0 ? last_lanes : lanes));
    j += vectors * lanes;
  }
}
}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0. E is float, or bf16x2 where
/// bf16_dot_product (K then counts pairs; generic's gemm says how a pair product sums).
template <bool Accumulate, bool TransA = false, class E>
void gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b,
          index_t ldb, float* c, index_t ldc) {
  using namespace detail;
  if (m <= 0 || n <= 0) return;
  for_each_column_panel(n, [&](int vectors, index_t j, __mmask16 last) {
    gemm_panel_of<Accumulate, TransA>(vectors, m, k, a, lda, b + j, ldb, c + j, ldc, last);
  });
}

/// max(x[0..n)), -inf for n == 0. NaN entries are ignored, as in generic.
inline float row_max(const float* x, index_t n) {
  using detail::lanes;
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = lowest, m1 = lowest;
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    m0 = intrinsics::max_ps(_mm512_loadu_ps(x + j), m0);  // max(NaN, m) keeps m
    m1 = intrinsics::max_ps(_mm512_loadu_ps(x + j + lanes), m1);
  }
  for (; j < n; j += lanes) {
    const __mmask16 mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    m0 = intrinsics::max_ps(_mm512_mask_loadu_ps(lowest, mask, x + j), m0);
  }
  return intrinsics::reduce_max_ps(intrinsics::max_ps(m0, m1));
}

namespace detail {
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

/// One row of exp2_shift_sum_rows: x[j] = 2^(x[j] * scale - shift); returns the sum.
inline float exp2_shift_sum(float* x, index_t n, float scale, float shift) {
  float sum = 0.0f;
  exp2_shift_sum_rows(x, n, 1, n, &scale, &shift, &sum);
  return sum;
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

/// x[j] *= factor.
inline void scale(float* x, index_t n, float factor) {
  using detail::lanes;
  const __m512 f = _mm512_set1_ps(factor);
  index_t j = 0;
  for (; j + lanes <= n; j += lanes) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), f));
  if (j < n) {
    const __mmask16 mask = detail::first_lanes(n - j);
    _mm512_mask_storeu_ps(x + j, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + j), f));
  }
}

/// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: a rows x cols row-major
/// block written out as its cols x rows transpose (K rows into a K^T tile). In 16 x 16
/// blocks through registers; the partial blocks at the edges are masked.
inline void transpose(index_t rows, index_t cols, const float* src, index_t lds, float* dst,
                      index_t ldd) {
  tileattn::arch::detail::transpose_in_blocks<detail::lanes>(
      rows, cols, src, lds, dst, ldd, [](auto full, auto... block) {
        detail::transpose_block<decltype(full)::value>(block...);
      });
}

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return _mm512_cvtss_f32(detail::exp2(_mm512_set1_ps(x))); }

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

/// dst[j] = to_float(src[j]) for 8-bit src, 16 at a time, the tail through a mask.
template <class Byte>
inline void bytes_to_float(const Byte* src, float* dst, index_t n) {
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = first_lanes(n - j < lanes ? n - j : lanes);
    _mm512_mask_storeu_ps(dst + j, m, bytes_to_ps(src, _mm_maskz_loadu_epi8(m, src + j)));
  }
}
}  // namespace detail

/// dst[j] = float(src[j]), exact; 16 lanes at a time, the tail through a mask.
inline void to_float(const bf16* src, float* dst, index_t n) {
  using detail::lanes;
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    _mm512_mask_storeu_ps(dst + j, m, detail::bf16_to_ps(_mm256_maskz_loadu_epi16(m, src + j)));
  }
}

inline void to_float(const fp16* src, float* dst, index_t n) {
  using detail::lanes;
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    _mm512_mask_storeu_ps(dst + j, m, intrinsics::cvtph_ps(_mm256_maskz_loadu_epi16(m, src + j)));
  }
}

/// dst[j] = to_float(src[j]) for 8-bit storage (int8 unscaled; int8_nan gives NaN), exact.
inline void to_float(const fp8_e4m3* src, float* dst, index_t n) { detail::bytes_to_float(src, dst, n); }
inline void to_float(const fp8_e5m2* src, float* dst, index_t n) { detail::bytes_to_float(src, dst, n); }
inline void to_float(const std::int8_t* src, float* dst, index_t n) { detail::bytes_to_float(src, dst, n); }

/// dst[j] = src[j] rounded to nearest even (as bf16(float) and fp16(float) do).
inline void from_float(const float* src, bf16* dst, index_t n) {
  using detail::lanes;
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    _mm256_mask_storeu_epi16(dst + j, m, detail::ps_to_bf16(_mm512_maskz_loadu_ps(m, src + j)));
  }
}

inline void from_float(const float* src, fp16* dst, index_t n) {
  using detail::lanes;
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m256i h = intrinsics::cvtps_ph<_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC>(_mm512_maskz_loadu_ps(m, src + j));
    _mm256_mask_storeu_epi16(dst + j, m, h);
  }
}

/// dst[c] = (a[c], b[c]) for c < n: two rows of bf16 interleaved into pairs, the B operand
/// of a product that sums over rows (V in P V); b == nullptr pairs a with zeros.
inline void interleave_pairs(const bf16* a, const bf16* b, bf16x2* dst, index_t n) {
  using detail::lanes;
  for (index_t c = 0; c < n; c += lanes) {
    const __mmask16 m = detail::first_lanes(n - c < lanes ? n - c : lanes);
    const __m512i lo = intrinsics::cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + c));
    const __m512i hi = b ? intrinsics::cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + c)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, intrinsics::slli_epi32<16>(hi)));
  }
}

/// dst[c] = (bf16(a[c]), bf16(b[c])): two float rows rounded (to nearest even) and
/// interleaved into pairs (b == nullptr: zeros): the backward's P and dS as transposed A
/// operands of bf16 products.
inline void interleave_rounded(const float* a, const float* b, bf16x2* dst, index_t n) {
  using detail::lanes;
  for (index_t c = 0; c < n; c += lanes) {
    const __mmask16 m = detail::first_lanes(n - c < lanes ? n - c : lanes);
    const __m512i lo = intrinsics::cvtepu16_epi32(detail::ps_to_bf16(_mm512_maskz_loadu_ps(m, a + c)));
    const __m512i hi = b ? intrinsics::cvtepu16_epi32(detail::ps_to_bf16(_mm512_maskz_loadu_ps(m, b + c)))
                         : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, intrinsics::slli_epi32<16>(hi)));
  }
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
using generic::interleave_pairs;
using generic::interleave_rounded;
using generic::round_to_pairs;
using generic::to_float;
inline bool all_finite(const bf16x2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const bf16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp16* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e4m3* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const fp8_e5m2* x, index_t n) { return generic::all_finite(x, n); }
inline bool all_finite(const std::int8_t* x, index_t n) { return generic::all_finite(x, n); }

#endif  // __AVX512BW__ && __AVX512VL__

// ---- Products with K or V rows read in place (float, bf16, fp16 or 8-bit rows, converted in
// registers): the forward's decode path (kernels/forward.hpp; kernels/work_list.hpp, in_place_max_rows).

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

/// The 16 horizontal sums of a[0..16) as one vector (lane j: the sum of a[j]'s lanes), in
/// generic::dot_lanes_sum's order: lanes (l, l + 2) and (l + 1, l + 3) of each 128-bit
/// group, then those two, then groups (0 + 1) + (2 + 3).
inline __m512 sum_lanes_16(const __m512 (&a)[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(intrinsics::unpacklo_ps(a[2 * i], a[2 * i + 1]), intrinsics::unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d lo = intrinsics::unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    const __m512d hi = intrinsics::unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  constexpr int even = _MM_SHUFFLE(2, 0, 2, 0), odd = _MM_SHUFFLE(3, 1, 3, 1);
  const __m512 e0 = _mm512_add_ps(intrinsics::shuffle_f32x4<even>(c[0], c[1]), intrinsics::shuffle_f32x4<odd>(c[0], c[1]));
  const __m512 e1 = _mm512_add_ps(intrinsics::shuffle_f32x4<even>(c[2], c[3]), intrinsics::shuffle_f32x4<odd>(c[2], c[3]));
  return _mm512_add_ps(intrinsics::shuffle_f32x4<even>(e0, e1), intrinsics::shuffle_f32x4<odd>(e0, e1));
}

/// Rows of C x Keys keys (Rows * Keys <= 16: 1 x 8, 2 x 8 or 4 x 4): one accumulator of
/// 16 lanes per dot product (acc[r * Keys + j]; the rest zero), reduced together by
/// sum_lanes_16, whose order is the same for every slot. A key row is converted once per
/// block, so 4 x 4 (a group of 4 query heads) converts 8-bit and 16-bit keys half as often
/// as 2 x 8. Few keys at a time keep the rows a block reads within an L1 set's ways even
/// when they lie 4 KiB apart (a paged cache's rows of one head often do).
template <int Rows, int Keys, class E>
inline void gemm_nt_block(index_t k, const float* a, index_t lda, const E* const* rows, index_t nj,
                          float* c, index_t ldc) {
  static_assert(Rows * Keys <= 16);
  const index_t k_full = k / lanes * lanes;
  const __mmask16 k_tail = first_lanes(k - k_full);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (index_t p = 0; p < k_full; p += lanes) {
    __m512 av[static_cast<std::size_t>(Rows)];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) av[r] = _mm512_loadu_ps(a + r * lda + p);
#pragma GCC unroll 8
    for (int j = 0; j < Keys; ++j) {
      const __m512 bv = load_floats(rows[j] + p);
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) acc[r * Keys + j] = _mm512_fmadd_ps(av[r], bv, acc[r * Keys + j]);
    }
  }
  if (k_full < k) {
    __m512 av[static_cast<std::size_t>(Rows)];
    for (int r = 0; r < Rows; ++r) av[r] = _mm512_maskz_loadu_ps(k_tail, a + r * lda + k_full);
#pragma GCC unroll 8
    for (int j = 0; j < Keys; ++j) {
      const __m512 bv = load_floats(rows[j] + k_full, k_tail);
      for (int r = 0; r < Rows; ++r) acc[r * Keys + j] = _mm512_mask3_fmadd_ps(av[r], bv, acc[r * Keys + j], k_tail);
    }
  }
  const __m512 sums = sum_lanes_16(acc);
  const __mmask16 keys = first_lanes(nj);
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)  // row r's sums are lanes r * Keys ..: stored from c[r, -r * Keys]
    _mm512_mask_storeu_ps(c + r * ldc - r * Keys, static_cast<__mmask16>(keys << (r * Keys)), sums);
}

/// C (Rows x Vectors*16, the last vector limited to `last`) += A B with B's row p at
/// b_rows[p] + col0 (E converted to float as it is loaded): gemm_block's loop over rows
/// that lie anywhere, so the sums run in the same order.
template <int Rows, int Vectors, class E>
inline void gemm_rows_block(index_t k, const float* a, index_t lda, const E* const* b_rows, index_t col0,
                            float* c, index_t ldc, __mmask16 last) {
  __m512 acc[static_cast<std::size_t>(Rows)][static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      acc[r][v] = v == Vectors - 1 ? _mm512_maskz_loadu_ps(last, c + r * ldc + v * lanes)
                                   : _mm512_loadu_ps(c + r * ldc + v * lanes);
  for (index_t p = 0; p < k; ++p) {
    const E* bp = b_rows[p] + col0;
    __m512 bv[static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      bv[v] = v == Vectors - 1 ? load_floats(bp + v * lanes, last) : load_floats(bp + v * lanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < Vectors; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if (v == Vectors - 1) _mm512_mask_storeu_ps(c + r * ldc + v * lanes, last, acc[r][v]);
      else _mm512_storeu_ps(c + r * ldc + v * lanes, acc[r][v]);
    }
}

/// All M rows of one column panel, in blocks of 8, 4, 2 and 1 rows.
template <int Vectors, class E>
inline void gemm_rows_panel(index_t m, index_t k, const float* a, index_t lda, const E* const* b_rows, index_t col0,
                            float* c, index_t ldc, __mmask16 last) {
  index_t i = 0;
  for (; i + 8 <= m; i += 8) gemm_rows_block<8, Vectors>(k, a + i * lda, lda, b_rows, col0, c + i * ldc, ldc, last);
  if (i + 4 <= m) gemm_rows_block<4, Vectors>(k, a + i * lda, lda, b_rows, col0, c + i * ldc, ldc, last), i += 4;
  if (i + 2 <= m) gemm_rows_block<2, Vectors>(k, a + i * lda, lda, b_rows, col0, c + i * ldc, ldc, last), i += 2;
  if (i < m) gemm_rows_block<1, Vectors>(k, a + i * lda, lda, b_rows, col0, c + i * ldc, ldc, last);
}
}  // namespace detail

/// Reads every whole cache line of rows[0..n) (`bytes` each; a partial last line is only
/// prefetched, so no load passes a row's end), row by row with one load instruction per
/// line position, so each instruction steps from row to row by the rows' spacing and the
/// hardware's stride prefetchers run ahead of it: K/V rows read in place come into cache in
/// one streaming pass before the products use them.
inline void touch_rows(const void* const* rows, index_t n, index_t bytes) {
  const index_t lines = bytes / 64;
  __m512i seen = _mm512_setzero_si512();
  for (index_t r = 0; r < n; ++r) {
    const char* x = static_cast<const char*>(rows[r]);
    index_t l = 0;
    for (; l + 8 <= lines; l += 8) {
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u) seen = _mm512_or_si512(seen, _mm512_loadu_si512(x + 64 * (l + u)));
    }
    for (; l + 4 <= lines; l += 4) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) seen = _mm512_or_si512(seen, _mm512_loadu_si512(x + 64 * (l + u)));
    }
    for (; l < lines; ++l) seen = _mm512_or_si512(seen, _mm512_loadu_si512(x + 64 * l));
    if (bytes % 64) _mm_prefetch(x + 64 * lines, _MM_HINT_T0);
  }
  asm volatile("" : : "v"(seen));  // the loads are the point
}

/// C (M x N) = A (M x K) * B^T, B given by its N rows b_rows[j] (K elements each, float,
/// bf16, fp16 or 8-bit, anywhere in memory): Q K^T with the keys read in place. Blocks of
/// 4 rows of A x 4 keys, then 2 x 8 and 1 x 8; each dot product sums 16 lanes, then
/// reduces them in generic::dot_lanes_sum's order.
template <class E>
void gemm_nt_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows,
                  float* c, index_t ldc) {
  for (index_t j0 = 0; j0 < n; j0 += 8) {
    const index_t nj = n - j0 < 8 ? n - j0 : 8;
    const E* rows[8];
    for (index_t j = 0; j < 8; ++j) rows[j] = b_rows[j0 + (j < nj ? j : 0)];  // a real row stands in past n
    index_t i = 0;
    for (; i + 4 <= m; i += 4) {
      detail::gemm_nt_block<4, 4>(k, a + i * lda, lda, rows, nj < 4 ? nj : 4, c + i * ldc + j0, ldc);
      if (nj > 4) detail::gemm_nt_block<4, 4>(k, a + i * lda, lda, rows + 4, nj - 4, c + i * ldc + j0 + 4, ldc);
    }
    for (; i + 2 <= m; i += 2) detail::gemm_nt_block<2, 8>(k, a + i * lda, lda, rows, nj, c + i * ldc + j0, ldc);
    if (i < m) detail::gemm_nt_block<1, 8>(k, a + i * lda, lda, rows, nj, c + i * ldc + j0, ldc);
  }
}

/// C (M x N) += A (M x K) * B, B's row p at b_rows[p] (N elements, float, bf16, fp16 or 8-bit,
/// anywhere in memory): P V with the values read in place, in gemm's order of sums.
template <class E>
void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
               index_t ldc) {
  using namespace detail;
  if (m <= 0 || n <= 0) return;
  for_each_column_panel(n, [&](int vectors, index_t j, __mmask16 last) {
    if (vectors == 1) gemm_rows_panel<1>(m, k, a, lda, b_rows, j, c + j, ldc, last);
    else if (vectors == 2) gemm_rows_panel<2>(m, k, a, lda, b_rows, j, c + j, ldc, last);
    else gemm_rows_panel<3>(m, k, a, lda, b_rows, j, c + j, ldc, last);
  });
}

/// generic::mul_add for this target: fused, as its gemm's vfmadd (std::fma, not a * b + c,
/// which GCC contracts only from -O2 on).
inline float mul_add(float a, float b, float c) { return std::fma(a, b, c); }
/// generic::add_alibi_bias compiled for this target (FMA).
inline void add_alibi_bias(float* x, index_t n, float slope, index_t diagonal) {
  for (index_t j = 0; j < n; ++j) x[j] += slope * static_cast<float>(std::abs(diagonal - j));
}

#if !TILEATTN_AVX512_HAS_BF16
/// Without AVX-512 BF16 the kernels never multiply bf16 pairs; this keeps the interface whole.
template <bool Accumulate, bool TransA = false>
void gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16x2* b,
          index_t ldb, float* c, index_t ldc) {
  generic::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
}
#endif

#if TILEATTN_AVX512_HAS_BF16
// ---- B prepared once for many row slabs (arch/prepared_pairs.hpp) ----------------------------

/// B (k pairs x n columns) packed into buffer in the column panels gemm sweeps, each panel's
/// rows contiguous (masked lanes zeroed): what gemm packs per call, 128 rows at a time, when
/// C has 24 rows or more, made once for every slab.
inline PreparedPairs prepare_pairs(index_t k, index_t n, const bf16x2* b, index_t ldb, bf16x2* buffer) {
  using namespace detail;
  if (k <= 0 || n <= 0) return {b, ldb, 0};
  for_each_column_panel(n, [&](int vectors, index_t j, __mmask16 last) {
    switch (vectors) {
      case 1: pack_panel<1>(k, b + j, ldb, buffer + j * k, last); break;
      case 2: pack_panel<2>(k, b + j, ldb, buffer + j * k, last); break;
      default: pack_panel<3>(k, b + j, ldb, buffer + j * k, last); break;
    }
  });
  return {buffer, 0, 0, true, k, n};
}

/// gemm<Accumulate> with B prepared (k <= its depth, n <= its width): each panel's products
/// over all of K from the packed copy, the panels cut to the first n columns. The same sums
/// as gemm (each element's over K in order, whatever the panels; gemm's packed depth blocks
/// pass C through memory exactly).
template <bool Accumulate>
void gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const PreparedPairs& b, float* c,
                   index_t ldc) {
  using namespace detail;
  if (!b.panels) return gemm<Accumulate>(m, n, k, a, lda, b.data, b.ld, c, ldc);
  if (m <= 0 || n <= 0) return;
  for_each_column_panel(b.width, [&](int vectors, index_t j, __mmask16) {
    if (j >= n) return;
    const index_t cols = n - j < vectors * lanes ? n - j : vectors * lanes;
    const int used = static_cast<int>((cols + lanes - 1) / lanes);
    const __mmask16 last = first_lanes(cols - (used - 1) * lanes);
    const bf16x2* panel = b.data + j * b.depth;
    const index_t ldb = vectors * lanes;
    switch (used) {
      case 1: gemm_panel<1, Accumulate, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
      case 2: gemm_panel<2, Accumulate, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
      default: gemm_panel<3, Accumulate, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
    }
  });
}

inline index_t product_slab_rows() { return dot_product_slab_rows.load(std::memory_order_relaxed); }
/// Panels of 128 keys: on Zen 5 (2 threads, H 16, N 2048, d 128, one run) slabs of 64 rows
/// gave 362 GFLOP/s full and 330 causal with 128-key panels, 341 and 322 with 512, against
/// 350 and 307 without slabs.
inline index_t product_panel_keys() { return 128; }
inline void begin_products() {}
inline void end_products() {}
#else
/// B operands read in place (arch/prepared_pairs.hpp): one slab of all rows.
TILEATTN_PAIRS_READ_IN_PLACE
#endif

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

}  // namespace tileattn::arch::TILEATTN_AVX512_SET

#endif  // TILEATTN_AVX512_SET
