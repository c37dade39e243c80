// tileattn/kernels/tile_plan.hpp: the tile planner: how many query positions and query
// heads a tile packs and how many keys it streams, from the SRAM budget, the head dims,
// the sequence lengths, the GQA group and the workers; and the exact working set the
// forward kernel carves for a plan.
//
// Rule (docs/design.md, section 2). A work item keeps a tile of R packed query rows
// (P positions x Hc query heads of one K/V group) resident and streams K/V past it in
// tiles of Bc keys (FlashAttention-2's loop order). Q and O move once whatever the plan;
// K and V move once per work item, and a (sequence, K/V head) has ceil(Nq / P) x
// ceil(G / Hc) items.
//   1. Bc is fixed by the head dims, the operand layout and the micro-kernel set alone
//      (forward_key_tile), never by the SRAM budget: key tiles are where the online
//      softmax rescales, so a budget that changed Bc would change the bits. fp32 and bf16
//      pairs: FlashAttention's streamed-tile rule min(ceil(M / 2(d + dv)), d) for a fixed
//      M of 1 MiB (reference_key_tile_bytes), at least 64 keys (the micro-kernels keep
//      rows of at least 64 scores) and at most 128 (so that d 256's fp32 K^T and V tiles
//      take 256 KiB and budgets of half a core's L2 still hold many rows); bf16
//      panels (AMX): the set's panel (arch::native::product_panel_keys), halved while K^T and
//      V with their packed copies take more than 1.5 MiB (MLA's 576 + 512). A sequence
//      shorter than Bc takes one tile of its keys (the same keys, so the same bits).
//   2. The budget then sets the rows: the most packed rows R that fit beside the Bc-key
//      tiles (budget_error, naming sram_budget_bytes, when not even one does); for each
//      split of the group into equal chunks (Hc = ceil(G / chunks)), P = min(Nq, R / Hc)
//      and items = ceil(Nq / P) x chunks. The fewest items wins; ties go to fewer chunks.
//   3. Query tiles are balanced (P = ceil(Nq / tiles), rounded up to 8 rows where it fits).
//   4. Parallelism: when (batch x heads_kv x chunks x tiles) gives more than one worker
//      fewer than 4 items each, query tiles are split further, down to 64 packed rows. K/V traffic grows by
//      the same factor as the tile count (docs/design.md).
// Results do not depend on P or Hc (key tiles sit at multiples of Bc, and rows never mix),
// so neither the budget nor the worker count changes the bits: on one machine, a budget
// changes only the query tiles.
//
// A call's options reach the planner through forward_tiles (and backward.hpp's
// backward_tiles): the budget (effective_sram_budget), the shape as the planner sees it
// (detail::planned_shape: batch-invariant mode plans for lengths no call has) and the
// workers of the call's execution.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>

#include "tileattn/arch/native.hpp"
#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/tile_lists.hpp"
#include "tileattn/memory/cache_size.hpp"

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
inline constexpr index_t max_streamed_keys = 128; // fp32 and pair key tiles stop here (rule 1)
/// The fixed budget of FlashAttention's key-tile rule (M in Bc = ceil(M / 2(d + dv))): the
/// rule's Bc, never the call's budget, so that the budget never changes Bc (nor the bits).
inline constexpr std::size_t reference_key_tile_bytes = std::size_t{1} << 20;
/// bf16 panels: a panel halves while its K^T and V tiles, with their packed copies, take
/// more than this (MLA's 576 + 512 at AMX's 512 keys: 2.2 MiB; at 256: 1.1 MiB).
inline constexpr std::size_t max_panel_operand_bytes = std::size_t{3} << 19;
/// bf16 panels: the keys of a panel (a key tile, Bc) where the rows fit; 0: the micro-kernel
/// set's choice (arch::native::product_panel_keys). Tests and benchmarks change it.
inline std::atomic<index_t> panel_keys{0};
/// bf16 panels: a wide panel halves down to this many keys (max_panel_operand_bytes). Wide
/// heads need it: MLA's 576 + 512 at AMX's 512-key panels take 2.2 MiB of K^T and V (and
/// their packed copies) alone, more than a Xeon core's 2 MiB L2, and without panels the
/// products leave the AMX tiles for vdpbf16ps. 128: the vdpbf16ps set's own panel, so a set
/// whose panel is 128 never halves.
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

}  // namespace detail

