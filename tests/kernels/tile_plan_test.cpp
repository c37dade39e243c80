// tests/kernels/tile_plan_test.cpp: the tile planner (kernels/tile_plan.hpp): its plans
// always fit the budget and are reported exactly; the key tile is fixed by the head dims,
// the operands and the micro-kernel set, never by the budget (so the budget never changes
// the bits); the plans read K/V no more than 1.10x the least any legal plan with that key
// tile reads (a brute force over positions x heads, counted with the same formula the IO
// counter follows, which tests/kernels/forward_io_test.cpp checks against the counter);
// query tiles split for the workers; one tile when a sequence fits; budget_error when not
// one row fits beside the key tiles; and forward_working_set_bytes is exactly what
// kernels::ForwardTiles::carve takes from a scratch arena.
#include <gtest/gtest.h>

#include "support/planner_brute_force.hpp"
#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

using planner::fast_keys;
using planner::items;
using planner::brute_force_items;

TilePlan plan_one_worker(const PlanShape& s, std::size_t budget) {
  return plan_forward_tiles(s, budget, 1);
}

// The sweep: group sizes 1..32, head dims, budgets 48 KiB..2 MiB, Nq 1..4096.
// The planner's K/V traffic (items) is within 1.10x of the brute force's least.
TEST(TilePlan, WithinTenPercentOfTheBestLegalPlan) {
  int cases = 0, at_best = 0;
  double worst = 1.0;
  for (index_t group : {1, 2, 3, 4, 5, 7, 8, 12, 16, 27, 32})
    for (index_t d : {32, 64, 128, 256, 72})
      for (std::size_t budget : {48u << 10, 96u << 10, 128u << 10, 256u << 10, 512u << 10, 1u << 20, 2u << 20})
        for (index_t nq : {1, 7, 64, 300, 1000, 4096})
         for (TileOperands operands : {TileOperands::fp32, TileOperands::bf16_pairs}) {
          PlanShape s{d, d, nq, 3000, group, 1};
          s.operands = operands;
          if (brute_force_items(s, budget) == 0) {  // not one row beside the fixed key tiles
            EXPECT_THROW(plan_one_worker(s, budget), budget_error);
            continue;
          }
          const TilePlan plan = plan_one_worker(s, budget);
          const index_t got = items(plan.query_tile_rows, plan.heads_per_tile, nq, group);
          const index_t best = brute_force_items(s, budget);
          const double ratio = static_cast<double>(got) / static_cast<double>(best);
          worst = std::max(worst, ratio);
          ++cases;
          at_best += got == best;
          EXPECT_LE(ratio, 1.10) << "operands " << static_cast<int>(operands) << ", group " << group << ", d " << d << ", budget " << budget
                                 << ", Nq " << nq << ": " << got << " items, best " << best
                                 << " (plan " << plan.query_tile_rows << " x " << plan.heads_per_tile
                                 << " heads, Bc " << plan.key_tile_rows << ")";
        }
  std::printf("[ planner ] %d cases: %d at the brute force's least K/V traffic, worst ratio %.3f\n",
              cases, at_best, worst);
}

// The two shapes the review found (B 2, Nq 1000, Nk 3000, 8/2 heads, d 128; Nq 700,
// Nk 900, 32/1 heads, d 256), whose plans read 1.5x and more the K/V bytes the brute force
// needed, at budgets that hold their fixed key tiles: the planner's items are the least.
TEST(TilePlan, TheReviewsTwoShapesPlanTheLeastTraffic) {
  const struct {
    PlanShape shape;
    std::size_t budget;
  } cases[] = {{{128, 128, 1000, 3000, 4, 4}, 256u << 10}, {{256, 256, 700, 900, 32, 1}, 384u << 10}};
  for (const auto& c : cases) {
    const TilePlan plan = plan_one_worker(c.shape, c.budget);
    const index_t got = items(plan.query_tile_rows, plan.heads_per_tile, c.shape.seqlen_q, c.shape.group_size);
    EXPECT_EQ(got, brute_force_items(c.shape, c.budget)) << "d " << c.shape.head_dim;
  }
}

