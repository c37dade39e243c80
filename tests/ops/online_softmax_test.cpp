// tests/ops/online_softmax_test.cpp: the online softmax on score tiles (ops/online_softmax.hpp):
// mask_outside_window (the causal mask), online_softmax_step over several key tiles + finalize_rows against a direct
// softmax in double (fully masked rows, rows masked only in early tiles, sinks), and a
// demonstration that the forward error bound catches a missing rescale.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/test_support.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/online_softmax.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::test {
namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// ---- the causal mask: mask_outside_window with right edge 0 ---------------------------------

/// The causal mask as the kernel applies it: a window with no left edge and right edge 0.
template <class ScoreTile>
void mask_causal(ScoreTile& s, index_t row0, index_t col0, index_t offset) {
  const ops::KeyWindow causal{offset, -1, 0, 1 << 20};
  ops::mask_outside_window(s, ops::PackedRows{0, 1, row0, s.rows()}, col0, causal);
}

TEST(MaskCausal, MasksExactlyTheKeysAfterTheDiagonal) {
  ScratchArena arena(1 << 16);
  auto s = carve_tile<float>(arena, 6, 10);
  for (index_t row0 : {0, 5, 40})
    for (index_t col0 : {0, 3, 12, 48})
      for (index_t offset : {-50, -8, -1, 0, 2, 20}) {
        ops::fill(s, 1.0f);
        mask_causal(s, row0, col0, offset);
        for (index_t i = 0; i < 6; ++i)
          for (index_t j = 0; j < 10; ++j) {
            const bool masked = col0 + j > row0 + i + offset;  // key after query's diagonal
            ASSERT_EQ(s(i, j), masked ? neg_inf : 1.0f)
                << "row0 " << row0 << " col0 " << col0 << " offset " << offset << " at " << i << "," << j;
          }
      }
}

TEST(MaskCausal, RespectsTheExtent) {
  ScratchArena arena(1 << 16);
  auto s = carve_tile<float>(arena, 4, 32);
  ops::fill(s, 2.0f);
  s.set_extent(4, 5);
  mask_causal(s, 0, 0, 0);
  s.set_extent(4, 32);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 5; j < 32; ++j) ASSERT_EQ(s(i, j), 2.0f) << "wrote outside the extent";
}

// ---- online softmax against a direct softmax ------------------------------------------------

constexpr index_t rows = 6, value_cols = 24;
constexpr index_t key_tiles[] = {7, 16, 3, 20};
constexpr index_t total_keys = 46;

/// Scores (log2 units) and values for the online-softmax tests: row 2 is masked everywhere,
/// row 4 in the first two key tiles (so its running max goes from -inf to finite), row 5 at
/// scattered keys. Scores have a standard deviation of log2(e), as forward's Q K^T / sqrt(d)
/// with N(0, 1) inputs.
struct Problem {
  std::vector<float> scores;  // rows x total_keys
  std::vector<float> values;  // total_keys x value_cols
  explicit Problem(std::uint64_t seed) : scores(rows * total_keys), values(total_keys * value_cols) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : scores) x = normal(rng) * 1.4427f;
    for (float& x : values) x = normal(rng);
    for (index_t j = 0; j < total_keys; ++j) scores[2 * total_keys + j] = neg_inf;
    for (index_t j = 0; j < 23; ++j) scores[4 * total_keys + j] = neg_inf;
    for (index_t j = 0; j < total_keys; j += 3) scores[5 * total_keys + j] = neg_inf;
  }
  float score(index_t i, index_t j) const { return scores[static_cast<std::size_t>(i * total_keys + j)]; }
  float value(index_t j, index_t c) const { return values[static_cast<std::size_t>(j * value_cols + c)]; }
};

struct Result {
  std::vector<double> o;  // rows x value_cols
  std::vector<double> lse;
};

/// softmax(scores in log2 units) V in double, with an optional sink logit (log2 units).
Result direct_softmax(const Problem& p, std::optional<float> sink = std::nullopt) {
  Result r{std::vector<double>(rows * value_cols, 0.0), std::vector<double>(rows)};
  for (index_t i = 0; i < rows; ++i) {
    double m = sink ? static_cast<double>(*sink) : -INFINITY;
    for (index_t j = 0; j < total_keys; ++j) m = std::max(m, static_cast<double>(p.score(i, j)));
    if (std::isinf(m)) {
      r.lse[static_cast<std::size_t>(i)] = -INFINITY;
      continue;
    }
    double sum = sink ? std::exp2(*sink - m) : 0.0;
    for (index_t j = 0; j < total_keys; ++j) {
      const double w = std::exp2(static_cast<double>(p.score(i, j)) - m);
      sum += w;
      for (index_t c = 0; c < value_cols; ++c) r.o[static_cast<std::size_t>(i * value_cols + c)] += w * p.value(j, c);
    }
    for (index_t c = 0; c < value_cols; ++c) r.o[static_cast<std::size_t>(i * value_cols + c)] /= sum;
    r.lse[static_cast<std::size_t>(i)] = (m + std::log2(sum)) * std::log(2.0);
  }
  return r;
}

