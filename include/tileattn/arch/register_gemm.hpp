// tileattn/arch/register_gemm.hpp: the register-blocked tile gemm, written once for every
// SIMD set over the set's VecTraits (its registers, masks and blocking) and Operand<E> (how
// one element type of A and B is loaded, broadcast and multiplied).
//
// Not a header on its own: arch/avx2.hpp and arch/avx512/gemm.hpp include it inside their
// namespace `detail`, after their VecTraits and Operand, so that its templates are compiled
// under that set's target (a dispatched build's target pragma applies to the functions
// defined after it; a template defined outside would be compiled for the baseline and could
// not inline the set's intrinsics). Hence no include guard and no includes.
//
// The method. A block of C, Rows x Vectors registers, stays in accumulators for the whole
// of K: per step of K, Vectors loads of B and Rows broadcasts of A feed Rows x Vectors
// fused multiply-adds. C is swept in column panels of VecTraits::panel_vectors registers,
// each panel in blocks of VecTraits::block_rows(vectors) rows and then one block of the rows
// left. The last register of a panel goes through a mask: always, where a masked load costs
// what a plain one does (VecTraits::masks_every_panel: AVX-512, one instantiation instead of
// two per shape), else only when N ends inside it (AVX2's vmaskmovps costs more). When M is
// large enough to reuse it (VecTraits::pack_min_rows), each panel of B is first copied,
// pack_depth rows of K at a time, into a contiguous buffer that stays in L1: B tiles have
// power-of-two leading dimensions (Bc = 512, d = 128), whose rows otherwise fall into a few
// L1 sets and evict each other.
//
// Sums. Each element of C is one fused chain over K in order, from zero or from C: the
// blocking, the panels and the packing (whose depth blocks pass C through memory exactly,
// fp32 stores and loads) never change its bits.
//
// What a VecTraits V gives:
//   reg, mask              an accumulator register of V::lanes floats; a lane mask
//   lanes, masks_every_panel, pack_min_rows
//   block_rows(vectors), panel_vectors(remaining)   the blocking (constexpr)
//   first_lanes(count)     a mask of lanes [0, count), count in [0, lanes]
//   zero(), load(p), load(p, mask), store(p, reg), store(p, mask, reg)   on float C
//   Operand<E>             (a template in the set's detail) vec, load(p), load(p, mask),
//                          broadcast(p), store_aligned(p, vec), madd(acc, a, b)

inline constexpr index_t pack_depth = 128;  // rows of B per packed buffer

/// C (Rows x Vectors*lanes, the last vector limited by `last` when Masked) (+)= A B over
/// the whole K, unrolled at compile time into fused multiply-adds on registers.
template <class V, int Rows, int Vectors, bool Accumulate, bool Masked, bool TransA, class E>
inline void gemm_block(index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c, index_t ldc,
                       typename V::mask last) {
  using Op = Operand<E>;
  constexpr index_t lanes = V::lanes;
  typename V::reg acc[static_cast<std::size_t>(Rows)][static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      if constexpr (!Accumulate) acc[r][v] = V::zero();
      else if (Masked && v == Vectors - 1) acc[r][v] = V::load(c + r * ldc + v * lanes, last);
      else acc[r][v] = V::load(c + r * ldc + v * lanes);
    }
  }
  for (index_t p = 0; p < k; ++p) {
    const E* bp = b + p * ldb;
    typename Op::vec bv[static_cast<std::size_t>(Vectors)];
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v)
      bv[v] = Masked && v == Vectors - 1 ? Op::load(bp + v * lanes, last) : Op::load(bp + v * lanes);
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
      if (Masked && v == Vectors - 1) V::store(c + r * ldc + v * lanes, last, acc[r][v]);
      else V::store(c + r * ldc + v * lanes, acc[r][v]);
    }
  }
}

/// The last `rows_left` (< Rows) rows of a panel: one block instantiated for that count.
template <class V, int Rows, int Vectors, bool Accumulate, bool Masked, bool TransA, class E>
inline void gemm_row_tail(index_t rows_left, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
                          index_t ldc, typename V::mask last) {
  if constexpr (Rows > 0) {
    if (rows_left == Rows)
      gemm_block<V, Rows, Vectors, Accumulate, Masked, TransA>(k, a, lda, b, ldb, c, ldc, last);
    else
      gemm_row_tail<V, Rows - 1, Vectors, Accumulate, Masked, TransA>(rows_left, k, a, lda, b, ldb, c, ldc, last);
  }
}

/// One column panel of C (all M rows, Vectors registers wide) in blocks of block_rows rows.
template <class V, int Vectors, bool Accumulate, bool Masked, bool TransA, class E>
inline void gemm_panel(index_t m, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
                       index_t ldc, typename V::mask last) {
  constexpr int rows = V::block_rows(Vectors);
  index_t i = 0;
  for (; i + rows <= m; i += rows)
    gemm_block<V, rows, Vectors, Accumulate, Masked, TransA>(k, a + (TransA ? i : i * lda), lda, b, ldb,
                                                             c + i * ldc, ldc, last);
  if (i < m)
    gemm_row_tail<V, rows - 1, Vectors, Accumulate, Masked, TransA>(m - i, k, a + (TransA ? i : i * lda), lda, b,
                                                                    ldb, c + i * ldc, ldc, last);
}