// Chunks of a group are equal (to within one head), never 30 + 2.
TEST(TilePlan, GroupChunksAreEven) {
  for (index_t group : {2, 5, 12, 27, 32})
    for (std::size_t budget : {160u << 10, 256u << 10, 512u << 10})
      for (index_t nq : {1, 3, 500}) {
        const TilePlan plan = plan_one_worker({128, 128, nq, 1000, group, 1}, budget);
        const index_t chunks = plan.head_chunks(group);
        const index_t last = group - (chunks - 1) * plan.heads_per_tile;
        EXPECT_GE(last * 2, plan.heads_per_tile) << "group " << group << " split " << plan.heads_per_tile
                                                 << " x " << chunks - 1 << " + " << last;
      }
}

// Many budgets, head dims (Q/K and V apart), sequence lengths and GQA groups: the plan
// always fits, its working set is reported exactly, and its tiles never exceed the sequences.
TEST(TilePlan, AlwaysFitsTheBudget) {
  for (auto [d, dv] : {std::pair<index_t, index_t>{32, 32}, {64, 64}, {128, 128}, {256, 256}, {1, 1},
                       {59, 59}, {192, 128}, {40, 200}})
    for (index_t group : {1, 4, 7})
     for (TileOperands operands : {TileOperands::fp32, TileOperands::bf16_pairs}) {
      const std::size_t smallest = forward_working_set_bytes(1, 1, d, dv, operands);
      for (double budget_f = static_cast<double>(smallest); budget_f < 5e6; budget_f = budget_f * 1.37 + 13) {
        const auto budget = static_cast<std::size_t>(budget_f);
        for (auto [nq, nk] : {std::pair<index_t, index_t>{1, 1}, {17, 127}, {127, 17}, {1000, 1000}, {5000, 3}})
          for (int workers : {1, 16}) {
            const PlanShape shape{d, dv, nq, nk, group, 3, operands};
            const index_t bc = forward_key_tile(shape);
            if (forward_working_set_bytes(1, bc, d, dv, operands) > budget) {
              EXPECT_THROW(plan_forward_tiles(shape, budget, workers), budget_error);
              continue;
            }
            const TilePlan plan = plan_forward_tiles(shape, budget, workers);
            EXPECT_EQ(plan.key_tile_rows, bc) << "the budget never changes the key tile";
            SCOPED_TRACE("d " + std::to_string(d) + "/" + std::to_string(dv) + ", group " +
                         std::to_string(group) + ", budget " + std::to_string(budget) + ", " +
                         std::to_string(nq) + " x " + std::to_string(nk));
            ASSERT_GE(plan.query_tile_rows, 1);
            ASSERT_GE(plan.key_tile_rows, 1);
            ASSERT_GE(plan.heads_per_tile, 1);
            EXPECT_LE(plan.query_tile_rows, nq);
            EXPECT_LE(plan.key_tile_rows, nk);
            EXPECT_LE(plan.heads_per_tile, group);
            EXPECT_EQ(plan.working_set_bytes,
                      forward_working_set_bytes(plan.packed_rows(), plan.key_tile_rows, d, dv, operands));
            EXPECT_LE(plan.working_set_bytes, budget);
            EXPECT_EQ(plan.sram_budget_bytes, budget);
            EXPECT_EQ(plan.query_tiles(nq), (nq + plan.query_tile_rows - 1) / plan.query_tile_rows);
          }
      }
    }
}

// Bc stays at or above 64 keys whenever a 64-key tile fits (the micro-kernels' rows), or
// at FlashAttention's min(Br, d) for d < 64 (the old planner's choice there).
TEST(TilePlan, KeyTilesOfAtLeast64WhereTheBudgetAllows) {
  for (index_t d : {16, 32, 40, 64, 128, 256})
    for (std::size_t budget : {64u << 10, 256u << 10, 1u << 20, 2u << 20}) {
      const PlanShape shape{d, d, 4096, 4096, 1, 1};
      if (forward_working_set_bytes(1, forward_key_tile(shape), d) > budget) continue;
      const TilePlan plan = plan_one_worker(shape, budget);
      EXPECT_GE(plan.key_tile_rows, std::min(fast_keys, d)) << "d " << d << ", budget " << budget;
    }
}