/// The forward kernel's loop over key tiles, on the problem's scores. `step` is the
/// online-softmax step to use (the real one, or a broken one).
template <class Step>
Result tiled_softmax(const Problem& p, Step&& step, const float* sink = nullptr) {
  ScratchArena arena(1 << 20);
  auto s = carve_tile<float>(arena, rows, 32);
  auto v = carve_tile<float>(arena, 32, value_cols);
  auto o = carve_tile<float>(arena, rows, value_cols);
  auto stats = ops::RowStats::carve(arena, rows);
  auto lse = carve_tile_vector<float>(arena, rows);
  ops::fill(o, 0.0f);
  stats.reset(rows);
  index_t col0 = 0;
  for (index_t cols : key_tiles) {
    s.set_extent(rows, cols);
    v.set_extent(cols, value_cols);
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = 0; j < cols; ++j) s(i, j) = p.score(i, col0 + j);
    for (index_t j = 0; j < cols; ++j)
      for (index_t c = 0; c < value_cols; ++c) v(j, c) = p.value(col0 + j, c);
    step(s, stats, o);
    ops::matmul_accumulate(o, s, v);
    col0 += cols;
  }
  ops::finalize_rows(o, stats, lse.data(), sink);
  Result r{std::vector<double>(rows * value_cols), std::vector<double>(rows)};
  for (index_t i = 0; i < rows; ++i) {
    r.lse[static_cast<std::size_t>(i)] = lse[i];
    for (index_t c = 0; c < value_cols; ++c) r.o[static_cast<std::size_t>(i * value_cols + c)] = o(i, c);
  }
  return r;
}

const auto real_step = [](auto& s, ops::RowStats& stats, auto& o) { ops::online_softmax_step(s, stats, o, 1.0f); };

double max_o_error(const Result& a, const Result& b) {
  double e = 0.0;
  for (std::size_t n = 0; n < a.o.size(); ++n) e = std::max(e, std::abs(a.o[n] - b.o[n]));
  return e;
}

TEST(OnlineSoftmax, MatchesDirectSoftmaxOverSeveralKeyTiles) {
  for (std::uint64_t seed : {1, 2, 3}) {
    const Problem p(seed);
    const Result want = direct_softmax(p), got = tiled_softmax(p, real_step);
    for (std::size_t n = 0; n < got.o.size(); ++n) ASSERT_FALSE(std::isnan(got.o[n])) << n;
    EXPECT_LE(max_o_error(got, want), 1e-5);
    for (index_t i = 0; i < rows; ++i) {
      if (i == 2) continue;
      EXPECT_NEAR(got.lse[static_cast<std::size_t>(i)], want.lse[static_cast<std::size_t>(i)], 1e-5) << "row " << i;
    }
  }
}

TEST(OnlineSoftmax, FullyMaskedRowGivesZeroOutputAndMinusInfinityLse) {
  const Problem p(4);
  const Result got = tiled_softmax(p, real_step);
  for (index_t c = 0; c < value_cols; ++c) EXPECT_EQ(got.o[static_cast<std::size_t>(2 * value_cols + c)], 0.0) << c;
  EXPECT_TRUE(std::isinf(got.lse[2]) && got.lse[2] < 0) << got.lse[2];
  // Row 4 saw only masked keys in its first two tiles and is still right.
  const Result want = direct_softmax(p);
  for (index_t c = 0; c < value_cols; ++c)
    EXPECT_NEAR(got.o[static_cast<std::size_t>(4 * value_cols + c)], want.o[static_cast<std::size_t>(4 * value_cols + c)], 1e-5);
}

