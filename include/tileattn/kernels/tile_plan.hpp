// tileattn/kernels/tile_plan.hpp: the tile planner: how many query positions and query
// heads a tile packs and how many keys it streams, from the SRAM budget, the head dims,
// the sequence lengths, the GQA group and the workers; and the exact working set the
// forward kernel carves for a plan.
//
// Rule (docs/design.md, section 2). A work item keeps a tile of R packed query rows
// (P positions x Hc query heads of one K/V group) resident and streams K/V past it in
// tiles of Bc keys (FlashAttention-2's loop order). Q and O move once whatever the plan;
// K and V move once per work item, and a (sequence, K/V head) has ceil(Nq / P) x
// ceil(G / Hc) items. So the planner picks, among the plans whose working set fits the
// budget, the one with the fewest items per (sequence, K/V head):
//   1. Bc candidates: FlashAttention's streamed-tile rule Bc = min(ceil(M / 2(d + dv)), d)
//      (M: the budget in floats) and every multiple of 16 between it and min(64, Nk) (down
//      to the rule where the rule is below 64: d < 64 or a small budget), so the
//      micro-kernels keep rows of at least 64 scores. Only when not even a 64-key tile
//      fits, every Bc below (multiples of 16, and 1).
//   2. For each Bc, the rows that fit, R; for each split of the group into equal chunks
//      (Hc = ceil(G / chunks)), P = min(Nq, R / Hc) and items = ceil(Nq / P) x chunks.
//   3. The fewest items wins; ties go to the larger Bc, then to fewer chunks.
//   4. Query tiles are balanced (P = ceil(Nq / tiles), rounded up to 8 rows where it fits).
//   5. Parallelism: when (batch x heads_kv x chunks x tiles) gives more than one worker
//      fewer than 4 items each, query tiles are split further, down to 64 packed rows. K/V traffic grows by
//      the same factor as the tile count (docs/design.md).
// Results do not depend on P or Hc (key tiles sit at multiples of Bc, and rows never mix),
// so splitting for the worker count keeps every thread count bitwise identical.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/tile_lists.hpp"

namespace tileattn {

struct TilePlan {
  index_t query_tile_rows = 0;  // query positions per tile (P)
  index_t key_tile_rows = 0;    // Bc in the FlashAttention papers
  index_t heads_per_tile = 1;   // query heads of one K/V group packed into a tile (Hc)
  std::size_t sram_budget_bytes = 0;
  std::size_t working_set_bytes = 0;
  bool panels = false;          // planned for TileOperands::bf16_panels

  /// Rows of the packed query, score and output tiles (Br).
  index_t packed_rows() const { return query_tile_rows * heads_per_tile; }
  index_t query_tiles(index_t seqlen_q) const {
    return (seqlen_q + query_tile_rows - 1) / query_tile_rows;
  }
  index_t head_chunks(index_t group_size) const {
    return (group_size + heads_per_tile - 1) / heads_per_tile;
  }
};

/// How the kernel holds its operand tiles: float, or bf16 pairs (the bf16 dot-product
/// micro-kernels': Q, K^T, V and P in 2 bytes per value, plus a bf16 copy of P), or bf16
/// pairs in panels (where the micro-kernel set multiplies prepared operands a slab of rows
/// at a time, arch/prepared_pairs.hpp: AMX): key tiles (panels) of up to
/// detail::panel_keys keys, K^T and V also held as the products read them, and S and P for
/// one slab of at most max_slab_rows rows instead of all Br.
enum class TileOperands { fp32, bf16_pairs, bf16_panels };

/// Whether the operands are bf16 pairs (in panels or not).
constexpr bool pair_operands(TileOperands o) { return o != TileOperands::fp32; }

/// What the planner needs to know of a call.
struct PlanShape {
  index_t head_dim = 0;    // Q and K
  index_t head_dim_v = 0;  // V and O (0: head_dim)
  index_t seqlen_q = 0;    // the longest sequence for variable-length batches
  index_t seqlen_k = 0;
  index_t group_size = 1;  // query heads per K/V head
  index_t kv_streams = 1;  // independent (sequence, K/V head) pairs: batch x heads_kv
  TileOperands operands = TileOperands::fp32;
  index_t key_tile_limit = 0;  // panels no wider (a flex block mask's key block, whose empty
                               // blocks the key loop skips tile by tile); 0: none

