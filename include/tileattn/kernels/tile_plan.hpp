// tileattn/kernels/tile_plan.hpp: the tile planner: query- and key-tile sizes from the SRAM
// budget and head_dim, and the exact working set the forward kernel carves for them.
//
// Rule (docs/design.md): start from FlashAttention-1's choice for an SRAM of M floats,
//   Bc = ceil(M / (4 d)),  Br = min(Bc, d),
// clamp each to its sequence length (one tile when it fits), else round down to the SIMD
// granules below, then shrink
// (Bc first, while it is the larger) until the exact working set fits the budget.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn {

struct TilePlan {
  index_t query_tile_rows = 0;  // Br in the FlashAttention papers
  index_t key_tile_rows = 0;    // Bc in the FlashAttention papers
  std::size_t sram_budget_bytes = 0;
  std::size_t working_set_bytes = 0;

  index_t query_tiles(index_t seqlen_q) const {
    return (seqlen_q + query_tile_rows - 1) / query_tile_rows;
  }
};

namespace detail {
inline constexpr index_t key_tile_granule = 16;   // one AVX-512 vector of fp32 scores
inline constexpr index_t query_tile_granule = 8;  // rows of the micro-kernels' register block

constexpr index_t round_down_to(index_t value, index_t granule) {
  return value >= granule ? value / granule * granule : value;
}

/// min(rule, seqlen) rounded down to the granule, unless one tile then covers the sequence.
constexpr index_t fit_to_sequence(index_t rule, index_t seqlen, index_t granule) {
  return rule >= seqlen ? seqlen : round_down_to(rule, granule);
}
}  // namespace detail

/// Bytes the forward kernel carves for a Br x Bc plan: Q, O (Br x d), K^T (d x Bc),
/// V (Bc x d), S (Br x Bc), and three per-row vectors (max, sum, lse).
constexpr std::size_t forward_working_set_bytes(index_t br, index_t bc, index_t head_dim) {
  using FloatTile = Tile<float>;
  return 2 * FloatTile::footprint(br, head_dim) + FloatTile::footprint(head_dim, bc) +
         FloatTile::footprint(bc, head_dim) + FloatTile::footprint(br, bc) +
         3 * TileVector<float>::footprint(br);
}

/// Plans the forward tiles; throws budget_error ("sram_budget_bytes") if not even a
/// 1 x 1 tile pair fits.
inline TilePlan plan_forward_tiles(index_t head_dim, index_t seqlen_q, index_t seqlen_k,
                                   std::size_t sram_budget_bytes) {
  const index_t budget_floats = static_cast<index_t>(sram_budget_bytes / sizeof(float));
  index_t bc = std::max<index_t>(1, (budget_floats + 4 * head_dim - 1) / (4 * head_dim));
  index_t br = std::min(bc, head_dim);
  bc = detail::fit_to_sequence(bc, seqlen_k, detail::key_tile_granule);
  br = detail::fit_to_sequence(br, seqlen_q, detail::query_tile_granule);
  while (forward_working_set_bytes(br, bc, head_dim) > sram_budget_bytes) {
    if (bc > 1 && bc >= br) {
      bc = bc > detail::key_tile_granule ? bc - detail::key_tile_granule : bc - 1;
    } else if (br > 1) {
      br = br > detail::query_tile_granule ? br - detail::query_tile_granule : br - 1;
    } else {
      throw budget_error("sram_budget_bytes",
                         std::to_string(sram_budget_bytes) + " bytes cannot hold even 1 x 1 " +
                             "tiles at head_dim " + std::to_string(head_dim) + " (" +
                             std::to_string(forward_working_set_bytes(1, 1, head_dim)) +
                             " bytes needed)");
    }
  }
  return {br, bc, sram_budget_bytes, forward_working_set_bytes(br, bc, head_dim)};
}

}  // namespace tileattn