TEST(OnlineSoftmax, StepLeavesMaskedRowsAtZeroProbability) {
  ScratchArena arena(1 << 16);
  auto s = carve_tile<float>(arena, 2, 16);
  auto o = carve_tile<float>(arena, 2, 16);
  auto stats = ops::RowStats::carve(arena, 2);
  stats.reset(2);
  ops::fill(o, 0.0f);
  ops::fill(s, neg_inf);
  s(1, 3) = 1.0f;
  s(1, 4) = 2.0f;
  ops::online_softmax_step(s, stats, o, 1.0f);
  for (index_t j = 0; j < 16; ++j) EXPECT_EQ(s(0, j), 0.0f);
  EXPECT_EQ(stats.max[0], neg_inf);
  EXPECT_EQ(stats.sum[0], 0.0f);
  EXPECT_EQ(stats.max[1], 2.0f);
  EXPECT_NEAR(s(1, 3), 0.5f, 1e-6);
  EXPECT_NEAR(s(1, 4), 1.0f, 1e-6);
  EXPECT_NEAR(stats.sum[1], 1.5f, 1e-6);
}

TEST(OnlineSoftmax, SinkJoinsTheDenominator) {
  for (float sink : {-3.0f, 0.5f, 6.0f}) {
    const Problem p(5);
    const Result want = direct_softmax(p, sink), got = tiled_softmax(p, real_step, &sink);
    EXPECT_LE(max_o_error(got, want), 1e-5) << "sink " << sink;
    for (index_t i = 0; i < rows; ++i)
      EXPECT_NEAR(got.lse[static_cast<std::size_t>(i)], want.lse[static_cast<std::size_t>(i)], 1e-5)
          << "row " << i << ", sink " << sink;
    // The fully masked row sees only the sink: O = 0, LSE = the sink's logit (natural log).
    for (index_t c = 0; c < value_cols; ++c) EXPECT_EQ(got.o[static_cast<std::size_t>(2 * value_cols + c)], 0.0);
    EXPECT_NEAR(got.lse[2], sink * std::log(2.0), 1e-6);
  }
}

// A kernel that forgets to rescale the output accumulator when the running max grows
// (o *= 2^(old max - new max)) is off by far more than forward_o_tolerance, the bound every
// forward accuracy test uses: that bound would catch the bug.
TEST(OnlineSoftmax, MissingRescaleIsCaught) {
  const auto step_without_rescale = [](auto& s, ops::RowStats& stats, auto& o) {
    (void)o;  // the bug: o keeps its old scale
    for (index_t i = 0; i < s.rows(); ++i) {
      float* p = s.row(i);
      float m = stats.max[i];
      for (index_t j = 0; j < s.cols(); ++j) m = std::max(m, p[j]);
      if (m == neg_inf) {
        std::fill_n(p, s.cols(), 0.0f);
        continue;
      }
      float sum = 0.0f;
      for (index_t j = 0; j < s.cols(); ++j) sum += (p[j] = std::exp2(p[j] - m));
      stats.sum[i] = stats.sum[i] * std::exp2(stats.max[i] - m) + sum;
      stats.max[i] = m;
    }
  };
  for (std::uint64_t seed : {1, 2, 3}) {
    const Problem p(seed);
    const Result want = direct_softmax(p);
    const double broken = max_o_error(tiled_softmax(p, step_without_rescale), want);
    const double fine = max_o_error(tiled_softmax(p, real_step), want);
    EXPECT_GT(broken, 1e-2) << "seed " << seed;
    EXPECT_GT(broken, 100 * forward_o_tolerance) << "seed " << seed;
    EXPECT_LT(fine, forward_o_tolerance) << "seed " << seed;
  }
}

// Raw scores with the scale applied inside the exponent give the same P as scores scaled
// first, to within the rounding of the scaled product.
TEST(OnlineSoftmax, ScaleInsideTheExponent) {
  const Problem p(6);
  constexpr float scale = 0.37f;
  Problem raw = p;
  for (float& x : raw.scores) x = std::isinf(x) ? x : x / scale;
  const Result want = direct_softmax(p);
  const Result got = tiled_softmax(raw, [&](auto& s, ops::RowStats& stats, auto& o) {
    ops::online_softmax_step(s, stats, o, scale);
  });
  EXPECT_LE(max_o_error(got, want), 1e-5);
}

