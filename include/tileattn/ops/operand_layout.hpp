// tileattn/ops/operand_layout.hpp: SRAM-to-SRAM changes of an operand tile's layout, for
// kernels whose products need one tile in several roles (the backward uses Q, dO and K
// both as A operands, pairs along their columns, and as B operands summed over their
// rows, pairs of rows; and P, dS, transposed or not, as A operands of bf16 products).
//
// A float tile serves every role as it is. A bf16 pair tile (bf16x2, core/half_types.hpp)
// is an A operand with pairs along the columns (tile_io's load_rows), and a B operand of a
// product summed over its rows with pairs of rows interleaved (load_rows_pairwise).
// values_from_keys makes a V tile from a K^T tile whose keys' first columns are the values
// (MLA's latent: load once, pack twice). These move no HBM data: nothing is counted.
#pragma once

#include <algorithm>
#include <cassert>
#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn::ops {

/// dst (rows x ceil(cols / 2) pairs) = src rounded to bf16, pairs along the columns (an odd
/// last column paired with a zero): a float result (P, dS) as an A operand.
inline void round_to_pairs(Tile<bf16x2>& dst, const Tile<float>& src) {
  dst.set_extent(src.rows(), (src.cols() + 1) / 2);
  for (index_t r = 0; r < src.rows(); ++r) arch::native::round_to_pairs(src.row(r), dst.row(r), src.cols());
}

/// dst (ceil(rows / 2) x values) = the rows of an A-layout pair tile src (rows x
/// ceil(values / 2) pairs, `values` bf16 per row) interleaved two by two: row q holds
/// (src[2q][c], src[2q + 1][c]) for every value c, an odd last row paired with zeros.
inline void pair_rows(Tile<bf16x2>& dst, const Tile<bf16x2>& src, index_t values) {
  dst.set_extent((src.rows() + 1) / 2, values);
  for (index_t q = 0; 2 * q < src.rows(); ++q) {
    const auto* a = reinterpret_cast<const bf16*>(src.row(2 * q));
    const auto* b = 2 * q + 1 < src.rows() ? reinterpret_cast<const bf16*>(src.row(2 * q + 1)) : nullptr;
    arch::native::interleave_pairs(a, b, dst.row(q), values);
  }
}

/// dst = src^T for a pair tile: pairs move as 32-bit lanes, so an A-layout tile of K rows
/// (keys x pairs along d) becomes K^T with pairs along d (the B operand of Q K^T).
inline void transpose(Tile<bf16x2>& dst, const Tile<bf16x2>& src) {
  dst.set_extent(src.cols(), src.rows());
  arch::native::transpose(src.rows(), src.cols(), reinterpret_cast<const float*>(src.data()), src.ld(),
                          reinterpret_cast<float*>(dst.data()), dst.ld());
}

/// dst (ceil(rows / 2) x cols) = the rows of float tile src rounded to bf16 and interleaved
/// two by two (an odd last row paired with zeros): P or dS as the transposed A operand of
/// P^T dO or dS^T Q, pairs along the query rows those products sum over.
inline void pair_rows(Tile<bf16x2>& dst, const Tile<float>& src) {
  dst.set_extent((src.rows() + 1) / 2, src.cols());
  for (index_t q = 0; 2 * q < src.rows(); ++q)
    arch::native::interleave_rounded(src.row(2 * q), 2 * q + 1 < src.rows() ? src.row(2 * q + 1) : nullptr,
                                     dst.row(q), src.cols());
}

/// dst (keys x values) = the first `values` rows of float K^T tile src (d x keys)
/// transposed: the V tile of keys whose values are their keys' first columns (MLA's
/// latent, kernels/forward.hpp), made from the K^T tile already in SRAM.
inline void values_from_keys(Tile<float>& dst, const Tile<float>& src, index_t values) {
  assert(values <= src.rows());
  dst.set_extent(src.cols(), values);
  arch::native::transpose(values, src.cols(), src.data(), src.ld(), dst.data(), dst.ld());
}

/// The same for pair tiles: src is K^T with pairs along d ((d + 1) / 2 x keys), dst V with
/// pairs of keys (ceil(keys / 2) x values), the bits load_rows_pairwise gives from the
/// keys' rows. Sixteen keys at a time, src's pairs go back to key rows as 32-bit lanes (a
/// staging block of at most 16 x max_head_dim / 2 pairs, in L1) and are interleaved two by two.
inline void values_from_keys(Tile<bf16x2>& dst, const Tile<bf16x2>& src, index_t values) {
  constexpr index_t block_keys = 16;  // even: a pair of keys never straddles two blocks
  const index_t keys = src.cols(), pairs = (values + 1) / 2, stage_ld = (pairs + 15) / 16 * 16;
  assert(pairs <= src.rows() && stage_ld <= max_head_dim / 2);
  dst.set_extent((keys + 1) / 2, values);
  alignas(64) bf16x2 stage[block_keys * (max_head_dim / 2)];
  for (index_t k0 = 0; k0 < keys; k0 += block_keys) {
    const index_t n = std::min(block_keys, keys - k0);
    arch::native::transpose(pairs, n, reinterpret_cast<const float*>(src.data() + k0), src.ld(),
                            reinterpret_cast<float*>(stage), stage_ld);   // (n, pairs): the keys' rows
    for (index_t q = 0; 2 * q < n; ++q) {
      const auto* a = reinterpret_cast<const bf16*>(stage + 2 * q * stage_ld);
      const auto* b = 2 * q + 1 < n ? reinterpret_cast<const bf16*>(stage + (2 * q + 1) * stage_ld) : nullptr;
      arch::native::interleave_pairs(a, b, dst.row(k0 / 2 + q), values);
    }
  }
}

/// The transposed A operand (for matmul_accumulate_tn) of Op type that holds float tile
/// `f`: f itself, or f's rows paired and rounded in `scratch`.
template <class Op>
const Tile<Op>& as_transposed_operand(const Tile<float>& f, Tile<Op>& scratch) {
  if constexpr (std::is_same_v<Op, float>) {
    return f;
  } else {
    pair_rows(scratch, f);
    return scratch;
  }
}

/// The operand of Op type that holds float tile `f`: f itself, or f rounded to pairs in `scratch`.
template <class Op>
const Tile<Op>& as_operand(const Tile<float>& f, Tile<Op>& scratch) {
  if constexpr (std::is_same_v<Op, float>) {
    return f;
  } else {
    round_to_pairs(scratch, f);
    return scratch;
  }
}

}  // namespace tileattn::ops
