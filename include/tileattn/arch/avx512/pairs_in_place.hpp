// tileattn/arch/avx512/pairs_in_place.hpp: a decode step's products on bf16 pairs with K and
// V rows read in place (vdpbf16ps, two products per 32-bit lane): S = Q K^T with Q's rows as
// pairs along head_dim, whose pairs K's rows already are; O += P V with P's rows as pairs of
// keys, two value rows interleaved into pairs in registers. Half the instructions of the
// float products over converted rows (rows_in_place.hpp), where the set has AVX-512 BF16.
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes nothing. Without BF16 the set takes generic's (the contracts are
// there, arch/generic.hpp: gemm_nt_rows_pairs, gemm_rows_pairs).

#if TILEATTN_AVX512_HAS_BF16
/// Whether a decode step's in-place products multiply bf16 pairs (generic.hpp says when).
inline constexpr bool in_place_pairs = bf16_dot_product;
inline constexpr index_t in_place_pairs_min_rows = 1;

namespace detail {
/// The first n (at most 32) 16-bit lanes.
inline __mmask32 first_halves(index_t n) { return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1; }

/// The lanes of the 16 columns from `first` on that lie before column `cols`.
inline __mmask16 lanes_from(index_t cols, index_t first) {
  return cols <= first ? __mmask16(0) : first_lanes(cols - first < 16 ? cols - first : 16);
}

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

/// Rows x Keys dot products of Q pairs with key rows (Rows * Keys <= 16), as gemm_nt_block
/// (rows_in_place.hpp) sums them: lane l holds pairs p = l mod 16, then sum_lanes_16. The
/// last 32 elements are loaded masked, Q's as 16-bit halves too, so a pad never enters.
template <int Rows, int Keys>
inline void gemm_nt_pairs_block(index_t k, const bf16x2* a, index_t lda, const bf16* const* rows, index_t nj, float* c,
                                index_t ldc) {
  static_assert(Rows * Keys <= 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (index_t p = 0; p < k; p += 32) {
    const __mmask32 mask = first_halves(k - p);
    __m512i av[static_cast<std::size_t>(Rows)];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) av[r] = _mm512_maskz_loadu_epi16(mask, a + r * lda + p / 2);
#pragma GCC unroll 8
    for (int j = 0; j < Keys; ++j) {
      const __m512i kv = _mm512_maskz_loadu_epi16(mask, rows[j] + p);
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) acc[r * Keys + j] = dot_pairs(acc[r * Keys + j], av[r], kv);
    }
  }
  const __m512 sums = sum_lanes_16(acc);
  const __mmask16 keys = first_lanes(nj);
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r)  // row r's sums are lanes r * Keys ..: stored from c[r, -r * Keys]
    _mm512_mask_storeu_ps(c + r * ldc - r * Keys, static_cast<__mmask16>(keys << (r * Keys)), sums);
}

/// Interleaving two rows' 32 values (vpunpck{l,h}wd) leaves the pairs of columns
/// {0-3, 8-11, 16-19, 24-27} in the low vector and {4-7, 12-15, ...} in the high one; these
/// move 32 float columns between that order and theirs (vpermt2ps), once per key tile.
inline void to_pair_order(__m512& lo, __m512& hi) {
  const __m512i take_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i take_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512 a = lo, b = hi;  // columns 0-15, 16-31
  lo = _mm512_permutex2var_ps(a, take_lo, b);
  hi = _mm512_permutex2var_ps(a, take_hi, b);
}
inline void from_pair_order(__m512& lo, __m512& hi) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 a = lo, b = hi;
  lo = _mm512_permutex2var_ps(a, first, b);
  hi = _mm512_permutex2var_ps(a, second, b);
}

/// C (Rows x the 64 columns at col0, `cols` of them) += A B over K keys: A's rows pairs of
/// keys, B's rows 2q and 2q + 1 interleaved into pairs in registers (a zero row past the
/// last), four vectors of 16 float columns per row held in pair order meanwhile.
template <int Rows>
inline void gemm_rows_pairs_block(index_t k, const bf16x2* a, index_t lda, const bf16* const* rows, index_t col0,
                                  index_t cols, float* c, index_t ldc) {
  const __mmask32 m0 = first_halves(cols), m1 = cols > 32 ? first_halves(cols - 32) : __mmask32(0);
  __m512 acc[static_cast<std::size_t>(Rows)][4];
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const index_t first = 16 * v;
      acc[r][v] = _mm512_maskz_loadu_ps(lanes_from(cols, first), c + r * ldc + first);
    }
    to_pair_order(acc[r][0], acc[r][1]);
    to_pair_order(acc[r][2], acc[r][3]);
  }
  for (index_t q = 0; 2 * q < k; ++q) {
    const bf16* x = rows[2 * q] + col0;
    const __m512i x0 = _mm512_maskz_loadu_epi16(m0, x), x1 = _mm512_maskz_loadu_epi16(m1, x + 32);
    __m512i y0 = _mm512_setzero_si512(), y1 = _mm512_setzero_si512();
    if (2 * q + 1 < k) {
      const bf16* y = rows[2 * q + 1] + col0;
      y0 = _mm512_maskz_loadu_epi16(m0, y), y1 = _mm512_maskz_loadu_epi16(m1, y + 32);
    }
    const __m512i pairs[4] = {_mm512_unpacklo_epi16(x0, y0), _mm512_unpackhi_epi16(x0, y0),
                              _mm512_unpacklo_epi16(x1, y1), _mm512_unpackhi_epi16(x1, y1)};
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
      const __m512i ar = _mm512_set1_epi32(std::bit_cast<int>(a[r * lda + q]));
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = dot_pairs(acc[r][v], ar, pairs[v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r) {
    from_pair_order(acc[r][0], acc[r][1]);
    from_pair_order(acc[r][2], acc[r][3]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const index_t first = 16 * v;
      _mm512_mask_storeu_ps(c + r * ldc + first, lanes_from(cols, first), acc[r][v]);
    }
  }
}
}  // namespace detail

/// generic::gemm_nt_rows_pairs on vdpbf16ps, in gemm_nt_rows' blocks (for_each_nt_block).
inline void gemm_nt_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                               float* c, index_t ldc) {
  detail::for_each_nt_block(
      m, n, b_rows, [&]<int Rows, int Keys>(index_t i, index_t j, const bf16* const* rows, index_t nj) {
        detail::gemm_nt_pairs_block<Rows, Keys>(k, a + i * lda, lda, rows, nj, c + i * ldc + j, ldc);
      });
}

/// generic::gemm_rows_pairs on vdpbf16ps: 64 columns at a time, blocks of 4, 2 and 1 rows.
inline void gemm_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const bf16* const* b_rows,
                            float* c, index_t ldc) {
  for (index_t j = 0; j < n; j += 64) {
    const index_t cols = n - j < 64 ? n - j : 64;
    index_t i = 0;
    for (; i + 4 <= m; i += 4)
      detail::gemm_rows_pairs_block<4>(k, a + i * lda, lda, b_rows, j, cols, c + i * ldc + j, ldc);
    if (i + 2 <= m)
      detail::gemm_rows_pairs_block<2>(k, a + i * lda, lda, b_rows, j, cols, c + i * ldc + j, ldc), i += 2;
    if (i < m) detail::gemm_rows_pairs_block<1>(k, a + i * lda, lda, b_rows, j, cols, c + i * ldc + j, ldc);
  }
}
#else
inline constexpr bool in_place_pairs = false;
using generic::gemm_nt_rows_pairs;
using generic::gemm_rows_pairs;
using generic::in_place_pairs_min_rows;
#endif
