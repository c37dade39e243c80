// tileattn/memory/block_tile_io.hpp: the tile loads of 4-bit K/V blocks (q4_0, MXFP4, NVFP4:
// core/block_quantized_types.hpp) into float tiles, dequantized exactly as they load.
//
// A block row of a K or V matrix is head_dim / values_per_block blocks (the view's columns
// count blocks); the float tile gets head_dim values per row. Each block turns into its
// values through a 16-entry table (every nibble's value times the block's scale, exact in
// float), so the loads read the scale once per block and the nibbles once. The IO counters
// count the blocks' bytes: the 4-bit values and their scales, nothing else.
// tile_io.hpp includes this header: its paged loads reach these through the same names.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn {

namespace detail {

/// out[0, blocks * B::values) = the values of blocks in[0], in[stride], ... (a row of K or V):
/// the arch's vector lookup for contiguous blocks (arch::native::dequantize_blocks), the
/// scalar table lookup (arch::generic's: the same bits) block by block otherwise.
template <block_quantized_type B>
void dequantize_blocks(const B* in, index_t stride, index_t blocks, float* out) {
  if (stride == 1) return arch::native::dequantize_blocks(in, out, blocks);
  for (index_t c = 0; c < blocks; ++c, out += B::values) arch::generic::dequantize_blocks(in + c * stride, out, 1);
}

}  // namespace detail

/// dst[r, :] = the values of src's row row0 + r, r in [0, rows): extent rows x head_dim.
template <block_quantized_type B, class Io>
void load_rows(Tile<float>& dst, const MatrixView<const B>& src, index_t row0, index_t rows, Io& io) {
  dst.set_extent(rows, src.cols * B::values);
  for (index_t r = 0; r < rows; ++r) detail::dequantize_blocks(src.row(row0 + r), src.col_stride, src.cols, dst.row(r));
  io.read(static_cast<std::uint64_t>(rows * src.cols) * sizeof(B));
}

/// dst[c, r] = value c of src's row row0 + r: K^T (head_dim x rows), dequantized 16 rows x
/// 64 values at a time into a staging block, then transposed (as the 16-bit loads).
template <block_quantized_type B, class Io>
void load_rows_transposed(Tile<float>& dst, const MatrixView<const B>& src, index_t row0, index_t rows, Io& io) {
  constexpr index_t block_rows = 16, block_cols = 64, blocks_per_stage = block_cols / B::values;
  const index_t cols = src.cols * B::values;
  dst.set_extent(cols, rows);
  io.read(static_cast<std::uint64_t>(rows * src.cols) * sizeof(B));
  alignas(64) float stage[block_rows * block_cols];
  for (index_t r0 = 0; r0 < rows; r0 += block_rows) {
    const index_t nr = std::min(block_rows, rows - r0);
    for (index_t b0 = 0; b0 < src.cols; b0 += blocks_per_stage) {
      const index_t nb = std::min(blocks_per_stage, src.cols - b0);
      for (index_t r = 0; r < nr; ++r)
        detail::dequantize_blocks(src.row(row0 + r0 + r) + b0 * src.col_stride, src.col_stride, nb,
                                  stage + r * block_cols);
      arch::native::transpose(nr, nb * B::values, stage, block_cols, dst.row(b0 * B::values) + r0, dst.ld());
    }
  }
}

/// V's rows for P V in float tiles: load_rows.
template <block_quantized_type B, class Io>
void load_rows_pairwise(Tile<float>& dst, const MatrixView<const B>& src, index_t row0, index_t rows, Io& io) {
  load_rows(dst, src, row0, rows, io);
}

}  // namespace tileattn
