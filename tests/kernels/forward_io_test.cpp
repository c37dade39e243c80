// tests/kernels/forward_io_test.cpp: the HBM traffic tileattn::forward counts (ForwardOptions::
// io_counts, memory/io_counter.hpp) equals the analytic count for the planned tiles (Q and O
// moved once, K and V once per query tile, only the keys a causal tile can see), for every
// backend; and for N >= 1024 it is far below the traffic of standard attention.
#include <gtest/gtest.h>

#include <tuple>

#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

constexpr std::uint64_t f32 = sizeof(float);

struct Problem {
  index_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  bool causal;
  bool with_lse;
};

/// The traffic the tiled forward must move, derived from the plan alone:
/// every query tile of every (batch, K/V head, head chunk) reads its Q rows once, reads the
/// K and V rows its last row can see once (all Nk without a mask; min(Nk, row0 + rows +
/// Nk - Nq) clamped at 0 under the bottom-right causal mask), and writes its O rows and LSE
/// entries once.
IoCounts analytic_io(const Problem& p, const TilePlan& plan) {
  const index_t group = p.heads_q / p.heads_kv;
  const index_t chunks = (group + plan.heads_per_tile - 1) / plan.heads_per_tile;
  std::uint64_t read = 0;
  for (index_t row0 = 0; row0 < p.seqlen_q; row0 += plan.query_tile_rows) {
    const index_t rows = std::min(plan.query_tile_rows, p.seqlen_q - row0);
    const index_t keys =
        p.causal ? std::clamp<index_t>(row0 + rows + p.seqlen_k - p.seqlen_q, 0, p.seqlen_k)
                 : p.seqlen_k;
    read += static_cast<std::uint64_t>(group * rows * p.head_dim);        // Q, every query head
    read += static_cast<std::uint64_t>(chunks * 2 * keys * p.head_dim);   // K and V, per chunk
  }
  IoCounts io;
  io.bytes_read = read * static_cast<std::uint64_t>(p.batch * p.heads_kv) * f32;
  io.bytes_written = static_cast<std::uint64_t>(p.batch * p.heads_q * p.seqlen_q) *
                     static_cast<std::uint64_t>(p.head_dim + (p.with_lse ? 1 : 0)) * f32;
  return io;
}

/// Runs forward with io_counts on and returns the counts.
IoCounts counted_forward(const Problem& p, std::size_t budget, Execution exec = {Backend::serial, 1}) {
  const Dims qd{p.batch, p.seqlen_q, p.heads_q, p.head_dim};
  const Dims kd{p.batch, p.seqlen_k, p.heads_kv, p.head_dim};
  HostTensor q(qd, Layout::bshd), k(kd, Layout::bshd), v(kd, Layout::bshd), o(qd, Layout::bshd);
  HostLse lse(p.batch, p.heads_q, p.seqlen_q);
  q.fill_normal(1);
  k.fill_normal(2);
  v.fill_normal(3);
  IoCounts counts{99, 99};  // forward overwrites, never adds to, what was there
  ForwardOptions opts;
  opts.causal = p.causal;
  opts.sram_budget_bytes = budget;
  opts.io_counts = &counts;
  opts.execution = exec;
  forward(q.cview(), k.cview(), v.cview(), o.view(), p.with_lse ? lse.view() : LseView{}, opts);
  return counts;
}

/// The plan forward() uses for p under this budget and execution (the worker count may
/// split query tiles).
TilePlan plan_for(const Problem& p, std::size_t budget, Execution exec = {Backend::serial, 1}) {
  ForwardOptions opts;
  opts.sram_budget_bytes = budget;
  opts.execution = exec;
  return forward_tiles(PlanShape{p.head_dim, p.head_dim, p.seqlen_q, p.seqlen_k, p.heads_q / p.heads_kv,
                                p.batch * p.heads_kv},
                      opts);
}

// ---- Exact counts ----------------------------------------------------------------------------

using ExactParam = std::tuple<std::pair<index_t, index_t>, index_t, int, bool>;

