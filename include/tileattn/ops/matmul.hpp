// tileattn/ops/matmul.hpp: tile matrix products: C = A B and C += A B on SRAM tiles, over
// float tiles or bf16 pair tiles (C is always float), and with K or V rows read in place
// (RowRefs: C = A B^T, C += A B); the sparse-safe C += A B for an operand with Inf or NaN,
// which skips the terms a row does not see; and the SRAM transpose that turns P and dS into
// P^T and dS^T.
#pragma once

#include <cassert>
#include <cmath>
#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn::ops {

/// c = a * b; c's extent becomes a.rows() x b.cols().
template <class TileC, class TileA, class TileB>
void matmul(TileC& c, const TileA& a, const TileB& b) {
  assert(a.cols() == b.rows());
  c.set_extent(a.rows(), b.cols());
  arch::native::gemm<false>(a.rows(), b.cols(), a.cols(), a.data(), a.ld(), b.data(), b.ld(),
                            c.data(), c.ld());
}

/// c += a * b; c already has extent a.rows() x b.cols().
template <class TileC, class TileA, class TileB>
void matmul_accumulate(TileC& c, const TileA& a, const TileB& b) {
  assert(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols());
  arch::native::gemm<true>(a.rows(), b.cols(), a.cols(), a.data(), a.ld(), b.data(), b.ld(),
                           c.data(), c.ld());
}

/// c = a * b^T for rows b read in place (S = Q K^T with K's rows where they are, float,
/// bf16 or fp16, converted in registers).
template <class TileC, class TileA, class E>
void matmul_transposed(TileC& c, const TileA& a, const RowRefs<E>& b) {
  assert(a.cols() == b.cols());
  c.set_extent(a.rows(), b.rows());
  arch::native::gemm_nt_rows(a.rows(), b.rows(), a.cols(), a.data(), a.ld(), b.data(), c.data(), c.ld());
}

/// c += a * b for rows b read in place (O += P V), in the order of sums of matmul_accumulate.
template <class TileC, class TileA, class E>
void matmul_accumulate(TileC& c, const TileA& a, const RowRefs<E>& b) {
  assert(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols());
  arch::native::gemm_rows(a.rows(), b.cols(), a.cols(), a.data(), a.ld(), b.data(), c.data(), c.ld());
}

/// c = a * b^T with a's rows bf16 pairs of b.cols() elements and b's bf16 rows read in place
/// (a decode step's S = Q K^T on pairs, where arch::native::in_place_pairs()).
template <class TileC>
void matmul_transposed(TileC& c, const Tile<bf16x2>& a, const RowRefs<bf16>& b) {
  assert(a.cols() == (b.cols() + 1) / 2);
  c.set_extent(a.rows(), b.rows());
  arch::native::gemm_nt_rows_pairs(a.rows(), b.rows(), b.cols(), a.data(), a.ld(), b.data(), c.data(), c.ld());
}

/// c += a * b with a's rows bf16 pairs of b.rows() keys and b's bf16 rows read in place (a
/// decode step's O += P V on pairs).
template <class TileC>
void matmul_accumulate(TileC& c, const Tile<bf16x2>& a, const RowRefs<bf16>& b) {
  assert(a.cols() == (b.rows() + 1) / 2 && c.rows() == a.rows() && c.cols() == b.cols());
  arch::native::gemm_rows_pairs(a.rows(), b.cols(), b.rows(), a.data(), a.ld(), b.data(), c.data(), c.ld());
}

/// c += a^T * b with a given as it is stored (k x m): the transposed product reads a's
/// columns, so P^T dO and dS^T Q need no transposed copy of P or dS.
template <class TileC, class TileA, class TileB>
void matmul_accumulate_tn(TileC& c, const TileA& a_t, const TileB& b) {
  assert(a_t.rows() == b.rows() && c.rows() == a_t.cols() && c.cols() == b.cols());
  arch::native::gemm<true, true>(a_t.cols(), b.cols(), a_t.rows(), a_t.data(), a_t.ld(), b.data(), b.ld(),
                                 c.data(), c.ld());
}

/// A tile that is the B operand of many row slabs' products (a key tile's K^T or V),
/// prepared once by the micro-kernel set (arch/prepared_pairs.hpp): bf16 pair tiles packed
/// into `buffer` where the set multiplies faster from its own layout, else read in place.
/// `tile` stays the operand's values (the finite check and the row-by-row path read it).
/// rows and cols: the part a product multiplies, from the first row and column on (a slab
/// that sees only the first keys of a key tile: leading(), columns()).
template <class Op>
struct PreparedOperand {
  const Tile<Op>* tile;
  arch::PreparedPairs pairs;
  index_t rows = tile->rows(), cols = tile->cols();

  /// The first n columns (keys of K^T).
  PreparedOperand columns(index_t n) const { return {tile, pairs, rows, n}; }
  /// The first n rows (pairs of keys of V).
  PreparedOperand leading(index_t n) const { return {tile, pairs, n, cols}; }
};

