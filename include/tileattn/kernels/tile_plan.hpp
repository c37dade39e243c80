// tileattn/kernels/tile_plan.hpp: the tile planner: query- and key-tile sizes from the SRAM
// budget and head_dim, and the exact working set the forward kernel carves for them.
//
// Rule (docs/design.md). FlashAttention-1, for an SRAM of M floats, gives the tile it keeps
// resident across the inner loop M / (4 d) rows and the tile it streams min(that, d) rows:
//   Bc = ceil(M / (4 d)),  Br = min(Bc, d)      (K/V resident, Q streamed in FA1's order)
// FlashAttention-2 swaps the loops: the query tile stays resident while K/V stream past it,
// so the same rule, mapped to FA2's order, is
//   Br = ceil(M / (4 d)),  Bc = min(Br, d).
// K/V are then read N / Br times instead of N / d times, which is what makes the HBM
// traffic Theta(N^2 d^2 / M) rather than Theta(N^2) (docs/design.md measures both).
// Br counts packed rows: grouped-query attention packs the query heads sharing one K/V
// head into the tile (heads_per_tile x query_tile_rows positions), so each K/V tile is
// loaded once per group. Each extent is clamped to its sequence (one tile when it fits),
// else rounded down to the SIMD granules; then the plan shrinks until the exact working
// set fits the budget: the streamed Bc first (it costs no traffic) down to 64 keys, then
// the positions, then the heads of a group, then Bc down to 1.
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
inline constexpr index_t min_streamed_keys = 64;  // below this the score tile's rows get too short

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
  const index_t br_rule = std::max<index_t>(1, (budget_floats + 4 * head_dim - 1) / (4 * head_dim));
  const index_t bc_rule = std::min(br_rule, head_dim);
  index_t heads = group_size;
  index_t rows = fit_to_sequence(std::max<index_t>(1, br_rule / heads), seqlen_q, query_tile_granule);
  index_t bc = fit_to_sequence(bc_rule, seqlen_k, key_tile_granule);
  while (forward_working_set_bytes(rows * heads, bc, head_dim) > sram_budget_bytes) {
    if (bc > min_streamed_keys) bc = shrink(bc, key_tile_granule);
    else if (rows > 1) rows = shrink(rows, query_tile_granule);
    else if (heads > 1) --heads;
    else if (bc > 1) bc = shrink(bc, key_tile_granule);
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
