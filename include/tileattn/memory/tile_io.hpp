// tileattn/memory/tile_io.hpp: the only ways data moves between HBM views and SRAM tiles.
//
// load_rows / load_rows_transposed read a block of sequence rows of one (batch, head)
// matrix into a tile; store_rows and store_vector write results back. Each reports the
// bytes it moved to an IO policy (memory/io_counter.hpp); prefetch_rows only hints. Element conversion happens here,
// so tile math never sees the storage type.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tileattn/arch/native.hpp"
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
  if constexpr (std::is_same_v<T, float> && std::is_same_v<S, float>) {
    if (src.col_stride == 1) {  // register-blocked transpose of the arch in use
      arch::native::transpose(rows, cols, src.row(row0), src.row_stride, dst.data(), dst.ld());
      io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
      return;
    }
  }
  for (index_t c = 0; c < cols; ++c)
    for (index_t r = 0; r < rows; ++r) dst(c, r) = static_cast<T>(src(row0 + r, c));
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
}

/// Asks the cache hierarchy for rows [row0, row0 + rows) of src ahead of their load (into
/// L2: the CPU's stand-in for FlashAttention-3's asynchronous copy of the next K/V tile
/// while the current one is computed). Moves no data through the IO counter.
template <class S>
void prefetch_rows(const MatrixView<const S>& src, index_t row0, index_t rows) {
  constexpr index_t line = static_cast<index_t>(cache_line_bytes / sizeof(S));
  const index_t span = (src.cols - 1) * src.col_stride + 1;
  for (index_t r = row0; r < row0 + rows; ++r)
    for (index_t c = 0; c < span; c += line) __builtin_prefetch(src.row(r) + c, 0, 2);
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
