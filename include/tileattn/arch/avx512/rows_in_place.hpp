// tileattn/arch/avx512/rows_in_place.hpp: products with K or V rows read in place on AVX-512 (float,
// bf16, fp16 or 8-bit rows, converted in registers): the forward's decode path
// (kernels/forward.hpp; kernels/work_list.hpp, in_place_max_rows).
//
// Part of arch::avx512's body: arch/avx512/set.hpp includes it once per feature set, inside
// the set's namespace and under its target (arch/avx512.hpp says why), so it has no include
// guard and includes nothing.

namespace detail {
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

/// The blocks of C (M x N) = A B^T over key rows b_rows[0..n): 4 rows of A x 4 keys, then
/// 2 x 8 and 1 x 8, each a call block.template operator()<Rows, Keys>(i, j, rows, nj) for
/// A's rows from i and the nj keys rows[0..nj) from j (a real row stands in past n, so
/// that a block always reads Keys rows). The products over converted rows and over bf16
/// pairs (pairs_in_place.hpp) share it.
template <class E, class Block>
inline void for_each_nt_block(index_t m, index_t n, const E* const* b_rows, Block&& block) {
  for (index_t j0 = 0; j0 < n; j0 += 8) {
    const index_t nj = n - j0 < 8 ? n - j0 : 8;
    const E* rows[8];
    for (index_t j = 0; j < 8; ++j) rows[j] = b_rows[j0 + (j < nj ? j : 0)];
    index_t i = 0;
    for (; i + 4 <= m; i += 4) {
      block.template operator()<4, 4>(i, j0, rows, nj < 4 ? nj : 4);
      if (nj > 4) block.template operator()<4, 4>(i, j0 + 4, rows + 4, nj - 4);
    }
    for (; i + 2 <= m; i += 2) block.template operator()<2, 8>(i, j0, rows, nj);
    if (i < m) block.template operator()<1, 8>(i, j0, rows, nj);
  }
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
  detail::for_each_nt_block(m, n, b_rows,
                            [&]<int Rows, int Keys>(index_t i, index_t j, const E* const* rows, index_t nj) {
    detail::gemm_nt_block<Rows, Keys>(k, a + i * lda, lda, rows, nj, c + i * ldc + j, ldc);
  });
}

/// C (M x N) += A (M x K) * B, B's row p at b_rows[p] (N elements, float, bf16, fp16 or 8-bit,
/// anywhere in memory): P V with the values read in place, in gemm's order of sums.
template <class E>
void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
               index_t ldc) {
  using namespace detail;
  if (m <= 0 || n <= 0) return;
  for_each_column_panel<VecTraits>(n, [&](int vectors, index_t j, __mmask16 last, bool) {
    if (vectors == 1) gemm_rows_panel<1>(m, k, a, lda, b_rows, j, c + j, ldc, last);
    else if (vectors == 2) gemm_rows_panel<2>(m, k, a, lda, b_rows, j, c + j, ldc, last);
    else gemm_rows_panel<3>(m, k, a, lda, b_rows, j, c + j, ldc, last);
  });
}
