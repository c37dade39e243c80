// tileattn/arch/avx2.hpp: AVX2 + FMA micro-kernels: register-blocked tile gemm, vector 2^x,
// row max, scale. Same contracts as arch/generic.hpp; compiles to nothing without AVX2+FMA.
//
// The gemm keeps a 6 x 16 block of C in 12 ymm accumulators (6 rows x 2 vectors of 8
// floats): with 2 loads of B and 6 broadcasts of A per step of K that is 15 of the 16 ymm
// registers. Two FMA pipes at 4-5 cycles of latency need 8-10 independent accumulators,
// so 12 keep both busy. Columns beyond the last whole 16 go through a 1- or 2-vector
// kernel whose last vector uses vmaskmovps; rows beyond the last whole 6 through a kernel
// instantiated for 1-5 rows.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "tileattn/arch/exp2.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::arch::avx2 {

inline constexpr const char* name = "avx2";

namespace detail {

inline constexpr index_t lanes = 8;      // floats per ymm register
inline constexpr int block_rows = 6;     // rows of C held in registers
inline constexpr int block_vectors = 2;  // ymm vectors of C per row held in registers
inline constexpr index_t block_cols = block_vectors * lanes;

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

/// C (Rows x Vectors*8, the last vector limited by `last` when Masked) (+)= A B over the
/// whole K, unrolled at compile time into FMAs on registers.
template <int Rows, int Vectors, bool Accumulate, bool Masked>
inline void gemm_block(index_t k, const float* a, index_t lda, const float* b, index_t ldb,
                       float* c, index_t ldc, __m256i last) {
  __m256 acc[Rows][Vectors];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if constexpr (!Accumulate) {
        acc[r][v] = _mm256_setzero_ps();
      } else if (Masked && v == Vectors - 1) {
        acc[r][v] = _mm256_maskload_ps(c + r * ldc + v * lanes, last);
      } else {
        acc[r][v] = _mm256_loadu_ps(c + r * ldc + v * lanes);
      }
    }
  }
  for (index_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    __m256 bv[Vectors];
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      bv[v] = (Masked && v == Vectors - 1) ? _mm256_maskload_ps(bp + v * lanes, last)
                                           : _mm256_loadu_ps(bp + v * lanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 4
      for (int v = 0; v < Vectors; ++v) acc[r][v] = _mm256_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if (Masked && v == Vectors - 1)
        _mm256_maskstore_ps(c + r * ldc + v * lanes, last, acc[r][v]);
      else
        _mm256_storeu_ps(c + r * ldc + v * lanes, acc[r][v]);
    }
  }
}

/// One column panel of C (all M rows, Vectors*8 columns) in blocks of block_rows rows.
template <int Vectors, bool Accumulate, bool Masked>
inline void gemm_panel(index_t m, index_t k, const float* a, index_t lda, const float* b,
                       index_t ldb, float* c, index_t ldc, __m256i last) {
  index_t i = 0;
  for (; i + block_rows <= m; i += block_rows)
    gemm_block<block_rows, Vectors, Accumulate, Masked>(k, a + i * lda, lda, b, ldb,
                                                        c + i * ldc, ldc, last);
  a += i * lda;
  c += i * ldc;
  switch (m - i) {
    case 5: gemm_block<5, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 4: gemm_block<4, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 3: gemm_block<3, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 2: gemm_block<2, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    case 1: gemm_block<1, Vectors, Accumulate, Masked>(k, a, lda, b, ldb, c, ldc, last); break;
    default: break;
  }
}

