// tileattn/memory/tile_io.hpp: the only ways data moves between HBM views and SRAM tiles.
//
// load_rows / load_rows_transposed read a block of sequence rows of one (batch, head)
// matrix into a tile; store_rows and store_vector write results back. Each reports the
// bytes it moved to an IO policy (memory/io_counter.hpp). Element conversion happens here,
// so tile math never sees the storage type.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tileattn/core/strided_view.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn {

/// dst[r, :] = src[row0 + r, :] for r in [0, rows); sets dst's extent to rows x src.cols.
template <class T, index_t Cols, class S, class Io>
void load_rows(Tile<T, Cols>& dst, const MatrixView<const S>& src, index_t row0, index_t rows,
               Io& io) {
  const index_t cols = src.cols;
  dst.set_extent(rows, cols);
  for (index_t r = 0; r < rows; ++r) {
    const S* in = src.row(row0 + r);
    T* out = dst.row(r);
    if (src.col_stride == 1) {
      for (index_t c = 0; c < cols; ++c) out[c] = static_cast<T>(in[c]);
    } else {
      for (index_t c = 0; c < cols; ++c) out[c] = static_cast<T>(in[c * src.col_stride]);
    }
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
}

/// dst[c, r] = src[row0 + r, c]: a block of keys stored as K^T (head_dim x rows), so the
/// score product Q K^T becomes a row-major product that streams along keys.
template <class T, class S, class Io>
void load_rows_transposed(Tile<T>& dst, const MatrixView<const S>& src, index_t row0,
                          index_t rows, Io& io) {
  const index_t cols = src.cols;
  dst.set_extent(cols, rows);
  constexpr index_t block = 16;  // transpose 16 keys at a time to keep both sides in cache lines
  for (index_t r0 = 0; r0 < rows; r0 += block) {
    const index_t r1 = std::min(rows, r0 + block);
    for (index_t c = 0; c < cols; ++c) {
      T* out = dst.row(c);
      for (index_t r = r0; r < r1; ++r) out[r] = static_cast<T>(src(row0 + r, c));
    }
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
}

/// dst[row0 + r, :] = src[r, :] for r in [0, src.rows()).
template <class T, index_t Cols, class D, class Io>
void store_rows(const MatrixView<D>& dst, index_t row0, const Tile<T, Cols>& src, Io& io) {
  const index_t rows = src.rows(), cols = src.cols();
  for (index_t r = 0; r < rows; ++r) {
    const T* in = src.row(r);
    D* out = dst.row(row0 + r);
    if (dst.col_stride == 1) {
      for (index_t c = 0; c < cols; ++c) out[c] = static_cast<D>(in[c]);
    } else {
      for (index_t c = 0; c < cols; ++c) out[c * dst.col_stride] = static_cast<D>(in[c]);
    }
  }
  io.written(static_cast<std::uint64_t>(rows * cols) * sizeof(D));
}

/// dst[i * stride] = src[i] for i in [0, count): per-row statistics such as the LSE.
template <class T, class Io>
void store_vector(T* dst, index_t stride, const T* src, index_t count, Io& io) {
  for (index_t i = 0; i < count; ++i) dst[i * stride] = src[i];
  io.written(static_cast<std::uint64_t>(count) * sizeof(T));
}

}  // namespace tileattn
