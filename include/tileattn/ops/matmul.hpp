// tileattn/ops/matmul.hpp: tile matrix products: C = A B and C += A B on SRAM tiles, over
// float tiles or bf16 pair tiles (C is always float); the sparse-safe C += A B for an
// operand with Inf or NaN; and the SRAM transpose that turns P and dS into P^T and dS^T.
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

/// c += a^T * b with a given as it is stored (k x m): the transposed product reads a's
/// columns, so P^T dO and dS^T Q need no transposed copy of P or dS.
template <class TileC, class TileA, class TileB>
void matmul_accumulate_tn(TileC& c, const TileA& a_t, const TileB& b) {
  assert(a_t.rows() == b.rows() && c.rows() == a_t.cols() && c.cols() == b.cols());
  arch::native::gemm<true, true>(a_t.cols(), b.cols(), a_t.rows(), a_t.data(), a_t.ld(), b.data(), b.ld(),
                                 c.data(), c.ld());
}

/// c += a * b, skipping the terms whose a is zero, in the same order as matmul_accumulate:
/// for a b that holds an Inf or a NaN, which must reach only the rows whose a sees it (a
/// masked probability is an exact zero, and 0 * NaN would poison the row). Float tiles.
template <class TileC, class TileA, class TileB>
void matmul_accumulate_nonzero(TileC& c, const TileA& a, const TileB& b) {
  assert(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols());
  for (index_t i = 0; i < a.rows(); ++i) {
    float* ci = c.row(i);
    for (index_t p = 0; p < a.cols(); ++p) {
      const float aip = a(i, p);
      if (aip == 0.0f) continue;
      const float* bp = b.row(p);
      for (index_t j = 0; j < b.cols(); ++j) ci[j] = std::fma(aip, bp[j], ci[j]);
    }
  }
}

/// The same over bf16 pairs, each pair's high half first as the dot-product micro-kernels
/// add them; a zero half is skipped.
template <class TileC>
void matmul_accumulate_nonzero(TileC& c, const Tile<bf16x2>& a, const Tile<bf16x2>& b) {
  assert(a.cols() == b.rows() && c.rows() == a.rows() && c.cols() == b.cols());
  for (index_t i = 0; i < a.rows(); ++i) {
    float* ci = c.row(i);
    for (index_t p = 0; p < a.cols(); ++p) {
      const float hi = to_float(a(i, p).hi), lo = to_float(a(i, p).lo);
      const bf16x2* bp = b.row(p);
      if (hi != 0.0f)
        for (index_t j = 0; j < b.cols(); ++j) ci[j] = std::fma(hi, to_float(bp[j].hi), ci[j]);
      if (lo != 0.0f)
        for (index_t j = 0; j < b.cols(); ++j) ci[j] = std::fma(lo, to_float(bp[j].lo), ci[j]);
    }
  }
}

/// matmul_accumulate_tn skipping the zero terms of a (float or bf16 pair tiles; for pairs,
/// each pair's high half first, as the micro-kernels add them).
template <class TileC, class TileA, class TileB>
void matmul_accumulate_tn_nonzero(TileC& c, const TileA& a_t, const TileB& b) {
  assert(a_t.rows() == b.rows() && c.rows() == a_t.cols() && c.cols() == b.cols());
  const auto add = [&](float* ci, float a, const auto* bp, auto half) {
    if (a == 0.0f) return;
    for (index_t j = 0; j < b.cols(); ++j) ci[j] = std::fma(a, half(bp[j]), ci[j]);
  };
  for (index_t i = 0; i < a_t.cols(); ++i)
    for (index_t p = 0; p < a_t.rows(); ++p) {
      if constexpr (std::is_same_v<typename TileA::element_type, bf16x2>) {
        add(c.row(i), to_float(a_t(p, i).hi), b.row(p), [](bf16x2 x) { return to_float(x.hi); });
        add(c.row(i), to_float(a_t(p, i).lo), b.row(p), [](bf16x2 x) { return to_float(x.lo); });
      } else {
        add(c.row(i), a_t(p, i), b.row(p), [](float x) { return x; });
      }
    }
}

/// dst = src^T; dst's extent becomes src.cols() x src.rows(). SRAM to SRAM: no HBM traffic.
template <class TileD, class TileS>
void transpose(TileD& dst, const TileS& src) {
  dst.set_extent(src.cols(), src.rows());
  arch::native::transpose(src.rows(), src.cols(), src.data(), src.ld(), dst.data(), dst.ld());
}

}  // namespace tileattn::ops