  index_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool operator==(const PlanShape&) const = default;
};

namespace detail {
inline constexpr index_t key_tile_granule = 16;   // one AVX-512 vector of fp32 scores
inline constexpr index_t query_tile_granule = 8;  // rows of the micro-kernels' register block
inline constexpr index_t min_streamed_keys = 64;  // shorter score rows slow the micro-kernels
inline constexpr index_t items_per_worker = 4;    // enough to even out unequal items
inline constexpr index_t min_split_rows = 64;     // splitting for parallelism stops here
/// bf16 panels: the keys of a panel (a key tile, Bc) where the rows fit; 0: the micro-kernel
/// set's choice (arch::native::product_panel_keys). Tests and benchmarks change it.
inline std::atomic<index_t> panel_keys{0};
/// bf16 panels: rows a panel needs at least, else the planner falls back to the search below.
inline constexpr index_t min_panel_rows = 256;
/// bf16 panels: a panel whose rows do not fit halves down to this many keys before the
/// planner gives panels up. Wide heads need it: MLA's 576 + 512 at AMX's 512-key panels take
/// 2.2 MiB of K^T and V (and their packed copies) alone, more than a Xeon core's 2 MiB L2, and
/// without panels the products leave the AMX tiles for vdpbf16ps; 256 keys fit 128 heads'
/// rows. 128: the vdpbf16ps set's own panel, so a set whose panel is 128 never halves.
inline constexpr index_t min_halved_panel_keys = 128;
}  // namespace detail

/// Bytes the forward kernel carves for br packed query rows and bc keys: Q (br x d),
/// O (br x dv), K^T (d x bc), V (bc x dv), S (br x bc), and three per-row vectors (max,
/// sum, lse); with bf16 pair operands Q, K^T and V take half the bytes (pairs along d for
/// Q and K^T, along keys for V) and P adds a bf16 copy of S (br x bc); in panels S and P
/// hold one slab of rows, and K^T and V a second time as packed copies. Counted from the
/// kernel's own tile list (kernels::ForwardTiles).
constexpr std::size_t forward_working_set_bytes(index_t br, index_t bc, index_t head_dim,
                                                index_t head_dim_v,
                                                TileOperands operands = TileOperands::fp32) {
  return pair_operands(operands)
             ? kernels::ForwardTiles<bf16x2>::footprint(br, bc, head_dim, head_dim_v,
                                                         operands == TileOperands::bf16_panels)
             : kernels::ForwardTiles<float>::footprint(br, bc, head_dim, head_dim_v);
}

/// The same with V and O as wide as Q and K.
constexpr std::size_t forward_working_set_bytes(index_t br, index_t bc, index_t head_dim) {
  return forward_working_set_bytes(br, bc, head_dim, head_dim);
}

namespace detail {

/// The most packed rows whose working set with bc keys fits the budget (0: none).
constexpr index_t rows_that_fit(index_t bc, index_t d, index_t dv, std::size_t budget,
                                TileOperands operands = TileOperands::fp32) {
  const std::size_t fixed = forward_working_set_bytes(0, bc, d, dv, operands);  // K^T and V
  if (forward_working_set_bytes(1, bc, d, dv, operands) > budget) return 0;
  using F = Tile<float>;
  using P = Tile<bf16x2>;
  const auto float_lds = static_cast<std::size_t>(F::leading_dim(dv) + F::leading_dim(bc) + 3);  // + max, sum, lse
  const bool panels = operands == TileOperands::bf16_panels;  // S and P: one slab, in `fixed`
  const auto operand_bytes = pair_operands(operands)
      ? static_cast<std::size_t>(P::leading_dim((d + 1) / 2) + (panels ? 0 : P::leading_dim((bc + 1) / 2))) *
            sizeof(bf16x2)
      : static_cast<std::size_t>(F::leading_dim(d)) * sizeof(float);
  const auto score_lds = static_cast<std::size_t>(panels ? F::leading_dim(bc) : 0);  // S in `fixed` too
  const std::size_t per_row = (float_lds - score_lds) * sizeof(float) + operand_bytes;
  const std::size_t slab = panels ? forward_working_set_bytes(kernels::max_slab_rows, bc, d, dv, operands) : 0;
  auto rows = panels && budget >= slab  // a lower bound per row: at most a few rows too many
                  ? kernels::max_slab_rows + static_cast<index_t>((budget - slab) / per_row)
                  : static_cast<index_t>((budget - fixed) / per_row);
  while (forward_working_set_bytes(rows, bc, d, dv, operands) > budget) --rows;  // vectors round to lines
  return rows;
}

struct Packing {
  index_t items = 0;  // work items per (sequence, K/V head); 0: nothing fits
  index_t heads = 0, positions = 0, query_tiles = 0, bc = 0;
};

/// The packing of `rows` rows that needs the fewest items, chunks of equal size first.
constexpr Packing best_packing(index_t rows, index_t bc, index_t nq, index_t group) {
  Packing best;
  for (index_t chunks = 1; chunks <= group; ++chunks) {
    const index_t heads = ceil_div(group, chunks);
    if (heads > rows || ceil_div(group, heads) != chunks) continue;  // one try per chunk size
    const index_t positions = std::min(nq, rows / heads);
    const index_t tiles = ceil_div(nq, positions);
    if (best.items == 0 || tiles * chunks < best.items)
      best = {tiles * chunks, heads, positions, tiles, bc};
  }
  return best;
}

/// The best packing over key tiles hi, the multiples of 16 below it, and lo (Bc strictly
/// between two of them needs a wider K^T row than the multiple below, for no gain).
constexpr Packing search_key_tiles(index_t hi, index_t lo, const PlanShape& s, index_t nq,
                                   std::size_t budget) {
  Packing best;
  if (hi < lo) return best;
  const auto consider = [&](index_t bc) {
    const index_t rows = rows_that_fit(bc, s.head_dim, s.value_dim(), budget, s.operands);
    if (rows == 0) return;
    const Packing p = best_packing(rows, bc, nq, s.group_size);
    if (best.items == 0 || p.items < best.items) best = p;  // ties keep the larger Bc
  };
  consider(hi);
  for (index_t bc = (hi - 1) / key_tile_granule * key_tile_granule; bc > lo; bc -= key_tile_granule)
    consider(bc);
  if (lo < hi) consider(lo);
  return best;
}

}  // namespace detail

/// Plans the forward tiles of `shape` for `workers` threads under an SRAM budget; throws
/// budget_error ("sram_budget_bytes") if not even one row and one key fit.
inline TilePlan plan_forward_tiles(const PlanShape& shape, std::size_t budget, int workers = 1) {
  using namespace detail;
  const index_t d = shape.head_dim, dv = shape.value_dim();
  const index_t nq = std::max<index_t>(shape.seqlen_q, 1), nk = std::max<index_t>(shape.seqlen_k, 1);
  const std::size_t element_bytes = pair_operands(shape.operands) ? 2 : sizeof(float);
  const auto elements = static_cast<index_t>(budget / element_bytes);  // M in the rule
  const index_t bc_rule = std::min(std::max<index_t>(1, ceil_div(elements, 2 * (d + dv))), d);
  const index_t fast = std::min(nk, min_streamed_keys);
  PlanShape s = shape;
  s.group_size = std::max<index_t>(shape.group_size, 1);
  Packing best;
  if (shape.operands == TileOperands::bf16_panels) {  // one panel of up to panel_keys keys where it fits
    const index_t keys = panel_keys.load(std::memory_order_relaxed);
    index_t panel = std::min(keys > 0 ? keys : std::max<index_t>(arch::native::product_panel_keys(), key_tile_granule),
                             ceil_div(nk, key_tile_granule) * key_tile_granule);
    if (shape.key_tile_limit > 0) panel = std::min(panel, std::max(shape.key_tile_limit, key_tile_granule));
    const index_t wanted_rows = std::min(nq * s.group_size, min_panel_rows);
    index_t rows = rows_that_fit(panel, d, dv, budget, shape.operands);
    while (rows < wanted_rows && panel / 2 >= min_halved_panel_keys) {  // wide heads: a narrower panel first
      panel = panel / 2 / key_tile_granule * key_tile_granule;
      rows = rows_that_fit(panel, d, dv, budget, shape.operands);
    }
    if (rows >= wanted_rows) best = best_packing(rows, panel, nq, s.group_size);
    else s.operands = TileOperands::bf16_pairs;  // a small budget: pairs without panels (no packed copies)
  }
  if (best.items == 0)
    best = rows_that_fit(fast, d, dv, budget, s.operands) > 0
               ? search_key_tiles(std::max(fast, std::min(nk, bc_rule)), std::min(fast, bc_rule), s, nq, budget)
               : search_key_tiles(fast - 1, 1, s, nq, budget);  // empty when fast == 1
  if (best.items == 0)
    throw budget_error("sram_budget_bytes",
                       std::to_string(budget) + " bytes cannot hold even 1 x 1 tiles at head_dim " +
                           std::to_string(d) + " (" +
                           std::to_string(forward_working_set_bytes(1, 1, d, dv, s.operands)) + " bytes needed)");

  index_t tiles = best.query_tiles;
  const index_t streams = std::max<index_t>(shape.kv_streams, 1) * (best.items / best.query_tiles);
  const index_t wanted = items_per_worker * std::max(workers, 1);
  if (workers > 1 && streams * tiles < wanted) {  // split query tiles, not below 64 rows
    const index_t floor_positions = std::min(nq, ceil_div(min_split_rows, best.heads));
    tiles = std::max(tiles, std::min(ceil_div(wanted, streams), ceil_div(nq, floor_positions)));
  }
  index_t positions = ceil_div(nq, tiles);  // balanced tiles
  const index_t rounded = ceil_div(positions, query_tile_granule) * query_tile_granule;
  if (rounded < nq && rounded <= best.positions) positions = rounded;
  const index_t rows = positions * best.heads;
  return {positions, best.bc, best.heads, budget, forward_working_set_bytes(rows, best.bc, d, dv, s.operands),
          s.operands == TileOperands::bf16_panels};
}

}  // namespace tileattn