/// b prepared for many products; buffer holds arch::prepared_pairs_capacity(b.rows(), b.cols()) pairs.
inline PreparedOperand<bf16x2> prepare_operand(const Tile<bf16x2>& b, bf16x2* buffer) {
  return {&b, arch::native::prepare_pairs(b.rows(), b.cols(), b.data(), b.ld(), buffer)};
}

/// The operand's values: the tile itself, or the tile a prepared operand was made from.
template <class AnyTile>
const AnyTile& values_of(const AnyTile& b) { return b; }
template <class Op>
const Tile<Op>& values_of(const PreparedOperand<Op>& b) { return *b.tile; }

/// c = a * b with b prepared; c's extent becomes a.rows() x b's columns.
template <class TileC, class TileA>
void matmul(TileC& c, const TileA& a, const PreparedOperand<bf16x2>& b) {
  assert(a.cols() == b.rows);
  c.set_extent(a.rows(), b.cols);
  arch::native::gemm_prepared<false>(a.rows(), b.cols, a.cols(), a.data(), a.ld(), b.pairs, c.data(), c.ld());
}

/// c += a * b with b prepared.
template <class TileC, class TileA>
void matmul_accumulate(TileC& c, const TileA& a, const PreparedOperand<bf16x2>& b) {
  assert(a.cols() == b.rows && c.rows() == a.rows() && c.cols() == b.cols);
  arch::native::gemm_prepared<true>(a.rows(), b.cols, a.cols(), a.data(), a.ld(), b.pairs, c.data(), c.ld());
}

/// Brackets a work item's products (arch::native::begin_products / end_products: on AMX,
/// one tile configuration for all of them).
struct ProductScope {
  ProductScope() { arch::native::begin_products(); }
  ~ProductScope() { arch::native::end_products(); }
  ProductScope(const ProductScope&) = delete;
  ProductScope& operator=(const ProductScope&) = delete;
};

namespace detail {
/// c[i] += sum over p of a_at(i, p) * b[p], skipping the terms hidden(i, v) names (v: the
/// value's index along the summed dimension), p in order; for bf16 pairs each pair's high
/// half (value 2p + 1) first, as the dot-product micro-kernels add them.
template <class TileC, class AAt, class TileB, class Hidden>
void accumulate_visible(TileC& c, index_t depth, AAt a_at, const TileB& b, Hidden hidden) {
  for (index_t i = 0; i < c.rows(); ++i) {
    float* ci = c.row(i);
    const auto add = [&](index_t v, float a, const auto* bp, auto half) {
      if (!hidden(i, v))
        for (index_t j = 0; j < b.cols(); ++j) ci[j] = std::fma(a, half(bp[j]), ci[j]);
    };
    for (index_t p = 0; p < depth; ++p) {
      if constexpr (std::is_same_v<typename TileB::element_type, bf16x2>) {
        const bf16x2 a = a_at(i, p);
        add(2 * p + 1, to_float(a.hi), b.row(p), [](bf16x2 x) { return to_float(x.hi); });
        add(2 * p, to_float(a.lo), b.row(p), [](bf16x2 x) { return to_float(x.lo); });
      } else {
        add(p, a_at(i, p), b.row(p), [](float x) { return x; });
      }
    }
  }
}
}  // namespace detail

/// c += a * b without the terms hidden(i, v) names (row i of a, value v of its row), in the
/// same order as matmul_accumulate: for a b that holds an Inf or a NaN, which must reach
/// exactly the rows that see it. A hidden term (a masked key's P or dS, an exact zero)
/// never meets it (0 * NaN would poison the row); a term the row sees follows IEEE
/// arithmetic, 0 * Inf included.
template <class TileC, class TileA, class TileB, class Hidden>
void matmul_accumulate_visible(TileC& c, const TileA& a, const TileB& b, Hidden hidden) {
  assert(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols());
  detail::accumulate_visible(c, a.cols(), [&](index_t i, index_t p) { return a(i, p); }, b, hidden);
}

/// matmul_accumulate_tn without the terms hidden(i, v) names (column i of a_t, value v of
/// that column).
template <class TileC, class TileA, class TileB, class Hidden>
void matmul_accumulate_tn_visible(TileC& c, const TileA& a_t, const TileB& b, Hidden hidden) {
  assert(a_t.rows() == b.rows() && c.rows() == a_t.cols() && c.cols() == b.cols());
  detail::accumulate_visible(c, a_t.rows(), [&](index_t i, index_t p) { return a_t(p, i); }, b, hidden);
}

/// dst = src^T; dst's extent becomes src.cols() x src.rows(). SRAM to SRAM: no HBM traffic.
template <class TileD, class TileS>
void transpose(TileD& dst, const TileS& src) {
  dst.set_extent(src.cols(), src.rows());
  arch::native::transpose(src.rows(), src.cols(), src.data(), src.ld(), dst.data(), dst.ld());
}

}  // namespace tileattn::ops
