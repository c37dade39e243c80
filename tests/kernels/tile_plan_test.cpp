// tests/kernels/tile_plan_test.cpp: the tile planner (kernels/tile_plan.hpp): FlashAttention's
// rule (in FA2's loop order) at long sequences, plans that always fit the budget, one tile
// when a sequence fits, budget_error below 1 x 1 tiles; and forward_working_set_bytes is
// exactly what kernels::ForwardTiles<D>::carve takes from a scratch arena.
#include <gtest/gtest.h>

#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

constexpr index_t key_granule = 16;       // one AVX-512 vector of fp32 scores
constexpr index_t query_granule = 8;      // rows of the micro-kernels' register block
constexpr index_t min_streamed_keys = 64;  // Bc shrinks first, but not below this

index_t round_down(index_t v, index_t g) { return v >= g ? v / g * g : v; }
index_t shrink(index_t v, index_t g) { return v > g ? round_down(v - 1, g) : v - 1; }

/// The documented rule, written out independently for one query head per tile and sequences
/// longer than every tile. FlashAttention-1 gives the SRAM-resident tile M / 4d rows and the
/// streamed one min(that, d) (M = the budget in floats); in FlashAttention-2's loop order the
/// query tile is the resident one, so Br = ceil(M / 4d) rounded down to 8 and
/// Bc = min(ceil(M / 4d), d) rounded down to 16. While the working set is over budget:
/// shrink Bc by a granule down to 64 keys, then Br, then Bc further.
std::pair<index_t, index_t> fa_rule(index_t d, std::size_t budget) {
  const auto floats = static_cast<index_t>(budget / sizeof(float));
  const index_t br_rule = std::max<index_t>(1, (floats + 4 * d - 1) / (4 * d));
  index_t br = round_down(br_rule, query_granule);
  index_t bc = round_down(std::min(br_rule, d), key_granule);
  while (forward_working_set_bytes(br, bc, d) > budget) {
    if (bc > min_streamed_keys) bc = shrink(bc, key_granule);
    else if (br > 1) br = shrink(br, query_granule);
    else bc = shrink(bc, key_granule);
  }
  return {br, bc};
}

TEST(TilePlan, FlashAttentionRuleAtLongSequences) {
  constexpr index_t long_seq = 1 << 20;
  int unshrunk = 0;
  for (index_t d : supported_head_dims)
    for (std::size_t budget : {64u << 10, 192u << 10, 256u << 10, 512u << 10, 1u << 20, 2u << 20, 3u << 20}) {
      const TilePlan plan = plan_forward_tiles(d, long_seq, long_seq, budget);
      const auto [br, bc] = fa_rule(d, budget);
      EXPECT_EQ(plan.query_tile_rows, br) << "d " << d << ", budget " << budget;
      EXPECT_EQ(plan.key_tile_rows, bc) << "d " << d << ", budget " << budget;
      EXPECT_EQ(plan.heads_per_tile, 1);
      // Where the rule fits without shrinking, that is literally the rule's choice.
      const auto floats = static_cast<index_t>(budget / sizeof(float));
      const index_t br_rule = (floats + 4 * d - 1) / (4 * d);
      if (br == round_down(br_rule, query_granule) && bc == round_down(std::min(br_rule, d), key_granule))
        ++unshrunk;
    }
  EXPECT_GT(unshrunk, 10) << "the budgets above should mostly not need shrinking";
  // Two values spelled out: a 1 MiB L2 (262144 floats) at d = 64 gives Br = 1024, Bc = 64
  // (working set 812 KiB); at d = 128, Br = 512, Bc = 128 (902 KiB).
  EXPECT_EQ(plan_forward_tiles(64, long_seq, long_seq, 1u << 20).query_tile_rows, 1024);
  EXPECT_EQ(plan_forward_tiles(64, long_seq, long_seq, 1u << 20).key_tile_rows, 64);
  EXPECT_EQ(plan_forward_tiles(128, long_seq, long_seq, 1u << 20).query_tile_rows, 512);
  EXPECT_EQ(plan_forward_tiles(128, long_seq, long_seq, 1u << 20).key_tile_rows, 128);
}

// Many budgets, head dims, sequence lengths and GQA group sizes: the plan always fits, its
// working set is reported exactly, and its tiles never exceed the sequences or Br's cap.
TEST(TilePlan, AlwaysFitsTheBudget) {
  for (index_t d : supported_head_dims)
    for (index_t group : {1, 4, 7}) {
      const std::size_t smallest = forward_working_set_bytes(1, 1, d);
      for (double budget_f = static_cast<double>(smallest); budget_f < 5e6; budget_f = budget_f * 1.37 + 13) {
        const auto budget = static_cast<std::size_t>(budget_f);
        for (auto [nq, nk] : {std::pair<index_t, index_t>{1, 1}, {17, 127}, {127, 17}, {1000, 1000}, {5000, 3}}) {
          const TilePlan plan = plan_forward_tiles(d, nq, nk, budget, group);
          SCOPED_TRACE("d " + std::to_string(d) + ", group " + std::to_string(group) + ", budget " +
                       std::to_string(budget) + ", " + std::to_string(nq) + " x " + std::to_string(nk));
          ASSERT_GE(plan.query_tile_rows, 1);
          ASSERT_GE(plan.key_tile_rows, 1);
          ASSERT_GE(plan.heads_per_tile, 1);
          EXPECT_LE(plan.query_tile_rows, nq);
          EXPECT_LE(plan.key_tile_rows, nk);
          EXPECT_LE(plan.heads_per_tile, group);
          const auto floats = static_cast<index_t>(budget / sizeof(float));
          const index_t br_rule = std::max<index_t>(1, (floats + 4 * d - 1) / (4 * d));
          EXPECT_LE(plan.packed_rows(), std::max(br_rule, group)) << "packed rows above the rule";
          EXPECT_LE(plan.key_tile_rows, d) << "Bc above its cap min(Br, d)";
          EXPECT_EQ(plan.packed_rows(), plan.query_tile_rows * plan.heads_per_tile);
          EXPECT_EQ(plan.working_set_bytes, forward_working_set_bytes(plan.packed_rows(), plan.key_tile_rows, d));
          EXPECT_LE(plan.working_set_bytes, budget);
          EXPECT_EQ(plan.sram_budget_bytes, budget);
          EXPECT_EQ(plan.query_tiles(nq), (nq + plan.query_tile_rows - 1) / plan.query_tile_rows);
        }
      }
    }
}