/// packed (depth x Vectors*lanes, contiguous) = B (depth x Vectors*lanes), masked lanes zeroed.
template <class V, int Vectors, bool Masked, class E>
inline void pack_panel(index_t depth, const E* b, index_t ldb, E* packed, typename V::mask last) {
  using Op = Operand<E>;
  constexpr index_t lanes = V::lanes;
  for (index_t p = 0; p < depth; ++p) {
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      const E* from = b + p * ldb + v * lanes;
      Op::store_aligned(packed + (p * Vectors + v) * lanes,
                        Masked && v == Vectors - 1 ? Op::load(from, last) : Op::load(from));
    }
  }
}

/// gemm_panel, with B copied into an L1-resident buffer pack_depth rows of K at a time when
/// there are enough rows of C to reuse each copy.
template <class V, int Vectors, bool Accumulate, bool Masked, bool TransA, class E>
inline void gemm_panel_packed(index_t m, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
                              index_t ldc, typename V::mask last) {
  if (m < V::pack_min_rows || k == 0) {
    gemm_panel<V, Vectors, Accumulate, Masked, TransA>(m, k, a, lda, b, ldb, c, ldc, last);
    return;
  }
  constexpr index_t packed_ld = Vectors * V::lanes;
  alignas(64) E packed[static_cast<std::size_t>(pack_depth * packed_ld)];
  for (index_t p0 = 0; p0 < k; p0 += pack_depth) {
    const index_t depth = k - p0 < pack_depth ? k - p0 : pack_depth;
    pack_panel<V, Vectors, Masked>(depth, b + p0 * ldb, ldb, packed, last);
    if (p0 == 0)
      gemm_panel<V, Vectors, Accumulate, Masked, TransA>(m, depth, a, lda, packed, packed_ld, c, ldc, last);
    else
      gemm_panel<V, Vectors, true, Masked, TransA>(m, depth, a + (TransA ? p0 * lda : p0), lda, packed, packed_ld, c,
                                                   ldc, last);
  }
}

/// gemm_panel_packed for a panel `vectors` (1, 2 or 3) registers wide.
template <class V, bool Accumulate, bool Masked, bool TransA, class E>
inline void gemm_panel_of(int vectors, index_t m, index_t k, const E* a, index_t lda, const E* b, index_t ldb,
                          float* c, index_t ldc, typename V::mask last) {
  switch (vectors) {
    case 1: gemm_panel_packed<V, 1, Accumulate, Masked, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
    case 2: gemm_panel_packed<V, 2, Accumulate, Masked, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
    default: gemm_panel_packed<V, 3, Accumulate, Masked, TransA>(m, k, a, lda, b, ldb, c, ldc, last); break;
  }
}

/// Calls panel(vectors, j, last, partial) for the column panels of an N-column C:
/// `vectors` registers from column j on (V::panel_vectors of those left), the last one
/// limited to the lanes in `last`, `partial` when N ends inside it.
template <class V, class Panel>
inline void for_each_column_panel(index_t n, Panel&& panel) {
  const index_t last_lanes = n % V::lanes == 0 ? V::lanes : n % V::lanes;
  index_t remaining = (n + V::lanes - 1) / V::lanes;  // registers of C per row still to do
  for (index_t j = 0; remaining > 0;) {
    const int vectors = V::panel_vectors(remaining);
    remaining -= vectors;
    const index_t used = remaining == 0 ? last_lanes : V::lanes;
    panel(vectors, j, V::first_lanes(used), used != V::lanes);
    j += vectors * V::lanes;
  }
}

/// C (M x N) = A (M x K) * B (K x N), or += when Accumulate; all row-major with leading
/// dimensions lda, ldb, ldc (elements; A given as its K x M transpose when TransA). Any M,
/// N, K >= 0.
template <class V, bool Accumulate, bool TransA, class E>
inline void register_gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b, index_t ldb,
                          float* c, index_t ldc) {
  if (m <= 0 || n <= 0) return;
  for_each_column_panel<V>(n, [&](int vectors, index_t j, typename V::mask last, bool partial) {
    if constexpr (V::masks_every_panel)
      gemm_panel_of<V, Accumulate, true, TransA>(vectors, m, k, a, lda, b + j, ldb, c + j, ldc, last);
    else if (partial)
      gemm_panel_of<V, Accumulate, true, TransA>(vectors, m, k, a, lda, b + j, ldb, c + j, ldc, last);
    else
      gemm_panel_of<V, Accumulate, false, TransA>(vectors, m, k, a, lda, b + j, ldb, c + j, ldc, last);
  });
}
