// tileattn/ops/hadamard.hpp: the normalised fast Walsh-Hadamard transform of a row, the
// rotation a 4-bit cache of hadamard_rotated<B> blocks (core/block_quantized_types.hpp)
// applies to K and V before quantizing them, and forward_paged over such pools to Q as it
// loads and to O as it stores.
//
// H_n (n a power of two) is the Sylvester Hadamard matrix scaled by 1 / sqrt(n): orthogonal
// and symmetric, so H H = I and q . k = (H q) . (H k): scores over rotated Q and K are the
// scores over the originals, and P (H V) = H (P V) gives O back through one more H. What
// it buys: a channel with outliers (real K has a few, x20-x100) is spread over all n
// channels, so a block's absmax, and with it the block's 4-bit step, shrinks to the
// rows' typical magnitude (docs/precision.md measures it). log2(n) butterfly passes of
// adds and subtracts, then one multiply: O(n log n) per row, n <= max_head_dim.
#pragma once

#include <cmath>

#include "tileattn/core/tile.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::ops {

/// Whether n (>= 1) is a power of two: the lengths H_n exists for.
constexpr bool hadamard_length(index_t n) { return n >= 1 && (n & (n - 1)) == 0; }

/// row[0, n) = H_n row[0, n) (n a power of two), in float: butterflies (a + b, a - b) in
/// passes of doubling span, then a multiply by 1 / sqrt(n) (exact for n a power of four).
inline void hadamard_row(float* row, index_t n) {
  for (index_t span = 1; span < n; span *= 2)
    for (index_t i = 0; i < n; i += 2 * span)
      for (index_t j = i; j < i + span; ++j) {
        const float a = row[j], b = row[j + span];
        row[j] = a + b;
        row[j + span] = a - b;
      }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (index_t j = 0; j < n; ++j) row[j] *= norm;
}

/// Every row of a float tile, H_cols applied (cols a power of two).
inline void hadamard_rows(Tile<float>& t) {
  for (index_t r = 0; r < t.rows(); ++r) hadamard_row(t.row(r), t.cols());
}

}  // namespace tileattn::ops
