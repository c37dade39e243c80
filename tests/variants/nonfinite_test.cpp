// tests/variants/nonfinite_test.cpp: NaN and Inf in the inputs (docs/options.md, "NaN and
// Inf"), for every tile size, backend and thread count: a NaN score a row sees makes the
// row's O and LSE NaN (never "this row saw no key"); a NaN or Inf at a key a row cannot
// see (a bias entry, a V row) never reaches that row; only masking makes a row empty.
#include <gtest/gtest.h>

#include <limits>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

constexpr float nan = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

/// Budgets that tile the same problem differently: 40 rows, the detected L2, 16 and 3 rows
/// (the key tile is fixed: the budget moves the query tiles).
std::vector<std::size_t> budgets(index_t d) {
  return {rows_budget(40, d), 0, rows_budget(16, d), rows_budget(3, d)};
}

/// Every execution the suites rotate through: each backend at 1 to 3 threads.
std::vector<Execution> executions() {
  std::vector<Execution> out;
  for (Backend b : compiled_backends())
    for (int threads : {1, 2, 3}) out.push_back({b, threads});
  return out;
}

bool is_nan_bits(float x) { return std::isnan(x); }

/// The NaN pattern of a buffer: which elements are NaN.
std::vector<bool> nan_pattern(const std::vector<float>& buffer) {
  std::vector<bool> out(buffer.size());
  for (std::size_t i = 0; i < buffer.size(); ++i) out[i] = is_nan_bits(buffer[i]);
  return out;
}

/// Runs p under every budget and execution; checks each run against the reference (NaN
/// rows included) and that every run gives the same NaN pattern as the first.
void expect_same_everywhere(Problem& p, ForwardOptions opts) {
  std::vector<bool> first;
  for (std::size_t budget : budgets(p.shape().head_dim))
    for (const Execution& exec : executions()) {
      SCOPED_TRACE("budget " + std::to_string(budget) + ", " + to_string(exec.backend) + " x " +
                   std::to_string(exec.num_threads));
      opts.sram_budget_bytes = budget;
      opts.execution = exec;
      p.reset_outputs();
      EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
      const std::vector<bool> pattern = nan_pattern(p.outputs());
      if (first.empty()) first = pattern;
      EXPECT_TRUE(pattern == first) << "the NaN pattern depends on the tiling or the threads";
    }
}

// The review's case: K[j, 3] = NaN for the first 48 keys. Every row sees them, so every
// row is NaN, whatever the key tile (before: finite at Bc = 48, NaN at Bc = 64).
TEST(NonFinite, NaNKeysCoveringWholeKeyTilesMakeEveryRowNaN) {
  Problem p({1, 1, 1, 4, 200, 64}, KvStorage::contiguous, 7);
  const TensorView<float> k = p.kv().mutable_k();
  for (index_t j = 0; j < 48; ++j) k(0, j, 0, 3) = nan;
  ForwardOptions opts;
  expect_same_everywhere(p, opts);
  for (float x : p.outputs()) ASSERT_TRUE(std::isnan(x));
}

// A NaN in one element of Q: that row is NaN (not O = 0, LSE = -inf); every other row is
// exactly as without it.
TEST(NonFinite, NaNInOneQueryElementMakesThatRowNaN) {
  for (bool causal : {false, true}) {
    Problem p({2, 3, 3, 37, 53, 32}, KvStorage::window, 11);
    p.q().view()(1, 5, 2, 7) = nan;
    ForwardOptions opts;
    opts.causal = causal;
    expect_same_everywhere(p, opts);
    const TensorView<const float> o = p.o().cview();
    const LseView lse = p.lse().view();
    for_each_index(o.shape, [&](index_t b, index_t i, index_t h, index_t c) {
      const bool poisoned = b == 1 && i == 5 && h == 2;
      ASSERT_EQ(std::isnan(o(b, i, h, c)), poisoned) << b << " " << i << " " << h << " " << c;
      if (c == 0) {
        ASSERT_EQ(std::isnan(lse(b, h, i)), poisoned);
      }
    });
  }
}

// A NaN bias entry a row sees makes that row NaN, including when the NaN entries cover
// exactly the keys of its first key tile (where the running max is still -inf).
TEST(NonFinite, NaNBiasEntriesMakeTheirRowNaN) {
  for (index_t nan_keys : {1, 16, 48, 64}) {
    Problem p({1, 2, 2, 9, 130, 64}, KvStorage::contiguous, 3);
    ScoreBuffer<float> bias({1, 2, 9, 130}, ScoreLayout::contiguous,
                            [&](index_t, index_t h, index_t i, index_t j) {
                              return h == 1 && i == 4 && j < nan_keys ? nan : 0.25f;
                            });
    ForwardOptions opts;
    opts.bias = bias.view();
    SCOPED_TRACE(std::to_string(nan_keys) + " NaN keys");
    expect_same_everywhere(p, opts);
    EXPECT_TRUE(std::isnan(p.lse().view()(0, 1, 4)));
    EXPECT_FALSE(std::isnan(p.lse().view()(0, 1, 3)));
  }
}

