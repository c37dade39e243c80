// tileattn/kernels/backward_plan.hpp: the backward's tile planner: how many keys a work item
// keeps resident (Bc) and how many query rows it streams past them at a time (Br), and the
// exact working set the backward kernel carves for a plan.
//
// Rule (docs/backward.md). A work item owns one key tile of one (sequence, K/V head): it
// keeps K, K^T, V^T and the dK, dV accumulators resident and streams every query tile that
// sees those keys past them (FlashAttention-2's backward loop order). Per work item it
// reads Q, dO, LSE, D and read-modify-writes the dQ accumulator once per query tile, so
// the HBM traffic is (number of key tiles) x (Q, dO and dQ traffic): the planner takes the
// largest Bc that fits (up to 256), with Br = 64 query rows (fewer only when the budget or
// the sequence is smaller). Measured on the 2-core Zen 5 (docs/backward.md): Bc 256 runs
// 5% faster than 128 and 15% faster than 64; Br 64 beats 32 by 7% and 128 by 2-4%. When the key tiles give
// fewer than 4 items per worker, Bc halves (down to 32) so that every worker has work.
// Results do not depend on Br, Bc or the worker count (docs/backward.md, determinism).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "tileattn/core/error.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/tile_plan.hpp"

namespace tileattn {

namespace kernels {
/// Values a bf16 pair product sums in one rounding group: AMX's tdpbf16ps adds 16 pairs (32
/// values) of its inner dimension per instruction and does not round as a sequence of fp32
/// additions would, so a sum gives the same bits however a tiling splits it only when every
/// split falls on a multiple of this, counted from the same origin.
inline constexpr index_t sum_group_values = 32;
}  // namespace kernels

struct BackwardTilePlan {
  index_t query_tile_rows = 0;  // Br: query rows streamed per step
  index_t key_tile_rows = 0;    // Bc: keys resident per work item
  std::size_t sram_budget_bytes = 0;
  std::size_t working_set_bytes = 0;

  index_t key_tiles(index_t seqlen_k) const { return (seqlen_k + key_tile_rows - 1) / key_tile_rows; }
  index_t query_tiles(index_t seqlen_q) const {
    return (seqlen_q + query_tile_rows - 1) / query_tile_rows;
  }
};

/// What the backward planner needs to know of a call.
struct BackwardShape {
  index_t head_dim = 0;    // Q and K
  index_t head_dim_v = 0;  // V, O and dO (0: head_dim)
  index_t seqlen_q = 0;    // the longest sequence for variable-length batches
  index_t seqlen_k = 0;
  index_t kv_streams = 1;  // independent (sequence, K/V head) pairs: batch x heads_kv
  bool softcap = false;    // the modified score's slope (softcap, a score_mod) takes a tile of its own
  TileOperands operands = TileOperands::fp32;

