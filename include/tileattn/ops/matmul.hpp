// tileattn/ops/matmul.hpp: tile matrix products: C = A B and C += A B on SRAM tiles, over
// float tiles or bf16 pair tiles (C is always float), and the rounding of a float tile
// into a pair tile (P before P V).
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

/// p = s rounded to bf16, as pairs along the row (extent s.rows() x ceil(s.cols() / 2)).
inline void round_to_pairs(Tile<bf16x2>& p, const Tile<float>& s) {
  p.set_extent(s.rows(), (s.cols() + 1) / 2);
  for (index_t r = 0; r < s.rows(); ++r) arch::native::round_to_pairs(s.row(r), p.row(r), s.cols());
}

}  // namespace tileattn::ops