// NaN, +Inf and -Inf bias entries at keys a row cannot see (causal, window, boolean mask)
// change nothing: the masked score is -inf whatever the bias says there.
TEST(NonFinite, NonFiniteBiasAtMaskedKeysChangesNothing) {
  const Shape s{2, 2, 1, 40, 40, 32};
  ScoreBuffer<bool> mask({1, 1, 40, 40}, ScoreLayout::contiguous,
                         [](index_t, index_t, index_t i, index_t j) { return (i + j) % 5 != 0; });
  for (float poison : {nan, inf, -inf}) {
    const auto hidden = [&](index_t i, index_t j) { return j > i || (i + j) % 5 == 0 || j < i - 20; };
    ScoreBuffer<float> clean({2, 2, 40, 40}, ScoreLayout::transposed,
                             [](index_t b, index_t h, index_t i, index_t j) { return 0.1f * static_cast<float>((b + h + i * j) % 7); });
    ScoreBuffer<float> poisoned({2, 2, 40, 40}, ScoreLayout::transposed, [&](index_t b, index_t h, index_t i, index_t j) {
      return hidden(i, j) ? poison : 0.1f * static_cast<float>((b + h + i * j) % 7);
    });
    ForwardOptions opts;
    opts.causal = true;
    opts.window_left = 20;
    opts.mask = mask.view();
    Problem p(s, KvStorage::window, 5);
    opts.bias = poisoned.view();
    expect_same_everywhere(p, opts);
    for (std::size_t budget : budgets(s.head_dim)) {  // bitwise what the clean bias gives
      opts.sram_budget_bytes = budget;
      opts.bias = clean.view();
      p.run(opts);
      const std::vector<float> want = p.outputs();
      opts.bias = poisoned.view();
      p.reset_outputs();
      p.run(opts);
      EXPECT_TRUE(bitwise_equal(p.outputs(), want)) << "bias " << poison << ", budget " << budget;
    }
  }
}

// A NaN or Inf in V reaches exactly the rows that see its key: under the causal mask rows
// before key 60 are bitwise what they are without it, for every tiling; rows that see it
// get a non-finite value in that column and the same bits elsewhere.
TEST(NonFinite, NonFiniteValuesReachOnlyRowsThatSeeTheirKey) {
  for (float poison : {nan, inf, -inf}) {
    const Shape s{1, 4, 2, 100, 100, 48};
    Problem p(s, KvStorage::interleaved, 9);
    ForwardOptions opts;
    opts.causal = true;
    float& value = p.kv().mutable_v()(0, 60, 1, 5);  // K/V head 1 serves query heads 2 and 3
    const float finite = value;
    value = poison;
    SCOPED_TRACE("V = " + std::to_string(poison));
    expect_same_everywhere(p, opts);
    for (std::size_t budget : budgets(s.head_dim))
      for (const Execution& exec : executions()) {
        opts.sram_budget_bytes = budget;
        opts.execution = exec;
        value = finite;
        p.run(opts);
        const std::vector<float> clean_o = p.o().buffer();
        value = poison;
        p.reset_outputs();
        p.run(opts);
        const TensorView<const float> o = p.o().cview();
        const TensorView<const float> want = make_bshd<const float>(clean_o.data(), 1, 100, 4, 48);
        for_each_index(o.shape, [&](index_t b, index_t i, index_t h, index_t c) {
          const bool reached = h >= 2 && i >= 60 && c == 5;
          if (reached) {
            ASSERT_FALSE(std::isfinite(o(b, i, h, c))) << "row " << i << " head " << h << ", budget " << budget;
          } else {
            ASSERT_EQ(o(b, i, h, c), want(b, i, h, c)) << "row " << i << " head " << h << " col " << c
                                                       << ", budget " << budget;
          }
        });
      }
  }
}

// Inf in Q or K makes the scores it touches +-Inf or NaN: a row that sees +Inf (or
// Inf - Inf) is NaN, exactly as IEEE arithmetic on the definition gives (the reference).
TEST(NonFinite, InfiniteQueriesAndKeysFollowIeee) {
  Problem p({1, 2, 2, 20, 30, 16}, KvStorage::window, 13);
  p.q().view()(0, 3, 0, 2) = inf;
  p.kv().mutable_k()(0, 7, 1, 4) = -inf;
  ForwardOptions opts;
  opts.causal = true;
  expect_same_everywhere(p, opts);
  EXPECT_TRUE(std::isnan(p.lse().view()(0, 0, 3)));
}

// Only masking empties a row: a row whose every score is -inf from the bias has no keys
// (O = 0, LSE = -inf), one whose scores are all NaN is NaN.
TEST(NonFinite, MinusInfinityBiasEmptiesARowNaNDoesNot) {
  Problem p({1, 1, 1, 6, 70, 32}, KvStorage::contiguous, 17);
  ScoreBuffer<float> bias({1, 1, 6, 70}, ScoreLayout::contiguous, [](index_t, index_t, index_t i, index_t) {
    return i == 1 ? -inf : i == 2 ? nan : 0.0f;
  });
  ForwardOptions opts;
  opts.bias = bias.view();
  expect_same_everywhere(p, opts);
  const LseView lse = p.lse().view();
  EXPECT_EQ(lse(0, 0, 1), -inf);
  EXPECT_TRUE(std::isnan(lse(0, 0, 2)));
  for (index_t c = 0; c < 32; ++c) {
    EXPECT_EQ(p.o().cview()(0, 1, 0, c), 0.0f);
    EXPECT_TRUE(std::isnan(p.o().cview()(0, 2, 0, c)));
  }
}

}  // namespace
}  // namespace tileattn::test