  index_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool operator==(const BackwardShape&) const = default;
};

/// Bytes the backward kernel carves for br query rows and bc keys (kernels/backward.hpp,
/// BackwardTiles): resident K (bc x d), K^T (d x bc), V^T (dv x bc) and the dK, dV
/// accumulators (bc x d, bc x dv); streamed Q (br x d), dO (br x dv), S/P and dP/dS
/// (br x bc each), the softcap's slope (br x bc, only with softcap) and three per-row vectors
/// (P's shift in two parts, D). With bf16 pair operands, K, Q and dO are held twice (pairs along their
/// columns for one product, pairs of rows for another), V once more as rows, and P / dS
/// once more with rows paired and dS with columns paired, each in 2 bytes per value.
/// The preprocessing (O and dO tiles of br rows, and D) and the epilogue (a dQ tile) carve
/// from the same scratch, so the working set covers them too. Counted from the kernels' own
/// tile lists (kernels::BackwardTiles, kernels::BackwardPreprocessTiles).
constexpr std::size_t backward_working_set_bytes(index_t br, index_t bc, index_t d, index_t dv,
                                                 bool softcap = false,
                                                 TileOperands operands = TileOperands::fp32) {
  const std::size_t main = pair_operands(operands)
                               ? kernels::BackwardTiles<bf16x2>::footprint(br, bc, d, dv, softcap)
                               : kernels::BackwardTiles<float>::footprint(br, bc, d, dv, softcap);
  const std::size_t preprocess = kernels::BackwardPreprocessTiles::footprint(br, dv);
  return main > preprocess ? main : preprocess;
}

namespace detail {
inline constexpr index_t backward_max_key_tile = 256;
inline constexpr index_t backward_query_tile = 64;
inline constexpr index_t backward_min_split_keys = 32;  // splitting for parallelism stops here
inline constexpr index_t backward_items_per_worker = 4;

/// The next smaller tile of bf16 pair operands: the largest power of two below n, at least
/// kernels::sum_group_values. Pair products sum 32 values per rounding group (AMX) or 2 (vdpbf16ps),
/// so tiles that start on multiples of 32 group every sum alike for every plan.
constexpr index_t smaller_pair_tile(index_t n) {
  index_t p = kernels::sum_group_values;
  while (p * 2 < n) p *= 2;
  return p;
}

/// The smallest tiles a plan may take: 1 x 1 for float operands; for bf16 pairs 32 x 32 (or
/// the whole sequence where it is shorter), so that every budget gives the same bits.
inline std::pair<index_t, index_t> smallest_backward_tiles(index_t nq, index_t nk, TileOperands operands) {
  if (!pair_operands(operands)) return {1, 1};
  return {std::min(nq, kernels::sum_group_values), std::min(nk, kernels::sum_group_values)};
}

}  // namespace detail

/// Plans the backward tiles of `shape` for `workers` threads under an SRAM budget; throws
/// budget_error ("sram_budget_bytes") if not even the smallest tiles fit (1 x 1; bf16 pairs:
/// 32 x 32, smallest_backward_tiles).
inline BackwardTilePlan plan_backward_tiles(const BackwardShape& shape, std::size_t budget, int workers = 1) {
  using namespace detail;
  const index_t d = shape.head_dim, dv = shape.value_dim();
  const index_t nq = std::max<index_t>(shape.seqlen_q, 1), nk = std::max<index_t>(shape.seqlen_k, 1);
  const auto fits = [&](index_t br, index_t bc) {
    return backward_working_set_bytes(br, bc, d, dv, shape.softcap, shape.operands) <= budget;
  };
  const auto [min_br, min_bc] = smallest_backward_tiles(nq, nk, shape.operands);
  const bool pairs = pair_operands(shape.operands);
  index_t br = std::min(backward_query_tile, nq);
  index_t bc = std::min(backward_max_key_tile, nk);
  while (!fits(br, bc)) {  // keys down to 16 (pairs: 32), then rows, then keys
    if (pairs) {
      if (bc > min_bc) bc = smaller_pair_tile(bc);
      else if (br > min_br) br = smaller_pair_tile(br);
      else break;
    } else if (bc > 16) bc = (bc + 1) / 2;
    else if (br > 1) br = (br + 1) / 2;
    else if (bc > 1) bc = (bc + 1) / 2;
    else break;
  }
  if (!fits(br, bc))
    throw budget_error("sram_budget_bytes",
                       std::to_string(budget) + " bytes cannot hold the backward's smallest tiles (" + std::to_string(min_br) +
                           " x " + std::to_string(min_bc) + (pairs ? " for bf16 pair operands" : "") + ") at head_dim " +
                           std::to_string(d) + " (" +
                           std::to_string(backward_working_set_bytes(min_br, min_bc, d, dv, shape.softcap, shape.operands)) +
                           " bytes needed)");
  const index_t wanted = backward_items_per_worker * std::max(workers, 1);
  const index_t streams = std::max<index_t>(shape.kv_streams, 1);
  // Split key tiles stay multiples of 32 keys (kernels::sum_group_values), so
  // a key's sums group alike for every thread count; a tile the budget made ragged is not split.
  const bool splittable = bc % kernels::sum_group_values == 0 || bc >= nk;
  while (splittable && workers > 1 && bc > backward_min_split_keys && streams * ((nk + bc - 1) / bc) < wanted)
    bc = std::max(backward_min_split_keys, bc / 2 / kernels::sum_group_values * kernels::sum_group_values);
  return {br, bc, budget, backward_working_set_bytes(br, bc, d, dv, shape.softcap, shape.operands)};
}

}  // namespace tileattn