// A NaN score makes its row NaN, whether the NaN shares a tile with finite scores, comes
// alone in a tile before any finite score (where the running max is still -inf), or comes
// with -inf masked scores only; the other rows are untouched.
TEST(OnlineSoftmax, NaNScoreMakesItsRowNaNInAnyTile) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (index_t at : {index_t{0}, index_t{10}, index_t{30}}) {  // key tiles 0..6, 7..22, 23..25, 26..45
    for (bool rest_masked : {false, true}) {
      Problem p(7);
      for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < total_keys; ++j)
          if (rest_masked && i == 3 && j < 23) p.scores[static_cast<std::size_t>(i * total_keys + j)] = neg_inf;
      p.scores[static_cast<std::size_t>(3 * total_keys + at)] = nan;
      const Result got = tiled_softmax(p, real_step);
      EXPECT_TRUE(std::isnan(got.lse[3])) << "NaN at key " << at;
      for (index_t c = 0; c < value_cols; ++c)
        EXPECT_TRUE(std::isnan(got.o[static_cast<std::size_t>(3 * value_cols + c)])) << "NaN at key " << at;
      for (index_t i = 0; i < rows; ++i)
        if (i != 3 && i != 2) {
          EXPECT_FALSE(std::isnan(got.lse[static_cast<std::size_t>(i)])) << "row " << i;
        }
    }
  }
}

// The step for a V tile with an Inf or NaN: a row that sees the key gets it (NaN), a row
// whose score for it is -inf never multiplies it, and every other value is the same as the
// plain step's (the same fused multiply-adds in the same order).
TEST(OnlineSoftmax, VisibleValuesStepSkipsMaskedKeys) {
  ScratchArena arena(1 << 16);
  auto s1 = carve_tile<float>(arena, 3, 20), s2 = carve_tile<float>(arena, 3, 20);
  auto v = carve_tile<float>(arena, 20, 8);
  auto o1 = carve_tile<float>(arena, 3, 8), o2 = carve_tile<float>(arena, 3, 8);
  auto st1 = ops::RowStats::carve(arena, 3), st2 = ops::RowStats::carve(arena, 3);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 20; ++j) s1(i, j) = s2(i, j) = normal(rng);
  for (index_t j = 0; j < 20; ++j)
    for (index_t c = 0; c < 8; ++c) v(j, c) = normal(rng);
  s1(0, 5) = s2(0, 5) = neg_inf;  // row 0 does not see key 5
  for (auto* o : {&o1, &o2})
    for (index_t i = 0; i < 3; ++i)
      for (index_t c = 0; c < 8; ++c) (*o)(i, c) = normal(rng);
  st1.reset(3);
  st2.reset(3);
  ops::online_softmax_step(s1, st1, o1, 0.5f);  // the plain step and P V with finite V
  ops::matmul_accumulate(o1, s1, v);
  v(5, 2) = std::numeric_limits<float>::quiet_NaN();  // only the rare path sees this
  ops::online_softmax_step_visible_values(s2, st2, o2, v, 0.5f);
  for (index_t c = 0; c < 8; ++c) {
    EXPECT_EQ(o2(0, c), o1(0, c)) << "row 0 does not see key 5, c " << c;
    for (index_t i = 1; i < 3; ++i) {
      if (c == 2) {
        EXPECT_TRUE(std::isnan(o2(i, c))) << "row " << i << " sees key 5";
      } else {
        EXPECT_EQ(o2(i, c), o1(i, c)) << "row " << i << ", c " << c;
      }
    }
  }
  for (index_t i = 0; i < 3; ++i) {
    EXPECT_EQ(st2.max[i], st1.max[i]);
    EXPECT_EQ(st2.sum[i], st1.sum[i]);
  }
}

TEST(OnlineSoftmax, RowStatsResetAndSlice) {
  ScratchArena arena(1 << 12);
  auto stats = ops::RowStats::carve(arena, 8);
  EXPECT_EQ(arena.used(), ops::RowStats::footprint(8));
  stats.reset(8);
  for (index_t i = 0; i < 8; ++i) {
    EXPECT_EQ(stats.max[i], neg_inf);
    EXPECT_EQ(stats.sum[i], 0.0f);
  }
  stats.max[5] = 3.0f;
  const auto s = stats.slice(4, 3);
  EXPECT_EQ(s.max[1], 3.0f);
  EXPECT_EQ(s.max.size(), 3);
}

TEST(TileOps, FillAndScaleRespectTheExtent) {
  ScratchArena arena(1 << 16);
  auto t = carve_tile<float>(arena, 5, 40);
  ops::fill(t, 1.0f);
  t.set_extent(3, 17);
  ops::scale(t, 4.0f);
  t.set_extent(5, 40);
  for (index_t r = 0; r < 5; ++r)
    for (index_t c = 0; c < 40; ++c) ASSERT_EQ(t(r, c), (r < 3 && c < 17) ? 4.0f : 1.0f) << r << "," << c;
}

}  // namespace
}  // namespace tileattn::test
