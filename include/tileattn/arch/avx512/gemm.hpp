// tileattn/arch/avx512/gemm.hpp: the tile gemm (arch/register_gemm.hpp over AVX-512's
// VecTraits) on float and, with AVX-512 BF16, bf16 pair operands; B prepared once for many
// row slabs (arch/prepared_pairs.hpp).
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes only arch/register_*.hpp, the parts every SIMD set shares.
//
// An 8 x 48 block of C lives in 24 zmm accumulators (8 rows x 3 vectors of 16 floats); per
// step of K, 3 loads of B and 8 broadcasts of A feed 24 FMAs. Cores retire one (Zen 4) or
// two (Zen 5, Intel) zmm FMAs per cycle at 4 cycles of latency, so up to 8 FMAs must be in
// flight: 24 independent accumulators cover that with room, and 11 loads per 24 FMAs stay
// under two load ports. C is swept in column panels of 3 vectors (2 + 2 for the last 4, so
// no panel is left with a lone vector), the last vector of a panel always through a mask
// (all ones for a full panel): a masked zmm load costs what a plain one does, and one
// instantiation instead of two per shape cuts the compile time of every TU that runs a
// forward pass by a third. Panels of B are packed into L1 from 24 rows of C on.

namespace detail {

/// The registers and blocking of the tile gemm (arch/register_gemm.hpp).
struct VecTraits {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr index_t lanes = detail::lanes;
  static constexpr bool masks_every_panel = true;
  static constexpr index_t pack_min_rows = 24;  // fewer rows of C: B is read in place
  static constexpr int block_rows(int) { return 8; }
  /// Panels of 3 registers, 2 + 2 for four, or what is left.
  static constexpr int panel_vectors(index_t remaining) {
    return remaining == 4 ? 2 : remaining < 3 ? static_cast<int>(remaining) : 3;
  }
  static mask first_lanes(index_t count) { return detail::first_lanes(count); }
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg load(const float* p, mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, mask m, reg v) { _mm512_mask_storeu_ps(p, m, v); }
  static reg load_or(const float* p, mask m, reg fill) { return _mm512_mask_loadu_ps(fill, m, p); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg max(reg a, reg b) { return intrinsics::max_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static float reduce_max(reg v) { return intrinsics::reduce_max_ps(v); }
  static reg min(reg a, reg b) { return intrinsics::min_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  /// 2^x's reduction (arch/register_exp2.hpp): f = x - floor(x), and x itself, whose floor
  /// vscalefps takes. With DQ one vreduceps, which gives 0 for +-inf and keeps NaN; without,
  /// x clamped first (exp2_poly::flush_below) so that f is never inf - inf.
  struct Split {
    reg f, e;
  };
  static Split split_floor(reg x) {
#if TILEATTN_AVX512_HAS_DQ
    return {intrinsics::reduce_ps<_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC>(x), x};
#else
    x = max(set1(exp2_poly::flush_below), x);  // max(lo, NaN) keeps the NaN
    x = min(set1(exp2_poly::highest_input), x);
    return {sub(x, intrinsics::roundscale_ps<_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC>(x)), x};
#endif
  }
  /// p * 2^floor(x) where x >= -126 (or NaN), else +0: no subnormal result is made (the
  /// masked lanes make none either: measured, no assist).
  static reg times_two_to_floor_normal(reg p, reg e, reg x) {
    const mask normal = _mm512_cmp_ps_mask(x, set1(exp2_poly::flush_below), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(normal, p, e);
  }
};

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

#include "tileattn/arch/register_gemm.hpp"

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0. E is float, or bf16x2 where
/// bf16_dot_product (K then counts pairs; generic's gemm says how a pair product sums).
template <bool Accumulate, bool TransA = false, class E>
void gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b,
          index_t ldb, float* c, index_t ldc) {
  detail::register_gemm<detail::VecTraits, Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);
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
  for_each_column_panel<VecTraits>(n, [&](int vectors, index_t j, __mmask16 last, bool) {
    switch (vectors) {
      case 1: pack_panel<VecTraits, 1, true>(k, b + j, ldb, buffer + j * k, last); break;
      case 2: pack_panel<VecTraits, 2, true>(k, b + j, ldb, buffer + j * k, last); break;
      default: pack_panel<VecTraits, 3, true>(k, b + j, ldb, buffer + j * k, last); break;
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
  for_each_column_panel<VecTraits>(b.width, [&](int vectors, index_t j, __mmask16, bool) {
    if (j >= n) return;
    const index_t cols = n - j < vectors * lanes ? n - j : vectors * lanes;
    const int used = static_cast<int>((cols + lanes - 1) / lanes);
    const __mmask16 last = first_lanes(cols - (used - 1) * lanes);
    const bf16x2* panel = b.data + j * b.depth;
    const index_t ldb = vectors * lanes;
    switch (used) {
      case 1: gemm_panel<VecTraits, 1, Accumulate, true, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
      case 2: gemm_panel<VecTraits, 2, Accumulate, true, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
      default: gemm_panel<VecTraits, 3, Accumulate, true, false>(m, k, a, lda, panel, ldb, c + j, ldc, last); break;
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
