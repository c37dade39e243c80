// tests/support/planner_brute_force.hpp: the least K/V traffic any legal tile plan has,
// found by brute force (tests/kernels/tile_plan_test.cpp holds the planner to it;
// benchmarks/planner_sweep.cpp draws the figure of docs/design.md from it).
//
// K and V are read once per work item, and a (sequence, K/V head) has ceil(Nq / P) x
// ceil(G / Hc) items for P query positions and Hc query heads per tile; Q, O and LSE move
// once whatever the plan. So for a non-causal call the counted K/V bytes are items x Nk x
// (d + dv) x 4 per (sequence, K/V head): comparing items compares traffic
// (tests/kernels/forward_io_test.cpp checks that formula against the IO counter).
#pragma once

#include <algorithm>

#include "tileattn/kernels/tile_plan.hpp"

namespace tileattn::test::planner {

inline constexpr index_t fast_keys = 64;  // the least Bc of fp32 and pair tiles (kernels/tile_plan.hpp)

/// Work items per (sequence, K/V head) of a plan of `positions` x `heads`.
inline index_t items(index_t positions, index_t heads, index_t nq, index_t group) {
  return (nq + positions - 1) / positions * ((group + heads - 1) / heads);
}

/// The fewest items of any legal plan: the key tile is fixed (forward_key_tile: the budget
/// never changes it, nor so the bits), so every number of heads per tile, and the most
/// positions that fit with them beside the Bc-key tiles (fewer positions never need fewer
/// items). 0 when not even one row fits.
inline index_t brute_force_items(const PlanShape& s, std::size_t budget) {
  const index_t bc = forward_key_tile(s);
  const auto fits = [&](index_t rows) {
    return forward_working_set_bytes(rows, bc, s.head_dim, s.value_dim(), s.operands) <= budget;
  };
  if (!fits(1)) return 0;
  index_t rows = 1;  // the most rows that fit: double, then bisect
  while (fits(2 * rows)) rows *= 2;
  for (index_t step = rows / 2; step > 0; step /= 2)
    if (fits(rows + step)) rows += step;
  index_t best = 0;
  for (index_t heads = 1; heads <= std::min(rows, s.group_size); ++heads) {
    const index_t n = items(std::min(s.seqlen_q, rows / heads), heads, s.seqlen_q, s.group_size);
    if (best == 0 || n < best) best = n;
  }
  return best;
}

}  // namespace tileattn::test::planner