std::size_t budget_of(int kind, index_t d) {
  switch (kind) {
    case 0: return 0;                                      // detected L2
    case 1: return std::max<std::size_t>(64 * 1024, rows_budget(1, d));  // 64 KiB, or one row where it holds none
    case 2: return rows_budget(16, d);   // ~16 x 32 tiles
    default: return rows_budget(3, d);    // a few rows and keys
  }
}

std::string exact_name(const ::testing::TestParamInfo<ExactParam>& info) {
  static const char* budgets[] = {"l2", "64k", "small", "tiny"};
  const auto shape = std::get<0>(info.param);
  return std::to_string(shape.first) + "x" + std::to_string(shape.second) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_" + budgets[std::get<2>(info.param)] +
         (std::get<3>(info.param) ? "_causal" : "_full");
}

class ForwardIoExact : public ::testing::TestWithParam<ExactParam> {};

TEST_P(ForwardIoExact, EqualsTheAnalyticCountOnEveryBackend) {
  const auto [shape, d, budget_kind, causal] = GetParam();
  const auto [nq, nk] = shape;
  const bool with_lse = (nq + budget_kind) % 2 == 0;
  const Problem p{2, 3, 3, nq, nk, d, causal, with_lse};
  const std::size_t budget = budget_of(budget_kind, d);
  const TilePlan plan = plan_for(p, budget);
  SCOPED_TRACE("tiles " + std::to_string(plan.query_tile_rows) + " x " + std::to_string(plan.key_tile_rows) +
               (with_lse ? ", with lse" : ", without lse"));
  const IoCounts expected = analytic_io(p, plan);
  const IoCounts got = counted_forward(p, budget);
  EXPECT_EQ(got.bytes_read, expected.bytes_read);
  EXPECT_EQ(got.bytes_written, expected.bytes_written);

  if (!causal) {  // the closed form of the issue: B H (Nq d + Tq Nk d 2) 4, B H (Nq d + Nq) 4
    const auto B = static_cast<std::uint64_t>(p.batch), H = static_cast<std::uint64_t>(p.heads_q);
    const auto Nq = static_cast<std::uint64_t>(nq), Nk = static_cast<std::uint64_t>(nk),
               D = static_cast<std::uint64_t>(d), Tq = static_cast<std::uint64_t>(plan.query_tiles(nq));
    EXPECT_EQ(got.bytes_read, B * H * (Nq * D + Tq * Nk * D * 2) * f32);
    EXPECT_EQ(got.bytes_written, B * H * (Nq * D + (with_lse ? Nq : 0)) * f32);
  }
  // Counts are per tile move, not per thread: on every backend and thread count they are
  // the analytic count of the plan for that many workers (more workers may split query
  // tiles, which reads K/V once more per extra tile).
  for (Backend b : compiled_backends())
    for (int threads : {2, 3}) {
      const IoCounts other = counted_forward(p, budget, {b, threads});
      EXPECT_EQ(other, analytic_io(p, plan_for(p, budget, {b, threads})))
          << to_string(b) << ", " << threads << " threads";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ForwardIoExact,
    ::testing::Combine(::testing::Values(std::pair<index_t, index_t>{1, 1}, std::pair<index_t, index_t>{17, 127},
                                         std::pair<index_t, index_t>{127, 17}, std::pair<index_t, index_t>{300, 257},
                                         std::pair<index_t, index_t>{1000, 1}, std::pair<index_t, index_t>{1, 1000}),
                       ::testing::Values<index_t>(32, 128), ::testing::Range(0, 4), ::testing::Bool()),
    exact_name);

// The small budgets really give many query tiles, so "K and V once per query tile" is tested.
TEST(ForwardIo, SmallBudgetsGiveManyQueryTiles) {
  const Problem p{1, 1, 1, 300, 257, 128, false, true};
  EXPECT_GE(plan_for(p, budget_of(2, 128)).query_tiles(300), 5);
  EXPECT_GE(plan_for(p, budget_of(3, 128)).query_tiles(300), 50);
}

// Grouped-query attention: each K/V tile is read once per group of query heads packed into
// a tile (once per head chunk when a group is split).
TEST(ForwardIo, GroupedQueryHeadsReadKvOncePerGroup) {
  for (bool causal : {false, true})
    for (int budget_kind : {0, 2, 3}) {
      const Problem p{2, 8, 2, 45, 70, 64, causal, true};
      const std::size_t budget = budget_of(budget_kind, 64);
      const TilePlan plan = plan_for(p, budget);
      SCOPED_TRACE("heads per tile " + std::to_string(plan.heads_per_tile) + ", tiles " +
                   std::to_string(plan.query_tile_rows) + " x " + std::to_string(plan.key_tile_rows));
      EXPECT_EQ(counted_forward(p, budget), analytic_io(p, plan));
    }
}

// ---- Against standard attention ----------------------------------------------------------------

// Standard attention materializes S = Q K^T and P = softmax(S), both N x N in fp32:
// it reads Q and K (2 N d), writes S (N^2), reads S (N^2), writes P (N^2), reads P and V
// (N^2 + N d) and writes O (N d): at least 4 B H (3 N d + 4 N^2 + N d) bytes, not counting
// the LSE.
std::uint64_t standard_attention_bytes(index_t B, index_t H, index_t N, index_t d) {
  const auto n = static_cast<std::uint64_t>(N), dd = static_cast<std::uint64_t>(d);
  return 4 * static_cast<std::uint64_t>(B * H) * (3 * n * dd + 4 * n * n + n * dd);
}

using LargeParam = std::tuple<index_t, index_t>;  // N, d

class ForwardIoVsStandard : public ::testing::TestWithParam<LargeParam> {};

// The issue: "for N >= 1024, [the counted traffic] is far below the traffic of standard
// attention, which materializes the N x N matrix". Asserted as at least 4x below, with and
// without the causal mask, at a 1 MiB budget and at the detected L2 where it is as large;
// a smaller L2 (512 KiB on Zen 2/3: Br = 208 at d = 128, a factor of about 3) is held to
// 2.5x, which the FA1 cap below (a factor 2) still fails.
// Expected: with Br query rows resident (about M / 2d, M = budget in floats), K and V are
// read N / Br times: 2 N^2 d / Br floats against standard attention's 4 N^2, a factor
// 2 Br / d. A planner that caps Br at d (FlashAttention-1's
// Br = min(M / 4d, d) taken in FA2's loop order) only reaches a factor 2; this test failed
// on it before tile_plan.hpp's commit 9420840.
TEST_P(ForwardIoVsStandard, FarBelowStandardAttention) {
  const auto [N, d] = GetParam();
  for (std::size_t budget : {std::size_t{1} << 20, std::size_t{0}})
    for (bool causal : {false, true}) {
      // One worker: the plan that minimizes traffic (more workers may split query tiles
      // for parallelism, which forward_io_test's exact counts cover).
      const Problem p{1, 2, 2, N, N, d, causal, true};
      const IoCounts io = counted_forward(p, budget, {Backend::serial, 1});
      const std::uint64_t tiled = io.bytes_read + io.bytes_written;
      const std::uint64_t standard = standard_attention_bytes(1, 2, N, d);
      const TilePlan plan = plan_for(p, budget, {Backend::serial, 1});
      const double ratio = static_cast<double>(standard) / static_cast<double>(tiled);
      RecordProperty((causal ? "ratio_causal_budget" : "ratio_full_budget") + std::to_string(budget),
                     std::to_string(ratio));
      EXPECT_EQ(io, analytic_io(p, plan));
      const double least = plan.sram_budget_bytes >= (std::size_t{1} << 20) ? 4.0 : 2.5;
      EXPECT_GT(ratio, least) << (causal ? "causal" : "non-causal") << ", budget " << budget
                            << ": tiled traffic is only standard / " << ratio << " with tiles "
                            << plan.query_tile_rows << " x " << plan.key_tile_rows;
    }
}

INSTANTIATE_TEST_SUITE_P(LargeN, ForwardIoVsStandard,
                         ::testing::Combine(::testing::Values<index_t>(1024, 2048),
                                            ::testing::Values<index_t>(64, 128)),
                         [](const ::testing::TestParamInfo<LargeParam>& info) {
                           return "N" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tileattn::test
