// tileattn/kernels/tile_plan.hpp: the tile planner: query- and key-tile sizes from the SRAM
// budget and head_dim, and the exact working set the forward kernel carves for them.
//
// Rule (docs/design.md): start from FlashAttention-1's choice for an SRAM of M floats,
//   Bc = ceil(M / (4 d)),  Br = min(Bc, d),
// where Br counts packed query rows: with grouped-query attention a tile holds
// heads_per_tile query heads (those sharing one K/V head) x query_tile_rows positions, so
// K/V tiles are loaded once per group. Each extent is clamped to its sequence length (one
// tile when it fits), else rounded down to the SIMD granules below; then the plan shrinks
// (Bc first while it is the larger, then positions, then heads) until the exact working
// set fits the budget.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn {

struct TilePlan {
  index_t query_tile_rows = 0;  // query positions per tile (Br without GQA packing)
  index_t key_tile_rows = 0;    // Bc in the FlashAttention papers
  index_t heads_per_tile = 1;   // query heads of one K/V group packed into a tile
  std::size_t sram_budget_bytes = 0;
  std::size_t working_set_bytes = 0;

  /// Rows of the packed query, score and output tiles.
  index_t packed_rows() const { return query_tile_rows * heads_per_tile; }
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
  return rule >= seqlen ? std::max<index_t>(seqlen, 1) : round_down_to(rule, granule);
}

constexpr index_t shrink(index_t value, index_t granule) {
  return value > granule ? round_down_to(value - 1, granule) : value - 1;
}
}  // namespace detail

/// Bytes the forward kernel carves for br packed query rows and bc keys: Q, O (br x d),
/// K^T (d x bc), V (bc x d), S (br x bc), and three per-row vectors (max, sum, lse).
constexpr std::size_t forward_working_set_bytes(index_t br, index_t bc, index_t head_dim) {
  using FloatTile = Tile<float>;
  return 2 * FloatTile::footprint(br, head_dim) + FloatTile::footprint(head_dim, bc) +
         FloatTile::footprint(bc, head_dim) + FloatTile::footprint(br, bc) +
         3 * TileVector<float>::footprint(br);
}

/// Plans the forward tiles for query heads in groups of `group_size` sharing a K/V head;
/// throws budget_error ("sram_budget_bytes") if not even one row and one key fit.
inline TilePlan plan_forward_tiles(index_t head_dim, index_t seqlen_q, index_t seqlen_k,
                                   std::size_t sram_budget_bytes, index_t group_size = 1) {
  using namespace detail;
  const index_t budget_floats = static_cast<index_t>(sram_budget_bytes / sizeof(float));
  const index_t bc_rule = std::max<index_t>(1, (budget_floats + 4 * head_dim - 1) / (4 * head_dim));
  const index_t br_rule = std::min(bc_rule, head_dim);
  index_t heads = std::min(group_size, br_rule);
  index_t bc = fit_to_sequence(bc_rule, seqlen_k, key_tile_granule);
  index_t rows = fit_to_sequence(std::max<index_t>(1, br_rule / heads), seqlen_q, query_tile_granule);
  while (forward_working_set_bytes(rows * heads, bc, head_dim) > sram_budget_bytes) {
    if (bc > 1 && bc >= rows * heads) bc = shrink(bc, key_tile_granule);
    else if (rows > 1) rows = shrink(rows, query_tile_granule);
    else if (heads > 1) --heads;
    else
      throw budget_error("sram_budget_bytes",
                         std::to_string(sram_budget_bytes) + " bytes cannot hold even 1 x 1 " +
                             "tiles at head_dim " + std::to_string(head_dim) + " (" +
                             std::to_string(forward_working_set_bytes(1, 1, head_dim)) +
                             " bytes needed)");
  }
  return {rows, bc, heads, sram_budget_bytes, forward_working_set_bytes(rows * heads, bc, head_dim)};
}

}  // namespace tileattn
