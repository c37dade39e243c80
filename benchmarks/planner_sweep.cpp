// benchmarks/planner_sweep.cpp: the K/V traffic of tile plans relative to the least any
// legal plan has (tests/support/planner_brute_force.hpp), as CSV for
// scripts/plot_planner.py (docs/figures/planner_sweep.svg). Counts, not timings.
//
//   build/benchmarks/planner_sweep > /tmp/sweep.csv
//   python3 scripts/plot_planner.py /tmp/sweep.csv      # -> docs/figures/planner_sweep.svg
//
// Columns: group, head_dim, budget, seqlen_q, then work items per (sequence, K/V head) for
// the planner, for the FlashAttention rule the planner used before commit c4c45f1 (written
// out below as it was: Br = ceil(M / 4d) positions, Bc = min(Br, d), shrinking Bc to 64,
// then positions, then heads of the group, then Bc), and for the brute force.
#include <cstdio>

#include "support/planner_brute_force.hpp"

namespace {

using tileattn::index_t;

/// Work items of the planner before c4c45f1 (K/V traffic is proportional to them).
index_t fa_rule_items(index_t d, index_t nq, index_t nk, std::size_t budget, index_t group) {
  const auto fit = [](index_t rule, index_t seqlen, index_t granule) {
    return rule >= seqlen ? std::max<index_t>(seqlen, 1) : (rule >= granule ? rule / granule * granule : rule);
  };
  const auto shrink = [](index_t v, index_t g) { return v > g ? (v - 1 >= g ? (v - 1) / g * g : v - 1) : v - 1; };
  const auto floats = static_cast<index_t>(budget / sizeof(float));
  const index_t br_rule = std::max<index_t>(1, (floats + 4 * d - 1) / (4 * d));
  index_t heads = group;
  index_t rows = fit(std::max<index_t>(1, br_rule / heads), nq, 8);
  index_t bc = fit(std::min(br_rule, d), nk, 16);
  while (tileattn::forward_working_set_bytes(rows * heads, bc, d) > budget) {
    if (bc > 64) bc = shrink(bc, 16);
    else if (rows > 1) rows = shrink(rows, 8);
    else if (heads > 1) --heads;
    else if (bc > 1) bc = shrink(bc, 16);
    else return 0;
  }
  return tileattn::test::planner::items(rows, heads, nq, group);
}

}  // namespace

int main() {
  using namespace tileattn;
  std::printf("group,head_dim,budget,seqlen_q,planner,fa_rule,brute_force\n");
  for (index_t group : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 27, 32})
    for (index_t d : {64, 128, 256})
      for (std::size_t budget : {48u << 10, 96u << 10, 128u << 10, 256u << 10, 512u << 10, 1u << 20, 2u << 20})
        for (index_t nq : {1, 64, 1000, 4096}) {
          if (forward_working_set_bytes(1, 1, d) > budget) continue;
          const PlanShape shape{d, d, nq, 3000, group, 1};
          const TilePlan plan = plan_forward_tiles(shape, budget, 1);
          std::printf("%ld,%ld,%zu,%ld,%ld,%ld,%ld\n", static_cast<long>(group), static_cast<long>(d), budget,
                      static_cast<long>(nq),
                      static_cast<long>(test::planner::items(plan.query_tile_rows, plan.heads_per_tile, nq, group)),
                      static_cast<long>(fa_rule_items(d, nq, 3000, budget, group)),
                      static_cast<long>(test::planner::brute_force_items(shape, budget)));
        }
}
