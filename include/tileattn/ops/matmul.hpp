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

/// c += a^T * b with a given as it is stored (k x m): the transposed product reads a's
/// columns, so P^T dO and dS^T Q need no transposed copy of P or dS.
template <class TileC, class TileA, class TileB>
void matmul_accumulate_tn(TileC& c, const TileA& a_t, const TileB& b) {
  assert(a_t.rows() == b.rows() && c.rows() == a_t.cols() && c.cols() == b.cols());
  arch::native::gemm<true, true>(a_t.cols(), b.cols(), a_t.rows(), a_t.data(), a_t.ld(), b.data(), b.ld(),
                                 c.data(), c.ld());
}

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