// Few work items for many workers: query tiles split until each worker has about four,
// but never below 64 packed rows; the split never changes Bc (which is what would change
// results) and costs K/V traffic in proportion to the tiles.
TEST(TilePlan, SplitsQueryTilesForTheWorkers) {
  const PlanShape shape{128, 128, 2048, 2048, 1, 16};  // B 1, H 16, N 2048, d 128
  const TilePlan one = plan_forward_tiles(shape, 2u << 20, 1);
  const TilePlan sixteen = plan_forward_tiles(shape, 2u << 20, 16);
  EXPECT_EQ(one.key_tile_rows, sixteen.key_tile_rows);
  EXPECT_GE(16 * sixteen.query_tiles(2048), 4 * 16) << "fewer than 4 items per worker";
  EXPECT_LT(one.query_tiles(2048), sixteen.query_tiles(2048));
  std::printf("[ planner ] B1 H16 N2048 d128, 2 MiB: %ld query tiles on 1 worker, %ld on 16\n",
              static_cast<long>(one.query_tiles(2048)), static_cast<long>(sixteen.query_tiles(2048)));
  for (int workers : {2, 8, 64, 1024}) {
    const TilePlan plan = plan_forward_tiles({64, 64, 1000, 1000, 1, 1}, 1u << 20, workers);
    EXPECT_GE(plan.packed_rows(), 64) << workers << " workers";
    EXPECT_EQ(plan.key_tile_rows, plan_forward_tiles({64, 64, 1000, 1000, 1, 1}, 1u << 20, 1).key_tile_rows);
  }
  // Enough items already: no split.
  const TilePlan wide = plan_forward_tiles({128, 128, 2048, 2048, 1, 64}, 2u << 20, 16);
  EXPECT_EQ(wide.query_tile_rows, one.query_tile_rows);
}

TEST(TilePlan, OneTileWhenTheSequenceFits) {
  for (index_t d : test_head_dims)
    for (auto [nq, nk] : {std::pair<index_t, index_t>{1, 1}, {5, 3}, {8, 30}, {17, 31}, {250, 19}}) {
      const TilePlan plan = plan_one_worker({d, d, nq, nk}, 1u << 20);
      EXPECT_EQ(plan.query_tile_rows, nq) << "d " << d;  // not rounded to a granule
      EXPECT_EQ(plan.key_tile_rows, nk) << "d " << d;
      EXPECT_EQ(plan.query_tiles(nq), 1);
    }
  EXPECT_EQ(plan_one_worker({64, 64, 1000, 1000}, 1u << 20).query_tile_rows, 1000);
}

TEST(TilePlan, BudgetErrorWhenNotEvenOneRowFitsBesideTheKeyTile) {
  for (index_t d : test_head_dims) {
    const PlanShape shape{d, d, 100, 100};
    const index_t bc = forward_key_tile(shape);
    const std::size_t smallest = forward_working_set_bytes(1, bc, d);
    for (std::size_t budget : {std::size_t{0}, std::size_t{1}, std::size_t{64}, forward_working_set_bytes(1, 1, d),
                               smallest - 1}) {
      try {
        plan_one_worker(shape, budget);
        ADD_FAILURE() << "no budget_error at d " << d << ", budget " << budget;
      } catch (const budget_error& e) {
        EXPECT_EQ(e.parameter(), "sram_budget_bytes");
      }
    }
    const TilePlan plan = plan_one_worker(shape, smallest);
    EXPECT_EQ(plan.query_tile_rows, 1);
    EXPECT_EQ(plan.key_tile_rows, bc);
    EXPECT_EQ(plan.working_set_bytes, smallest);
  }
}

// Bc is fixed by the head dims, the operands and the micro-kernel set: from the smallest
// budget that holds one row to 64 MiB, only the query tiles change (issue #42: a budget
// that changed Bc changed the bits). fp32 and pairs: the rule's tile for a fixed 1 MiB,
// 64 to 128 keys.
TEST(TilePlan, TheBudgetNeverChangesTheKeyTile) {
  for (auto [d, dv] : {std::pair<index_t, index_t>{16, 16}, {64, 64}, {72, 72}, {128, 128}, {256, 256},
                       {192, 128}, {576, 512}})
    for (TileOperands operands : {TileOperands::fp32, TileOperands::bf16_pairs}) {
      const PlanShape shape{d, dv, 3000, 5000, 4, 2, operands};
      const index_t bc = forward_key_tile(shape);
      EXPECT_GE(bc, fast_keys);
      EXPECT_LE(bc, 128);
      index_t fewest_rows = 0, most_rows = 0;
      for (std::size_t budget = forward_working_set_bytes(1, bc, d, dv, operands); budget < (std::size_t{64} << 20);
           budget = budget * 3 / 2) {
        const TilePlan plan = plan_one_worker(shape, budget);
        EXPECT_EQ(plan.key_tile_rows, bc) << "d " << d << ", budget " << budget;
        fewest_rows = fewest_rows == 0 ? plan.packed_rows() : std::min(fewest_rows, plan.packed_rows());
        most_rows = std::max(most_rows, plan.packed_rows());
      }
      EXPECT_LT(fewest_rows, most_rows) << "the budget sets the query tiles";
    }
}

