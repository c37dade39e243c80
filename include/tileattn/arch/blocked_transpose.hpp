// tileattn/arch/blocked_transpose.hpp: the loop every SIMD transpose shares: a rows x cols
// row-major block walked in Lanes x Lanes register blocks, each handed to the arch's own
// block transpose (full blocks unmasked, edge blocks masked).
#pragma once

#include <type_traits>

#include "tileattn/core/types.hpp"

namespace tileattn::arch::detail {

/// dst[c * ldd + r] = src[r * lds + c] through block(std::bool_constant<Full>, rows, cols,
/// from, lds, to, ldd). Column blocks are the outer loop, so the stores run along dst rows:
/// with row blocks outside, each block writes Lanes dst rows one ldd apart, and with ldd a
/// power of two (Bc = 512) those lines fall into a couple of L1 sets and evict each other
/// (2-4x slower, measured).
template <index_t Lanes, class Block>
void transpose_in_blocks(index_t rows, index_t cols, const float* src, index_t lds, float* dst,
                         index_t ldd, Block&& block) {
  for (index_t c0 = 0; c0 < cols; c0 += Lanes) {
    const index_t block_cols = cols - c0 < Lanes ? cols - c0 : Lanes;
    for (index_t r0 = 0; r0 < rows; r0 += Lanes) {
      const index_t block_rows = rows - r0 < Lanes ? rows - r0 : Lanes;
      const float* from = src + r0 * lds + c0;
      float* to = dst + c0 * ldd + r0;
      if (block_rows == Lanes && block_cols == Lanes)
        block(std::true_type{}, Lanes, Lanes, from, lds, to, ldd);
      else
        block(std::false_type{}, block_rows, block_cols, from, lds, to, ldd);
    }
  }
}

}  // namespace tileattn::arch::detail