/// Bc for a shape (rule 1 of the file comment): fixed by the head dims, the operand layout,
/// the micro-kernel set (bf16 panels) and a flex block mask's key block (panels no wider),
/// capped at the longest sequence's keys (rounded up to 16 for panels); never by the budget.
inline index_t forward_key_tile(const PlanShape& shape) {
  using namespace detail;
  const index_t d = shape.head_dim, dv = shape.value_dim(), nk = std::max<index_t>(shape.seqlen_k, 1);
  if (shape.operands == TileOperands::bf16_panels) {
    const index_t keys = panel_keys.load(std::memory_order_relaxed);
    index_t panel = keys > 0 ? keys : std::max<index_t>(arch::native::product_panel_keys(), key_tile_granule);
    while (panel / 2 >= min_halved_panel_keys &&
           forward_working_set_bytes(0, panel, d, dv, TileOperands::bf16_panels) > max_panel_operand_bytes)
      panel = panel / 2 / key_tile_granule * key_tile_granule;
    panel = std::min(panel, ceil_div(nk, key_tile_granule) * key_tile_granule);
    if (shape.key_tile_limit > 0) panel = std::min(panel, std::max(shape.key_tile_limit, key_tile_granule));
    return panel;
  }
  const std::size_t element_bytes = pair_operands(shape.operands) ? 2 : sizeof(float);
  const auto elements = static_cast<index_t>(reference_key_tile_bytes / element_bytes);
  const index_t rule = std::min(ceil_div(elements, 2 * (d + dv)), std::min(d, max_streamed_keys));
  return std::min(nk, std::max(rule, min_streamed_keys));
}

/// Plans the forward tiles of `shape` for `workers` threads under an SRAM budget: Bc from
/// forward_key_tile, the rows from the budget; throws budget_error ("sram_budget_bytes")
/// if not even one row fits beside the Bc-key tiles.
inline TilePlan plan_forward_tiles(const PlanShape& shape, std::size_t budget, int workers = 1) {
  using namespace detail;
  const index_t d = shape.head_dim, dv = shape.value_dim();
  const index_t nq = std::max<index_t>(shape.seqlen_q, 1);
  const index_t group = std::max<index_t>(shape.group_size, 1);
  const index_t bc = forward_key_tile(shape);
  const index_t rows = rows_that_fit(bc, d, dv, budget, shape.operands);
  if (rows == 0)
    throw budget_error("sram_budget_bytes",
                       std::to_string(budget) + " bytes cannot hold one query row beside the " + std::to_string(bc) +
                           "-key tiles of head_dim " + std::to_string(d) + " / " + std::to_string(dv) + " (" +
                           std::to_string(forward_working_set_bytes(1, bc, d, dv, shape.operands)) +
                           " bytes needed; the key tile is fixed so that the budget never changes results)");
  const Packing best = best_packing(rows, bc, nq, group);

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
  const index_t packed = positions * best.heads;
  return {positions, bc, best.heads, budget, forward_working_set_bytes(packed, bc, d, dv, shape.operands),
          shape.operands == TileOperands::bf16_panels};
}

/// The SRAM budget a call with these options runs under: the one given, or the per-core
/// cache raised to `least` (the smallest budget the call's shape runs in), so that the
/// default never refuses a shape that a core with a larger cache runs. The key tile does not
/// depend on the budget, so neither do the results.
inline std::size_t effective_sram_budget(const ForwardOptions& options, std::size_t least = 0) {
  return options.sram_budget_bytes ? options.sram_budget_bytes : std::max(per_core_cache_bytes(), least);
}

namespace detail {
/// The smallest budget plan_forward_tiles accepts for `shape`: one query row beside its
/// key tiles (head_dim 576 / 512, MLA's, needs 548 KB: more than a 512 KiB L2).
inline std::size_t least_forward_budget(const PlanShape& shape) {
  return forward_working_set_bytes(1, forward_key_tile(shape), shape.head_dim, shape.value_dim(), shape.operands);
}
}  // namespace detail

namespace detail {
/// The sequence length and stream count the planners see in batch-invariant mode
/// (ForwardOptions::batch_invariant): long enough that no plan is cut to a sequence.
inline constexpr index_t invariant_plan_length = index_t{1} << 20;

/// The shape a planner plans for: the call's, or in batch-invariant mode the call's with
/// its lengths and streams replaced by invariant_plan_length, so that the tiles depend on
/// the head dims, group, element type and budget alone (PlanShape or BackwardShape).
template <class Shape>
Shape planned_shape(Shape shape, const ForwardOptions& options) {
  if (options.batch_invariant) shape.seqlen_q = shape.seqlen_k = shape.kv_streams = invariant_plan_length;
  return shape;
}
}  // namespace detail

/// The tiles forward() chooses for a call of this shape with these options (the budget,
/// and the thread count, which may split query tiles so that every worker has work): the
/// planner itself, for inspection (plan_forward makes the plan a call reuses).
inline TilePlan forward_tiles(const PlanShape& shape, const ForwardOptions& options = {}) {
  const PlanShape planned = detail::planned_shape(shape, options);
  return plan_forward_tiles(planned, effective_sram_budget(options, detail::least_forward_budget(planned)),
                            worker_count(options.execution));
}

}  // namespace tileattn