TEST(TilePlan, PlanForwardUsesTheOptionsBudgetAndThreads) {
  ForwardOptions opts;
  opts.sram_budget_bytes = 100000;
  EXPECT_EQ(forward_tiles(PlanShape{64, 64, 500, 500}, opts).sram_budget_bytes, 100000u);
  opts.sram_budget_bytes = 0;  // the detected per-core cache
  EXPECT_EQ(forward_tiles(PlanShape{64, 64, 500, 500}, opts).sram_budget_bytes, per_core_cache_bytes());
  EXPECT_EQ(effective_sram_budget(opts), per_core_cache_bytes());
  opts.sram_budget_bytes = 1u << 20;
  opts.execution = {Backend::serial, 0};
  const PlanShape shape{128, 128, 2048, 2048, 1, 2};
  EXPECT_EQ(forward_tiles(shape, opts).query_tile_rows, plan_forward_tiles(shape, 1u << 20, 1).query_tile_rows);
  opts.execution = {Backend::automatic, 7};
  EXPECT_EQ(forward_tiles(shape, opts).query_tile_rows, plan_forward_tiles(shape, 1u << 20, 7).query_tile_rows);
}

// ---- The working set is exactly what the kernel carves -----------------------------------------

// Float operand tiles and bf16 pair tiles (which halve Q, K^T and V and add a bf16 P).
template <class Op>
void expect_working_set_equals_carve() {
  constexpr TileOperands operands = kernels::tile_operands_v<Op>;
  for (auto [d, dv] : {std::pair<index_t, index_t>{32, 32}, {64, 64}, {128, 128}, {256, 256}, {1, 1},
                       {72, 72}, {192, 128}, {17, 33}})
    for (index_t rows : {1, 3, 8, 16, 17, 64, 100})
      for (index_t heads : {1, 3})
        for (index_t bc : {1, 5, 16, 31, 64, 200}) {
          TilePlan plan;
          plan.query_tile_rows = rows;
          plan.key_tile_rows = bc;
          plan.heads_per_tile = heads;
          const std::size_t bytes = forward_working_set_bytes(rows * heads, bc, d, dv, operands);
          ScratchArena arena(bytes);
          const auto tiles = kernels::ForwardTiles<Op>::carve(arena, plan.packed_rows(), bc, d, dv);
          EXPECT_EQ(arena.used(), bytes) << "rows " << rows << ", heads " << heads << ", bc " << bc;
          EXPECT_EQ(tiles.q.capacity_rows(), rows * heads);
          EXPECT_EQ(tiles.s.capacity_cols(), bc);
          EXPECT_EQ(tiles.k_t.capacity_rows(), kernels::operand_cols<Op>(d));
          EXPECT_EQ(tiles.v.capacity_rows(), kernels::operand_cols<Op>(bc));
          EXPECT_EQ(tiles.o.capacity_cols(), dv);
          // The exact budget suffices; one line less does not.
          ScratchArena tight(bytes - cache_line_bytes);
          EXPECT_THROW(kernels::ForwardTiles<Op>::carve(tight, plan.packed_rows(), bc, d, dv), budget_error);
        }
}

TEST(ForwardWorkingSet, EqualsWhatForwardTilesCarves) { expect_working_set_equals_carve<float>(); }
TEST(ForwardWorkingSet, EqualsWhatBf16PairTilesCarve) { expect_working_set_equals_carve<bf16x2>(); }

TEST(ForwardWorkingSet, Bf16PairTilesTakeLessThanFloatTiles) {
  for (index_t d : {64, 128, 256})
    EXPECT_LT(forward_working_set_bytes(128, 128, d, d, TileOperands::bf16_pairs),
              forward_working_set_bytes(128, 128, d, d, TileOperands::fp32));
}

