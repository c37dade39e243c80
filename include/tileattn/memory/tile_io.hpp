// tileattn/memory/tile_io.hpp: the only ways data moves between HBM views and SRAM tiles.
//
// load_rows / load_rows_transposed / load_rows_pairwise read a block of sequence rows of
// one (batch, head) matrix into a tile laid out for its role in a product, load_vector a
// per-row statistic; store_rows and store_vector write results back. Each reports the
// bytes it moved, counted in the stored type (2 per bf16 or fp16 element), to an IO
// policy (memory/io_counter.hpp); prefetch_rows only hints. Element conversion and layout
// changes happen here, so tile math never sees the storage type: float tiles take float,
// bf16 or fp16 (converted exactly); bf16 pair tiles (bf16x2, for the bf16 dot-product
// micro-kernels) take bf16 and pack it as the product needs (pairs along head_dim for Q
// and K, pairs of rows for V). A paged source (core/paged_view.hpp) is read page run by
// page run through the same loads: a paged cache is a different load, not another kernel.
// 8-bit K and V (core/quantized_types.hpp) load like the 16-bit types, converted exactly
// (every fp8 and int8 value is a bf16 and a float); their scales come as a per-key vector
// (load_scales) that the kernel folds into the scores and probabilities. 4-bit K and V
// (blocks with their scales inside) load into float tiles through memory/block_tile_io.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/block_tile_io.hpp"

