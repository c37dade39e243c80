// tests/kernels/backward_determinism_test.cpp: the backward's gradients are bitwise identical
// for every backend (serial, OpenMP, oneTBB), thread count (1, 2, 3, 5) and SRAM budget (so
// tile sizes, odd key tiles among them), in every storage type, with causal masks, GQA, varlen-like uneven work and
// every extra gradient; and repeated calls agree (the ordered dQ sums leave nothing to timing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

template <class T>
struct Outputs {
  std::vector<T> dq, dk, dv;
  std::vector<float> dsinks, dbias;
  bool operator==(const Outputs& o) const {
    const auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(dq, o.dq) && same(dk, o.dk) && same(dv, o.dv) && same(dsinks, o.dsinks) && same(dbias, o.dbias);
  }
};

template <class T>
Outputs<T> run(BackwardProblem<T>& p, BackwardOptions opts, std::vector<float>& bias, Execution exec,
               std::size_t budget) {
  Outputs<T> out;
  out.dsinks.assign(static_cast<std::size_t>(p.s.heads), 0.0f);
  out.dbias.assign(bias.size(), 0.0f);
  opts.dsinks = out.dsinks;
  opts.dbias = {out.dbias.data(), opts.bias.shape, opts.bias.stride};
  opts.execution = exec;
  opts.sram_budget_bytes = budget;
  p.backward(opts);
  out.dq = p.dq;
  out.dk = p.dk;
  out.dv = p.dv;
  return out;
}

/// SRAM budgets to compare: the default, two fixed ones, and the working sets of small tiles
/// with odd key tiles (3 x 5, 17 x 47, 17 x 96). bf16 pair operands take tiles of multiples
/// of 32 (or whole sequences), and reject a budget below their smallest tiles.
template <class T>
std::vector<std::size_t> budgets(const ProblemShape& s) {
  const TileOperands ops = kernels::tile_operands_without_panels<T>();  // (dispatched builds too)
  const auto tiles = [&](index_t br, index_t bc) {
    return backward_working_set_bytes(br, bc, s.head_dim, s.head_dim_v, true, ops);
  };
  return {0, 60000, 200000, tiles(3, 5), tiles(17, 47), tiles(17, 96)};
}

/// Whether the planner may reject `budget` for this problem: only below its smallest tiles.
template <class T>
bool may_reject(const ProblemShape& s, std::size_t budget) {
  const TileOperands ops = kernels::tile_operands_without_panels<T>();  // (dispatched builds too)
  const auto [br, bc] = detail::smallest_backward_tiles(s.seqlen_q, s.seqlen_k, ops);
  return budget < backward_working_set_bytes(br, bc, s.head_dim, s.head_dim_v, true, ops);
}

/// large_scores: scores of hundreds (scale 40, no softcap), where the backward recomputes P
/// from the forward's row statistics (|LSE| >= 256), on tiles of its own.
template <class T>
void check_deterministic(ProblemShape s, bool causal, bool large_scores = false) {
  BackwardProblem<T> p(s, 5);
  std::vector<float> sinks(static_cast<std::size_t>(s.heads), 0.3f);
  std::vector<float> bias(static_cast<std::size_t>(s.heads * s.seqlen_q * s.seqlen_k));
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i % 97);
  BackwardOptions opts;
  opts.causal = causal;
  opts.softcap = large_scores ? 0.0f : 4.0f;
  if (large_scores) opts.softmax_scale = 40.0f;
  opts.sinks = sinks;
  opts.bias = {bias.data(), {1, s.heads, s.seqlen_q, s.seqlen_k}, {0, s.seqlen_q * s.seqlen_k, s.seqlen_k, 1}};
  p.forward(opts);
  if (large_scores) {
    float largest = 0.0f;
    for (float x : p.lse) largest = std::max(largest, std::abs(x));
    ASSERT_GE(largest, detail::exact_row_stats_lse) << "no row takes the row-statistics path";
  }
  const Outputs<T> base = run(p, opts, bias, {Backend::serial, 1}, 0);
  for (Backend b : compiled_backends())
    for (int threads : {1, 2, 3, 5})
      for (std::size_t budget : budgets<T>(s)) {
        SCOPED_TRACE(std::string(to_string(b)) + " x " + std::to_string(threads) + " threads, budget " +
                     std::to_string(budget));
        try {
          EXPECT_TRUE(run(p, opts, bias, {b, threads}, budget) == base);
        } catch (const budget_error& e) {
          EXPECT_TRUE(may_reject<T>(s, budget)) << e.what();
          EXPECT_EQ(e.parameter(), "sram_budget_bytes");
        }
      }
  for (int repeat = 0; repeat < 5; ++repeat) EXPECT_TRUE(run(p, opts, bias, {Backend::automatic, 3}, 0) == base);
}

TEST(BackwardDeterminism, FloatCausalGqa) { check_deterministic<float>({2, 300, 333, 4, 2, 32, 32}, true); }
TEST(BackwardDeterminism, FloatOneHeadManyKeyTiles) { check_deterministic<float>({1, 257, 700, 1, 1, 16, 16}, false); }
TEST(BackwardDeterminism, Bf16Causal) { check_deterministic<bf16>({1, 190, 190, 2, 1, 40, 24}, true); }
TEST(BackwardDeterminism, Bf16OddKeys) { check_deterministic<bf16>({2, 150, 191, 4, 2, 64, 64}, false); }
TEST(BackwardDeterminism, LargeScoresFloat) { check_deterministic<float>({1, 150, 170, 2, 1, 32, 32}, true, true); }
TEST(BackwardDeterminism, LargeScoresBf16) { check_deterministic<bf16>({1, 150, 170, 2, 1, 32, 32}, false, true); }
TEST(BackwardDeterminism, Fp16) { check_deterministic<fp16>({2, 100, 120, 2, 2, 16, 16}, false); }

}  // namespace
}  // namespace tileattn::test