template <class Op>
void expect_planned_tiles_fit() {
  constexpr TileOperands operands = kernels::tile_operands_v<Op>;
  for (index_t d : test_head_dims)
    for (std::size_t extra : {std::size_t{0}, std::size_t{40000}, std::size_t{300000}, std::size_t{1} << 20}) {
      PlanShape shape{d, d, 999, 777, 2, 1};
      shape.operands = operands;
      const std::size_t budget = forward_working_set_bytes(1, forward_key_tile(shape), d, d, operands) + extra;
      const TilePlan plan = plan_one_worker(shape, budget);
      ScratchArena arena(budget);
      kernels::ForwardTiles<Op>::carve(arena, plan.packed_rows(), plan.key_tile_rows, d, d);
      EXPECT_EQ(arena.used(), plan.working_set_bytes);
      EXPECT_LE(arena.high_water(), budget);
    }
}

TEST(ForwardWorkingSet, PlannedTilesCarveWithinTheBudget) { expect_planned_tiles_fit<float>(); }
TEST(ForwardWorkingSet, PlannedBf16PairTilesCarveWithinTheBudget) { expect_planned_tiles_fit<bf16x2>(); }

/// A bf16 panel too wide for its head dims halves (whatever the budget): MLA's decode (576 /
/// 512, 128 heads of one latent head) at AMX's 512-key panels takes 256-key panels, which a
/// Xeon core's 2 MiB holds with all 128 heads' rows.
TEST(PanelPlan, WideHeadsHalveThePanelBeforeGivingPanelsUp) {
  const PlanShape mla{576, 512, 1, 8192, 128, 1, TileOperands::bf16_panels};
  const auto plan_with = [&](index_t panel, std::size_t budget) {
    detail::panel_keys = panel;
    const TilePlan plan = plan_forward_tiles(mla, budget, 16);
    detail::panel_keys = 0;
    return plan;
  };
  const TilePlan xeon = plan_with(512, std::size_t{2} << 20);
  EXPECT_TRUE(xeon.panels);
  EXPECT_EQ(xeon.key_tile_rows, 256);
  EXPECT_EQ(xeon.packed_rows(), 128);  // every head in one item
  EXPECT_LE(xeon.working_set_bytes, std::size_t{2} << 20);
  const TilePlan large = plan_with(512, std::size_t{64} << 20);  // the same panel under any budget
  EXPECT_TRUE(large.panels);
  EXPECT_EQ(large.key_tile_rows, 256);
  EXPECT_THROW(plan_with(512, std::size_t{1} << 20), budget_error);  // not one row beside 256 keys
  EXPECT_EQ(plan_with(128, std::size_t{1} << 20).key_tile_rows, 128);  // the vdpbf16ps set's panel
  EXPECT_EQ(plan_with(64, std::size_t{2} << 20).key_tile_rows, 64);  // a narrow panel stays as asked
}

// The default budget (the per-core cache) is raised to what the shape needs: MLA's head_dim
// 576 / 512 needs 548 KB for one query row beside its 121-key tiles, and a 512 KiB L2 (Zen
// 2/3) refused every MLA call made with default options. A budget the caller gives is kept.
TEST(TilePlan, TheDefaultBudgetFitsEveryShape) {
  const std::size_t cache = per_core_cache_bytes();
  EXPECT_EQ(effective_sram_budget(ForwardOptions{}), cache);
  EXPECT_EQ(effective_sram_budget(ForwardOptions{}, cache + 12345), cache + 12345);
  EXPECT_EQ(effective_sram_budget(ForwardOptions{}, cache / 2), cache);
  ForwardOptions given;
  given.sram_budget_bytes = 300000;
  EXPECT_EQ(effective_sram_budget(given, cache + 12345), 300000u);

  PlanShape mla;
  mla.seqlen_q = 1;
  mla.seqlen_k = 4096;
  mla.head_dim = 576;
  mla.head_dim_v = 512;
  const std::size_t least = detail::least_forward_budget(mla);
  EXPECT_GT(least, std::size_t{512} << 10);  // more than a 512 KiB L2
  const TilePlan plan = forward_tiles(mla);  // threw where the cache is smaller
  EXPECT_GE(plan.sram_budget_bytes, least);
  EXPECT_GE(plan.query_tile_rows, 1);
  EXPECT_THROW(forward_tiles(mla, given), budget_error);  // a given budget is not raised
}

}  // namespace
}  // namespace tileattn::test
