// tests/kernels/backward_io_test.cpp: the backward's HBM traffic, counted by its tile loads and
// stores, equals FlashAttention-2's backward IO formula for the plan it ran: O and dO read
// once and D written (preprocessing); K and V read and dK, dV written once per key tile;
// for every (key tile, query head, query tile that sees the key tile): Q, dO, LSE and D
// read, and the fp32 dQ accumulator read and written; the accumulator read and dQ written
// once (epilogue). In every storage type (2 bytes per bf16 / fp16 element).
#include <gtest/gtest.h>

#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

/// The formula, with the rows each key tile's item visits counted from the mask directly.
IoCounts expected_io(const ProblemShape& s, const BackwardTilePlan& plan, bool causal, std::size_t elt) {
  const auto u = [](index_t x) { return static_cast<std::uint64_t>(x); };
  const index_t offset = s.seqlen_k - s.seqlen_q, br = plan.query_tile_rows, bc = plan.key_tile_rows;
  IoCounts io;
  const std::uint64_t bh = u(s.batch * s.heads), bhkv = u(s.batch * s.heads_kv);
  io.bytes_read += bh * u(s.seqlen_q * s.head_dim_v) * 2 * elt;  // O, dO
  io.bytes_written += bh * u(s.seqlen_q) * 4;                     // D
  io.bytes_read += bhkv * u(s.seqlen_k * (s.head_dim + s.head_dim_v)) * elt;     // K, V
  io.bytes_written += bhkv * u(s.seqlen_k * (s.head_dim + s.head_dim_v)) * elt;  // dK, dV
  for (index_t col0 = 0; col0 < s.seqlen_k; col0 += bc) {
    // rows that see a key of [col0, col0 + cols): i + offset >= col0 when causal
    index_t lo = 0, hi = s.seqlen_q;
    if (causal) lo = std::clamp<index_t>(col0 - offset, 0, s.seqlen_q);
    const index_t group = std::min<index_t>(32, br);  // visits start at a multiple (kernels::rows_visiting)
    if (lo < hi) lo = lo / group * group;
    index_t rows = 0;
    for (index_t t = lo / br; t * br < hi; ++t) rows += std::min(hi, (t + 1) * br) - std::max(lo, t * br);
    io.bytes_read += bh * u(rows) * (u(s.head_dim + s.head_dim_v) * elt + 8 + u(s.head_dim) * 4);  // Q dO LSE D acc
    io.bytes_written += bh * u(rows) * u(s.head_dim) * 4;                                           // acc
  }
  io.bytes_read += bh * u(s.seqlen_q * s.head_dim) * 4;       // accumulator
  io.bytes_written += bh * u(s.seqlen_q * s.head_dim) * elt;  // dQ
  return io;
}

template <class T>
void check_io(ProblemShape s, bool causal, std::size_t budget) {
  SCOPED_TRACE(std::string(type_name<T>()) + (causal ? " causal" : "") + ", budget " + std::to_string(budget));
  BackwardProblem<T> p(s, 3);
  BackwardOptions opts;
  opts.causal = causal;
  opts.sram_budget_bytes = budget;
  p.forward(opts);
  IoCounts counts;
  opts.io_counts = &counts;
  p.backward(opts);
  const BackwardTilePlan plan = backward_tiles({s.head_dim, s.head_dim_v, s.seqlen_q, s.seqlen_k, s.batch * s.heads_kv}, opts);
  const IoCounts want = expected_io(s, plan, causal, sizeof(T));
  EXPECT_EQ(counts.bytes_read, want.bytes_read);
  EXPECT_EQ(counts.bytes_written, want.bytes_written);
}

TEST(BackwardIo, MatchesTheFormula) {
  for (bool causal : {false, true})
    for (std::size_t budget : {std::size_t{0}, std::size_t{50000}}) {
      check_io<float>({2, 203, 257, 4, 2, 32, 24}, causal, budget);
      // bf16 pair tiles are multiples of 32 (32 x 32 at least: 55552 bytes at head_dim 40).
      check_io<bf16>({1, 130, 100, 2, 1, 40, 40}, causal, budget ? budget + 20000 : 0);
      check_io<fp16>({1, 64, 300, 3, 3, 16, 16}, causal, budget);
    }
}

TEST(BackwardIo, KeyTrafficFallsWithLargerKeyTiles) {
  // Q, dO and the dQ accumulator move once per key tile: a larger budget (larger Bc) moves less.
  // One thread: with many, both plans split key tiles for parallelism down to the same size
  // (on the 16-thread Xeon both reached 32 keys and moved the same bytes).
  const ProblemShape s{1, 512, 512, 2, 2, 64, 64};
  BackwardProblem<float> p(s, 4);
  BackwardOptions opts;
  opts.execution = {Backend::serial, 1};
  p.forward(opts);
  IoCounts small, large;
  opts.sram_budget_bytes = 120000;
  opts.io_counts = &small;
  p.backward(opts);
  opts.sram_budget_bytes = 0;
  opts.io_counts = &large;
  p.backward(opts);
  EXPECT_LT(large.bytes_read, small.bytes_read);
}

}  // namespace
}  // namespace tileattn::test