TEST(TilePlan, OneTileWhenTheSequenceFits) {
  for (index_t d : supported_head_dims)
    for (auto [nq, nk] : {std::pair<index_t, index_t>{1, 1}, {5, 3}, {8, 30}, {17, 31}, {250, 19}}) {
      const TilePlan plan = plan_forward_tiles(d, nq, nk, 1u << 20);
      EXPECT_EQ(plan.query_tile_rows, nq) << "d " << d;  // not rounded to a granule
      EXPECT_EQ(plan.key_tile_rows, nk) << "d " << d;
      EXPECT_EQ(plan.query_tiles(nq), 1);
    }
  // 1000 queries fit one query tile of a 1 MiB budget at d = 64 (the rule allows 1024).
  EXPECT_EQ(plan_forward_tiles(64, 1000, 1000, 1u << 20).query_tile_rows, 1000);
}

TEST(TilePlan, BudgetErrorWhenNotEvenOneByOneFits) {
  for (index_t d : supported_head_dims) {
    const std::size_t smallest = forward_working_set_bytes(1, 1, d);
    for (std::size_t budget : {std::size_t{0}, std::size_t{1}, std::size_t{64}, smallest - 1}) {
      try {
        plan_forward_tiles(d, 100, 100, budget);
        ADD_FAILURE() << "no budget_error at d " << d << ", budget " << budget;
      } catch (const budget_error& e) {
        EXPECT_EQ(e.parameter(), "sram_budget_bytes");
      }
    }
    const TilePlan plan = plan_forward_tiles(d, 100, 100, smallest);
    EXPECT_EQ(plan.query_tile_rows, 1);
    EXPECT_EQ(plan.key_tile_rows, 1);
    EXPECT_EQ(plan.working_set_bytes, smallest);
  }
}

TEST(TilePlan, PlanForwardUsesTheOptionsBudget) {
  ForwardOptions opts;
  opts.sram_budget_bytes = 100000;
  EXPECT_EQ(plan_forward(64, 500, 500, opts).sram_budget_bytes, 100000u);
  opts.sram_budget_bytes = 0;  // the detected per-core cache
  EXPECT_EQ(plan_forward(64, 500, 500, opts).sram_budget_bytes, per_core_cache_bytes());
  EXPECT_EQ(effective_sram_budget(opts), per_core_cache_bytes());
}

// ---- The working set is exactly what the kernel carves -----------------------------------------

template <class HeadDim>
class ForwardWorkingSet : public ::testing::Test {};

using HeadDims = ::testing::Types<HeadDim<32>, HeadDim<64>, HeadDim<80>, HeadDim<96>, HeadDim<128>, HeadDim<256>>;
TYPED_TEST_SUITE(ForwardWorkingSet, HeadDims);

TYPED_TEST(ForwardWorkingSet, EqualsWhatForwardTilesCarves) {
  constexpr index_t D = TypeParam::value;
  for (index_t rows : {1, 3, 8, 16, 17, 64, 100})
    for (index_t heads : {1, 3})
      for (index_t bc : {1, 5, 16, 31, 64, 200}) {
        TilePlan plan;
        plan.query_tile_rows = rows;
        plan.key_tile_rows = bc;
        plan.heads_per_tile = heads;
        const std::size_t bytes = forward_working_set_bytes(rows * heads, bc, D);
        ScratchArena arena(bytes);
        const auto tiles = kernels::ForwardTiles<D>::carve(arena, plan);
        EXPECT_EQ(arena.used(), bytes) << "rows " << rows << ", heads " << heads << ", bc " << bc;
        EXPECT_EQ(tiles.q.capacity_rows(), rows * heads);
        EXPECT_EQ(tiles.s.capacity_cols(), bc);
        EXPECT_EQ(tiles.k_t.capacity_rows(), D);
        // The exact budget suffices; one line less does not.
        ScratchArena tight(bytes - cache_line_bytes);
        EXPECT_THROW(kernels::ForwardTiles<D>::carve(tight, plan), budget_error);
      }
}

TYPED_TEST(ForwardWorkingSet, PlannedTilesCarveWithinTheBudget) {
  constexpr index_t D = TypeParam::value;
  for (std::size_t budget : {forward_working_set_bytes(1, 1, D), std::size_t{40000}, std::size_t{300000}, std::size_t{1} << 20}) {
    if (budget < forward_working_set_bytes(1, 1, D)) continue;
    const TilePlan plan = plan_forward_tiles(D, 999, 777, budget, 2);
    ScratchArena arena(budget);
    kernels::ForwardTiles<D>::carve(arena, plan);
    EXPECT_EQ(arena.used(), plan.working_set_bytes);
    EXPECT_LE(arena.high_water(), budget);
  }
}

}  // namespace
}  // namespace tileattn::test