namespace tileattn {

namespace detail {
/// One sequence row (contiguous) into floats, converting 16-bit storage types.
template <class S>
void row_to_float(const S* in, float* out, index_t cols) {
  if constexpr (std::is_same_v<S, float>) std::copy_n(in, cols, out);
  else arch::native::to_float(in, out, cols);
}
}  // namespace detail

/// dst[r, :] = src[row0 + r, :] for r in [0, rows); sets dst's extent to rows x src.cols.
/// Float tiles take any storage type (converted exactly).
template <class S, class Io>
void load_rows(Tile<float>& dst, const MatrixView<const S>& src, index_t row0, index_t rows,
               Io& io) {
  const index_t cols = src.cols;
  dst.set_extent(rows, cols);
  for (index_t r = 0; r < rows; ++r) {
    const S* in = src.row(row0 + r);
    float* out = dst.row(r);
    if (src.col_stride == 1) {
      detail::row_to_float(in, out, cols);
    } else {
      for (index_t c = 0; c < cols; ++c) out[c] = to_float(in[c * src.col_stride]);
    }
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
}

/// The same into a bf16 pair tile (the A operand of a bf16 product: pairs along the
/// columns): extent rows x ceil(cols / 2), an odd last column paired with a zero.
template <class Io>
void load_rows(Tile<bf16x2>& dst, const MatrixView<const bf16>& src, index_t row0, index_t rows,
               Io& io) {
  const index_t cols = src.cols, pairs = (cols + 1) / 2;
  dst.set_extent(rows, pairs);
  for (index_t r = 0; r < rows; ++r) {
    auto* out = reinterpret_cast<bf16*>(dst.row(r));
    const bf16* in = src.row(row0 + r);
    if (src.col_stride == 1) std::copy_n(in, cols, out);
    else for (index_t c = 0; c < cols; ++c) out[c] = in[c * src.col_stride];
    if (cols % 2) out[cols] = bf16{};
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(bf16));
}

/// dst[c, r] = src[row0 + r, c]: a block of keys stored as K^T (head_dim x rows), so the
/// score product Q K^T becomes a row-major product that streams along keys. 16-bit storage
/// is converted 16 rows x 64 columns at a time into a staging block, then transposed.
template <class S, class Io>
void load_rows_transposed(Tile<float>& dst, const MatrixView<const S>& src, index_t row0,
                          index_t rows, Io& io) {
  const index_t cols = src.cols;
  dst.set_extent(cols, rows);
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
  if (src.col_stride != 1) {
    for (index_t c = 0; c < cols; ++c)
      for (index_t r = 0; r < rows; ++r) dst(c, r) = to_float(src(row0 + r, c));
  } else if constexpr (std::is_same_v<S, float>) {  // register-blocked transpose of the arch in use
    arch::native::transpose(rows, cols, src.row(row0), src.row_stride, dst.data(), dst.ld());
  } else {
    constexpr index_t block_rows = 16, block_cols = 64;
    alignas(64) float stage[block_rows * block_cols];
    for (index_t r0 = 0; r0 < rows; r0 += block_rows) {
      const index_t nr = std::min(block_rows, rows - r0);
      for (index_t c0 = 0; c0 < cols; c0 += block_cols) {
        const index_t nc = std::min(block_cols, cols - c0);
        for (index_t r = 0; r < nr; ++r)
          arch::native::to_float(src.row(row0 + r0 + r) + c0, stage + r * block_cols, nc);
        arch::native::transpose(nr, nc, stage, block_cols, dst.row(c0) + r0, dst.ld());
      }
    }
  }
}

/// The same into a bf16 pair tile (the B operand of Q K^T): element (p, r) holds the pair
/// (K[r, 2p], K[r, 2p + 1]), so the tile is the transpose of K's rows read as 32-bit pairs;
/// extent ceil(cols / 2) x rows, an odd head_dim's last pair completed with a zero.
template <class Io>
void load_rows_transposed(Tile<bf16x2>& dst, const MatrixView<const bf16>& src, index_t row0,
                          index_t rows, Io& io) {
  const index_t cols = src.cols, pairs = (cols + 1) / 2;
  dst.set_extent(pairs, rows);
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(bf16));
  if (src.col_stride != 1 || src.row_stride % 2 != 0 ||
      reinterpret_cast<std::uintptr_t>(src.data) % alignof(float) != 0) {  // pairs read as floats
    for (index_t p = 0; p < pairs; ++p)
      for (index_t r = 0; r < rows; ++r)
        dst(p, r) = {src(row0 + r, 2 * p), 2 * p + 1 < cols ? src(row0 + r, 2 * p + 1) : bf16{}};
    return;
  }
  // Whole pairs move as 32-bit lanes through the float transpose (bits unchanged).
  arch::native::transpose(rows, cols / 2, reinterpret_cast<const float*>(src.row(row0)),
                          src.row_stride / 2, reinterpret_cast<float*>(dst.data()), dst.ld());
  if (cols % 2)
    for (index_t r = 0; r < rows; ++r) dst(pairs - 1, r) = {src(row0 + r, cols - 1), bf16{}};
}

/// 8-bit keys into a bf16 pair tile (K^T with pairs along d), converted exactly: 16 rows at
/// a time into float, rounded to pairs (no rounding happens: every 8-bit value is a bf16),
/// then transposed as 32-bit lanes.
template <quantized_type S, class Io>
void load_rows_transposed(Tile<bf16x2>& dst, const MatrixView<const S>& src, index_t row0,
                          index_t rows, Io& io) {
  const index_t cols = src.cols, pairs = (cols + 1) / 2;
  dst.set_extent(pairs, rows);
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
  constexpr index_t block_rows = 16, block_pairs = 32;
  alignas(64) float values[2 * block_pairs];
  alignas(64) bf16x2 stage[block_rows * block_pairs];
  for (index_t r0 = 0; r0 < rows; r0 += block_rows) {
    const index_t nr = std::min(block_rows, rows - r0);
    for (index_t p0 = 0; p0 < pairs; p0 += block_pairs) {
      const index_t np = std::min(block_pairs, pairs - p0), nc = std::min(2 * np, cols - 2 * p0);
      for (index_t r = 0; r < nr; ++r) {
        const S* in = src.row(row0 + r0 + r);
        if (src.col_stride == 1) arch::native::to_float(in + 2 * p0, values, nc);
        else for (index_t c = 0; c < nc; ++c) values[c] = to_float(in[(2 * p0 + c) * src.col_stride]);
        arch::native::round_to_pairs(values, stage + r * block_pairs, nc);
      }
      arch::native::transpose(nr, np, reinterpret_cast<const float*>(stage), block_pairs,
                              reinterpret_cast<float*>(dst.row(p0) + r0), dst.ld());
    }
  }
}

/// Rows of the B operand of a product that sums over them (V in P V). A float tile is
/// load_rows; a bf16 pair tile interleaves rows 2q and 2q + 1 into its row q (extent
/// ceil(rows / 2) x cols, an odd last row paired with zeros).
template <class S, class Io>
void load_rows_pairwise(Tile<float>& dst, const MatrixView<const S>& src, index_t row0,
                        index_t rows, Io& io) {
  load_rows(dst, src, row0, rows, io);
}

template <class Src, class Io>
  requires std::is_same_v<typename Src::element_type, const bf16>
void load_rows_pairwise(Tile<bf16x2>& dst, const Src& src, index_t row0, index_t rows, Io& io) {
  const index_t cols = src.cols;
  dst.set_extent((rows + 1) / 2, cols);
  for (index_t q = 0; 2 * q < rows; ++q) {
    const index_t r = row0 + 2 * q;
    const bool pair = 2 * q + 1 < rows;
    if (src.col_stride == 1) {
      arch::native::interleave_pairs(src.row(r), pair ? src.row(r + 1) : nullptr, dst.row(q), cols);
    } else {
      for (index_t c = 0; c < cols; ++c) dst(q, c) = {src(r, c), pair ? src(r + 1, c) : bf16{}};
    }
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(bf16));
}

/// 8-bit values into a bf16 pair tile (rows 2q and 2q + 1 interleaved), converted exactly.
template <class Src, class Io>
  requires quantized_type<std::remove_const_t<typename Src::element_type>>
void load_rows_pairwise(Tile<bf16x2>& dst, const Src& src, index_t row0, index_t rows, Io& io) {
  using S = std::remove_const_t<typename Src::element_type>;
  const index_t cols = src.cols;
  dst.set_extent((rows + 1) / 2, cols);
  constexpr index_t block = 256;
  alignas(64) float a[block], b[block];
  for (index_t q = 0; 2 * q < rows; ++q) {
    const index_t r = row0 + 2 * q;
    const bool pair = 2 * q + 1 < rows;
    for (index_t c0 = 0; c0 < cols; c0 += block) {
      const index_t nc = std::min(block, cols - c0);
      for (index_t c = 0; c < nc; ++c) {
        a[c] = to_float(src(r, c0 + c));
        b[c] = pair ? to_float(src(r + 1, c0 + c)) : 0.0f;
      }
      arch::native::interleave_rounded(a, b, dst.row(q) + c0, nc);
    }
  }
  io.read(static_cast<std::uint64_t>(rows * cols) * sizeof(S));
}

/// The loads above from a paged matrix: each page run is a plain matrix loaded into its
/// slice of the tile (rows of a row tile, columns of a transposed one). A bf16 pair tile of
/// V pairs rows across page boundaries, so it reads row by row (load_rows_pairwise above).
template <class D, class S, class Io>
void load_rows(D& dst, const PagedMatrixView<const S>& src, index_t row0, index_t rows, Io& io) {
  const index_t cols = src.cols * values_per_element<S>;  // 4-bit blocks: their values
  dst.set_extent(rows, std::is_same_v<typename D::element_type, bf16x2> ? (cols + 1) / 2 : cols);
  src.for_each_page_run(row0, rows, [&](const MatrixView<const S>& run, index_t at) {
    D part = dst.slice_rows(at, run.rows);
    load_rows(part, run, 0, run.rows, io);
  });
}

/// A gathered source's rows (top-k: scattered, a page run of one row each) are copied a
/// block at a time into a contiguous staging block and transposed from there: one
/// transpose of 16 rows instead of 16 of one row each (1.5x slower on MLA's d 576).
template <class D, class S, class Io>
void load_gathered_transposed(D& dst, const PagedMatrixView<const S>& src, index_t row0, index_t rows, Io& io) {
  constexpr std::size_t stage_bytes = 32768;
  alignas(64) unsigned char stage[stage_bytes];
  const index_t cols = src.cols;
  const index_t block = std::clamp<index_t>(static_cast<index_t>(stage_bytes / (static_cast<std::size_t>(cols) * sizeof(S))), 1, 16);
  S* rows_at = reinterpret_cast<S*>(stage);
  for (index_t r0 = 0; r0 < rows; r0 += block) {
    const index_t n = std::min(block, rows - r0);
    for (index_t r = 0; r < n; ++r) std::copy_n(src.row(row0 + r0 + r), cols, rows_at + r * cols);
    D part = dst.slice_cols(r0, n);
    load_rows_transposed(part, MatrixView<const S>{rows_at, n, cols, cols, 1}, 0, n, io);
  }
}

template <class D, class S, class Io>
void load_rows_transposed(D& dst, const PagedMatrixView<const S>& src, index_t row0, index_t rows,
                          Io& io) {
  const index_t cols = src.cols * values_per_element<S>;  // 4-bit blocks: their values
  dst.set_extent(std::is_same_v<typename D::element_type, bf16x2> ? (cols + 1) / 2 : cols, rows);
  if constexpr (values_per_element<S> == 1)  // (4-bit blocks: per page run, below)
    if (src.gather && src.col_stride == 1) return load_gathered_transposed(dst, src, row0, rows, io);
  src.for_each_page_run(row0, rows, [&](const MatrixView<const S>& run, index_t at) {
    D part = dst.slice_cols(at, run.rows);
    load_rows_transposed(part, run, 0, run.rows, io);
  });
}

template <class S, class Io>
void load_rows_pairwise(Tile<float>& dst, const PagedMatrixView<const S>& src, index_t row0,
                        index_t rows, Io& io) {
  load_rows(dst, src, row0, rows, io);
}

/// dst[r] = &src[row0 + r, 0] for r in [0, rows): K or V rows read in place (src's rows
/// must be contiguous, col_stride 1). Counts the bytes the products will read, once.
template <class Src, class Io>
void load_row_refs(RowRefs<std::remove_const_t<typename Src::element_type>>& dst, const Src& src,
                   index_t row0, index_t rows, Io& io) {
  using S = std::remove_const_t<typename Src::element_type>;
  dst.set_extent(rows, src.cols);
  if constexpr (std::is_same_v<Src, PagedMatrixView<const S>>) {  // one table lookup per page
    src.for_each_page_run(row0, rows, [&](const MatrixView<const S>& run, index_t at) {
      for (index_t r = 0; r < run.rows; ++r) dst.row_ref(at + r) = run.row(r);
    });
  } else {
    for (index_t r = 0; r < rows; ++r) dst.row_ref(r) = src.row(row0 + r);
  }
  io.read(static_cast<std::uint64_t>(rows * src.cols) * sizeof(S));
}

/// dst[r] = the first `cols` elements of key row r of `keys`: V rows read in place where V is
/// K's first columns (MLA's latent). The rows were counted when `keys` was loaded: nothing is.
template <class T>
void value_refs_from_keys(RowRefs<T>& dst, const RowRefs<T>& keys, index_t cols) {
  dst.set_extent(keys.rows(), cols);
  for (index_t r = 0; r < keys.rows(); ++r) dst.row_ref(r) = keys.row(r);
}

/// dst[r] = the scale of key row0 + r, r in [0, rows): an 8-bit K or V tile's scales, one
/// read counted per run of keys that share one (per page for a paged pool).
template <class Io>
void load_scales(float* dst, const ScaleSource& src, index_t row0, index_t rows, Io& io) {
  src.for_each_run(row0, rows, [&](float scale, index_t at, index_t count) {
    std::fill_n(dst + at, count, scale);
    io.read(sizeof(float));
  });
}

/// Brings the rows a RowRefs tile points at into cache in one streaming pass (they were
/// counted when the tile was loaded): the in-place products then read them from cache.
template <class T>
void touch_rows(const RowRefs<T>& tile) {
  arch::native::touch_rows(reinterpret_cast<const void* const*>(tile.data()), tile.rows(),
                           tile.cols() * static_cast<index_t>(sizeof(T)));
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

template <class S>
void prefetch_rows(const PagedMatrixView<const S>& src, index_t row0, index_t rows) {
  src.for_each_page_run(row0, rows, [](const MatrixView<const S>& run, index_t) { prefetch_rows(run, 0, run.rows); });
}

/// dst[row0 + r, :] = src[r, :] for r in [0, src.rows()), rounded once to D's precision
/// (to nearest even) when D is a 16-bit type.
template <class D, class Io>
void store_rows(const MatrixView<D>& dst, index_t row0, const Tile<float>& src, Io& io) {
  const index_t rows = src.rows(), cols = src.cols();
  for (index_t r = 0; r < rows; ++r) {
    const float* in = src.row(r);
    D* out = dst.row(row0 + r);
    if (dst.col_stride != 1) {
      for (index_t c = 0; c < cols; ++c) out[c * dst.col_stride] = from_float<D>(in[c]);
    } else if constexpr (std::is_same_v<D, float>) {
      std::copy_n(in, cols, out);
    } else {
      arch::native::from_float(in, out, cols);
    }
  }
  io.written(static_cast<std::uint64_t>(rows * cols) * sizeof(D));
}

/// dst[i] = src[i * stride] for i in [0, count): per-row statistics such as the saved LSE.
template <class T, class Io>
void load_vector(T* dst, const T* src, index_t stride, index_t count, Io& io) {
  for (index_t i = 0; i < count; ++i) dst[i] = src[i * stride];
  io.read(static_cast<std::uint64_t>(count) * sizeof(T));
}

/// dst[i * stride] = src[i] for i in [0, count): per-row statistics such as the LSE.
template <class T, class Io>
void store_vector(T* dst, index_t stride, const T* src, index_t count, Io& io) {
  for (index_t i = 0; i < count; ++i) dst[i * stride] = src[i];
  io.written(static_cast<std::uint64_t>(count) * sizeof(T));
}

}  // namespace tileattn
