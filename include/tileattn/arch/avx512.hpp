// tileattn/arch/avx512.hpp: AVX-512F micro-kernels: register-blocked tile gemm, vector 2^x,
// row max, scale. Same contracts as arch/generic.hpp; compiles to nothing without AVX-512F.
//
// The gemm keeps an 8 x 48 block of C in 24 zmm accumulators (8 rows x 3 vectors of 16
// floats) and streams A and B through it: per step of K, 3 loads of B and 8 broadcasts
// of A feed 24 FMAs. Zen 4 and Intel cores retire about one (Zen 4) or two (Intel) zmm
// FMAs per cycle at 4 cycles of latency, so 24 independent accumulators hide the latency
// on both, and 11 loads per 24 FMAs stay under the two load ports. Columns beyond the
// last whole 48 run through the same kernel with 1-3 vectors and a masked last vector;
// rows beyond the last whole 8 through a kernel instantiated for 1-7 rows.
#pragma once

#if defined(__AVX512F__)

#include <immintrin.h>

#include <limits>

#include "tileattn/arch/exp2.hpp"
#include "tileattn/core/types.hpp"

// GCC 12 reports -Wmaybe-uninitialized inside several unmasked AVX-512 intrinsics (they
// merge into _mm512_undefined_ps(); GCC bug 105593, fixed in GCC 13). The warning is false.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tileattn::arch::avx512 {

inline constexpr const char* name = "avx512";

namespace detail {

inline constexpr index_t lanes = 16;        // floats per zmm register
inline constexpr int block_rows = 8;        // rows of C held in registers
inline constexpr int block_vectors = 3;     // zmm vectors of C per row held in registers
inline constexpr index_t block_cols = block_vectors * lanes;

/// Lanes [0, count) set, count in [1, 16].
inline __mmask16 first_lanes(index_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

/// C (Rows x Vectors*16, the last vector limited to `last` lanes when Masked) (+)= A B over
/// the whole K. Everything unrolls at compile time into straight-line FMAs on registers.
template <int Rows, int Vectors, bool Accumulate, bool Masked>
inline void gemm_block(index_t k, const float* a, index_t lda, const float* b, index_t ldb,
                       float* c, index_t ldc, __mmask16 last) {
  __m512 acc[Rows][Vectors];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if constexpr (!Accumulate) {
        acc[r][v] = _mm512_setzero_ps();
      } else if (Masked && v == Vectors - 1) {
        acc[r][v] = _mm512_maskz_loadu_ps(last, c + r * ldc + v * lanes);
      } else {
        acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * lanes);
      }
    }
  }
  for (index_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m512 bv[Vectors];
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      bv[v] = (Masked && v == Vectors - 1) ? _mm512_maskz_loadu_ps(last, bp + v * lanes)
                                           : _mm512_loadu_ps(bp + v * lanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < Vectors; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if (Masked && v == Vectors - 1)
        _mm512_mask_storeu_ps(c + r * ldc + v * lanes, last, acc[r][v]);
      else
        _mm512_storeu_ps(c + r * ldc + v * lanes, acc[r][v]);
    }
  }
}

/// One column panel of C (all M rows, Vectors*16 columns) in blocks of block_rows rows.
template <int Vectors, bool Accumulate, bool Masked>
inline void gemm_panel(index_t m, index_t k, const float* a, index_t lda, const float* b,
                       index_t ldb, float* c, index_t ldc, __mmask16 last) {
  index_t i = 0;
  for (; i + block_rows <= m; i += block_rows)
    gemm_block<block_rows, Vectors, Accumulate, Masked>(k, a + i * lda, lda, b, ldb,
                                                        c + i * ldc, ldc, last);
  a += i * lda;
  c += i * ldc;
  switch (m - i) {
    case 7: gemm_block<7, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 6: gemm_block<6, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 5: gemm_block<5, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 4: gemm_block<4, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 3: gemm_block<3, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 2: gemm_block<2, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 1: gemm_block<1, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    default: break;
  }
}

/// 2^x on 16 lanes; see arch/exp2.hpp for the method and the accuracy.
inline __m512 exp2(__m512 x) {
  namespace c = exp2_poly;
  x = _mm512_max_ps(_mm512_set1_ps(c::lowest_input), x);  // max(lo, NaN) keeps the NaN
  x = _mm512_min_ps(_mm512_set1_ps(c::highest_input), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);  // exact, in [-1/2, 1/2]
  __m512 p = _mm512_set1_ps(c::c6);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c5));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::c1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // p * 2^n, rounded once (also into the subnormals)
}

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0.
template <bool Accumulate>
void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b,
          index_t ldb, float* c, index_t ldc) {
  using namespace detail;
  if (m <= 0 || n <= 0) return;
  constexpr __mmask16 all = 0xFFFF;
  index_t j = 0;
  for (; j + block_cols <= n; j += block_cols)
    gemm_panel<block_vectors, Accumulate, false>(m, k, a, lda, b + j, ldb, c + j, ldc, all);
  const index_t rest = n - j;
  if (rest == 0) return;
  const index_t vectors = (rest + lanes - 1) / lanes;
  const __mmask16 last = first_lanes(rest - (vectors - 1) * lanes);
  switch (vectors) {
    case 1: gemm_panel<1, Accumulate, true>(m, k, a, lda, b + j, ldb, c + j, ldc, last); break;
    case 2: gemm_panel<2, Accumulate, true>(m, k, a, lda, b + j, ldb, c + j, ldc, last); break;
    default: gemm_panel<3, Accumulate, true>(m, k, a, lda, b + j, ldb, c + j, ldc, last); break;
  }
}

/// max(x[0..n)), -inf for n == 0. NaN entries are ignored, as in generic.
inline float row_max(const float* x, index_t n) {
  using detail::lanes;
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = lowest, m1 = lowest;
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + j), m0);  // max(NaN, m) keeps m
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + j + lanes), m1);
  }
  for (; j < n; j += lanes) {
    const __mmask16 mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    m0 = _mm512_max_ps(_mm512_mask_loadu_ps(lowest, mask, x + j), m0);
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

/// x[j] = 2^(x[j] - shift) in place; returns the sum of the new values. x[j] = -inf gives 0.
inline float exp2_shift_sum(float* x, index_t n, float shift) {
  using detail::lanes;
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    const __m512 e0 = detail::exp2(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    const __m512 e1 = detail::exp2(_mm512_sub_ps(_mm512_loadu_ps(x + j + lanes), s));
    _mm512_storeu_ps(x + j, e0);
    _mm512_storeu_ps(x + j + lanes, e1);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  for (; j < n; j += lanes) {
    const __mmask16 mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m512 e = detail::exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + j), s));
    _mm512_mask_storeu_ps(x + j, mask, e);
    sum0 = _mm512_mask_add_ps(sum0, mask, sum0, e);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
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

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return _mm512_cvtss_f32(detail::exp2(_mm512_set1_ps(x))); }

}  // namespace tileattn::arch::avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // __AVX512F__
