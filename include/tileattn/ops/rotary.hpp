// tileattn/ops/rotary.hpp: the arithmetic of rotary position embedding (RoPE,
// core/params.hpp's RotaryOptions): rotate_row turns one row at one position, round_through
// rounds a rotated row to its storage type, and load_rows_rotated is tile IO's load_rows of Q
// with each row rotated at its position on the way into the tile (forward.hpp's kernels call
// it; cache_write.hpp rotates K with rotate_row as it writes it).
//
// A pair (x1, x2) becomes (x1 cos - x2 sin, x1 sin + x2 cos), computed in double (the float
// products are exact there, so fused multiply-adds cannot change a bit) and rounded once to
// float, then once to the storage type: the fused paths and apply_rotary (cache_write.hpp)
// give the same bits for the same row and position.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/tile_io.hpp"

namespace tileattn::ops {

/// row[0, rotary_dim) rotated at `position` (a row of the tables; checked by the caller):
/// pairs (row[c], row[c + rotary_dim / 2]), or (row[2c], row[2c + 1]) when interleaved.
inline void rotate_row(const RotaryOptions& r, float* row, index_t position) {
  const index_t half = r.cos.shape[1];
  const index_t step = r.interleaved ? 2 : 1, partner = r.interleaved ? 1 : half;
  for (index_t c = 0; c < half; ++c) {
    float& a = row[c * step];
    float& b = row[c * step + partner];
    const double cs = r.cos(position, c), sn = r.sin(position, c), x1 = a, x2 = b;
    a = static_cast<float>(x1 * cs - x2 * sn);
    b = static_cast<float>(x1 * sn + x2 * cs);
  }
}

/// x[0, n) rounded to T (to nearest even, as tile IO stores it) and back: the values a
/// rotated row holds once stored as T. Nothing changes for float.
template <class T>
void round_through(float* x, index_t n) {
  if constexpr (!std::is_same_v<T, float>) {
    constexpr index_t block = 64;
    T stage[block];
    for (index_t c0 = 0; c0 < n; c0 += block) {
      const index_t nc = std::min(block, n - c0);
      arch::native::from_float(x + c0, stage, nc);
      arch::native::to_float(stage, x + c0, nc);
    }
  }
}

/// The bytes of the tables one rotated row reads (rotary_dim / 2 entries of cos and sin).
inline std::uint64_t table_bytes(const RotaryOptions& r) {
  return static_cast<std::uint64_t>(r.rotary_dim()) * sizeof(float);
}

/// load_rows (memory/tile_io.hpp) with row r rotated at position0 + r and rounded to the
/// storage type S: what load_rows would load had the rows been rotated in S beforehand. The
/// tables' entries it reads are counted with the rows.
template <class S, class Io>
void load_rows_rotated(Tile<float>& dst, const MatrixView<const S>& src, index_t row0, index_t rows,
                       const RotaryOptions& rotary, index_t position0, Io& io) {
  load_rows(dst, src, row0, rows, io);
  for (index_t r = 0; r < rows; ++r) {
    rotate_row(rotary, dst.row(r), position0 + r);
    round_through<S>(dst.row(r), rotary.rotary_dim());
  }
  io.read(static_cast<std::uint64_t>(rows) * table_bytes(rotary));
}

/// The same into a bf16 pair tile (pairs along the columns, an odd last column paired with a
/// zero, as load_rows packs it): each row rotated in float, then rounded to bf16.
template <class Io>
void load_rows_rotated(Tile<bf16x2>& dst, const MatrixView<const bf16>& src, index_t row0, index_t rows,
                       const RotaryOptions& rotary, index_t position0, Io& io) {
  const index_t cols = src.cols;
  alignas(64) float x[max_head_dim];  // one row (Q's head_dim is at most max_head_dim)
  Tile<float> row = Tile<float>::wrap(x, 1, cols, Tile<float>::leading_dim(cols));
  dst.set_extent(rows, (cols + 1) / 2);
  for (index_t r = 0; r < rows; ++r) {
    load_rows(row, src, row0 + r, 1, io);
    rotate_row(rotary, x, position0 + r);
    auto* out = reinterpret_cast<bf16*>(dst.row(r));
    arch::native::from_float(x, out, cols);
    if (cols % 2) out[cols] = bf16{};
  }
  io.read(static_cast<std::uint64_t>(rows) * table_bytes(rotary));
}

}  // namespace tileattn::ops