/// 2^x on 8 lanes; see arch/exp2.hpp for the method and the accuracy. 2^n is applied as
/// two normal powers of two 2^n1 * 2^n2 (n1 = floor(n/2)), so subnormal results are
/// rounded once, by the second multiply.
inline __m256 exp2(__m256 x) {
  namespace c = exp2_poly;
  x = _mm256_max_ps(_mm256_set1_ps(c::lowest_input), x);  // max(lo, NaN) keeps the NaN
  x = _mm256_min_ps(_mm256_set1_ps(c::highest_input), x);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);  // exact, in [-1/2, 1/2]
  __m256 p = _mm256_set1_ps(c::c6);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c::c5));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c::c4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c::c3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c::c2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c::c1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is an integer in [-151, 128]
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);  // NaN lanes: p is NaN, so NaN out
}

}  // namespace detail

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements). Any M, N, K >= 0.
template <bool Accumulate>
void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda, const float* b,
          index_t ldb, float* c, index_t ldc) {
  using namespace detail;
  if (m <= 0 || n <= 0) return;
  const __m256i all = first_lanes(lanes);
  index_t j = 0;
  for (; j + block_cols <= n; j += block_cols)
    gemm_panel<block_vectors, Accumulate, false>(m, k, a, lda, b + j, ldb, c + j, ldc, all);
  const index_t rest = n - j;
  if (rest == 0) return;
  if (rest > lanes) {
    gemm_panel<2, Accumulate, true>(m, k, a, lda, b + j, ldb, c + j, ldc,
                                    first_lanes(rest - lanes));
  } else {
    gemm_panel<1, Accumulate, true>(m, k, a, lda, b + j, ldb, c + j, ldc, first_lanes(rest));
  }
}

/// max(x[0..n)), -inf for n == 0. NaN entries are ignored, as in generic.
inline float row_max(const float* x, index_t n) {
  using detail::lanes;
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m0 = lowest, m1 = lowest;
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + j), m0);  // max(NaN, m) keeps m
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + j + lanes), m1);
  }
  for (; j < n; j += lanes) {
    const __m256i mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m256 v = _mm256_blendv_ps(lowest, _mm256_maskload_ps(x + j, mask),
                                      _mm256_castsi256_ps(mask));
    m0 = _mm256_max_ps(v, m0);
  }
  return detail::reduce_max(_mm256_max_ps(m0, m1));
}

/// x[j] = 2^(x[j] - shift) in place; returns the sum of the new values. x[j] = -inf gives 0.
inline float exp2_shift_sum(float* x, index_t n, float shift) {
  using detail::lanes;
  const __m256 s = _mm256_set1_ps(shift);
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    const __m256 e0 = detail::exp2(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    const __m256 e1 = detail::exp2(_mm256_sub_ps(_mm256_loadu_ps(x + j + lanes), s));
    _mm256_storeu_ps(x + j, e0);
    _mm256_storeu_ps(x + j + lanes, e1);
    sum0 = _mm256_add_ps(sum0, e0);
    sum1 = _mm256_add_ps(sum1, e1);
  }
  for (; j < n; j += lanes) {
    const __m256i mask = detail::first_lanes(n - j < lanes ? n - j : lanes);
    const __m256 e = detail::exp2(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), s));
    _mm256_maskstore_ps(x + j, mask, e);
    sum0 = _mm256_add_ps(sum0, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
  }
  return detail::reduce_add(_mm256_add_ps(sum0, sum1));
}

/// x[j] *= factor.
inline void scale(float* x, index_t n, float factor) {
  using detail::lanes;
  const __m256 f = _mm256_set1_ps(factor);
  index_t j = 0;
  for (; j + lanes <= n; j += lanes) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), f));
  if (j < n) {
    const __m256i mask = detail::first_lanes(n - j);
    _mm256_maskstore_ps(x + j, mask, _mm256_mul_ps(_mm256_maskload_ps(x + j, mask), f));
  }
}

/// 2^x for one value (running-max corrections); 2^-inf = 0. Same polynomial as the rows.
inline float exp2(float x) { return _mm256_cvtss_f32(detail::exp2(_mm256_set1_ps(x))); }

}  // namespace tileattn::arch::avx2

#endif  // __AVX2__ && __FMA__
