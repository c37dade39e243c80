// tileattn/ops/matmul.hpp: tile matrix products: C = A B and C += A B on SRAM tiles, over
// float tiles or bf16 pair tiles (C is always float).
#pragma once

#include <cassert>

#include "tileattn/arch/native.hpp"
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

}  // namespace tileattn::ops
