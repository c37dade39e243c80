// tests/variants/window_test.cpp: sliding windows (window_left / window_right, -1 unbounded),
// causal masking (window_right forced to 0) and the two alignments (bottom-right as
// FlashAttention >= 2.1, top-left as PyTorch SDPA) with seqlen_q != seqlen_k both ways,
// against the reference; rows that see no key; and the keys the kernel skips outside the
// window, counted in HBM bytes. The same for attention_chunk (chunked local attention),
// alone and with causal and a window.
#include <gtest/gtest.h>

#include <sstream>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

struct WindowCase {
  index_t seqlen_q, seqlen_k, head_dim;
  bool causal;
  index_t left, right;
  MaskAlignment alignment;
};

std::string case_name(const WindowCase& c) {
  std::ostringstream o;
  o << c.seqlen_q << "x" << c.seqlen_k << "_d" << c.head_dim << (c.causal ? "_causal" : "")
    << "_left" << (c.left < 0 ? std::string("inf") : std::to_string(c.left)) << "_right"
    << (c.right < 0 ? std::string("inf") : std::to_string(c.right))
    << (c.alignment == MaskAlignment::top_left ? "_topleft" : "_bottomright");
  return o.str();
}

std::vector<WindowCase> window_cases() {
  const std::pair<index_t, index_t> seqlens[] = {{67, 67}, {45, 131}, {131, 45}};
  struct Window {
    bool causal;
    index_t left, right;
  };
  const Window windows[] = {
      {true, -1, -1},  // causal alone
      {true, 33, -1},  // causal + window_left (Mistral)
      {false, 16, -1}, // left bound only
      {false, -1, 8},  // right bound only
      {false, 0, 0},   // the diagonal key only
      {false, 20, 5},  // both bounds
      {false, 200, 300},  // bounds wider than the sequences: no mask at all
  };
  std::vector<WindowCase> out;
  int n = 0;
  for (auto [nq, nk] : seqlens)
    for (const Window& w : windows)
      for (MaskAlignment a : {MaskAlignment::bottom_right, MaskAlignment::top_left}) {
        const index_t d = test_head_dims[static_cast<std::size_t>(n++) % test_head_dims.size()];
        out.push_back({nq, nk, d, w.causal, w.left, w.right, a});
      }
  return out;
}

class WindowVsReference : public ::testing::TestWithParam<WindowCase> {};

TEST_P(WindowVsReference, MatchesWithinBound) {
  const WindowCase& c = GetParam();
  Problem p({2, 4, 2, c.seqlen_q, c.seqlen_k, c.head_dim}, KvStorage::window, 13);
  ForwardOptions opts;
  opts.causal = c.causal;
  opts.window_left = c.left;
  opts.window_right = c.right;
  opts.alignment = c.alignment;
  opts.sram_budget_bytes = rows_budget(16, c.head_dim);  // several tiles per window
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
}

INSTANTIATE_TEST_SUITE_P(Windows, WindowVsReference, ::testing::ValuesIn(window_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- Semantics checked without the reference -------------------------------------------------

/// Max |O[b, i, h, :] - V[b, key, h / group, :]| over a query row that must see only `key`.
float distance_to_value_row(Problem& p, index_t b, index_t i, index_t h, index_t key) {
  const index_t group = p.shape().heads_q / p.shape().heads_kv;
  float dist = 0.0f;
  for (index_t c = 0; c < p.shape().head_dim; ++c)
    dist = std::max(dist, std::abs(p.o().cview()(b, i, h, c) - p.kv().v()(b, key, h / group, c)));
  return dist;
}

// window (0, 0): query i sees exactly key i + offset, so O is that V row and LSE is that one
// score; offset = Nk - Nq (bottom-right) or 0 (top-left). Queries whose key falls outside
// [0, Nk) see nothing: O = 0, LSE = -inf.
TEST(WindowSemantics, DiagonalWindowCopiesTheAlignedValueRow) {
  for (auto [nq, nk] : {std::pair<index_t, index_t>{20, 50}, {50, 20}})
    for (MaskAlignment a : {MaskAlignment::bottom_right, MaskAlignment::top_left}) {
      Problem p({1, 2, 1, nq, nk, 32}, KvStorage::interleaved, 5);
      ForwardOptions opts;
      opts.window_left = 0;
      opts.window_right = 0;
      opts.alignment = a;
      p.run(opts);
      const index_t offset = a == MaskAlignment::bottom_right ? nk - nq : 0;
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < nq; ++i) {
          const index_t key = i + offset;
          SCOPED_TRACE(std::to_string(nq) + "x" + std::to_string(nk) + " query " + std::to_string(i));
          if (key >= 0 && key < nk) {
            EXPECT_LE(distance_to_value_row(p, 0, i, h, key), 1e-6f);
            EXPECT_TRUE(std::isfinite(p.lse().view()(0, h, i)));
          } else {
            EXPECT_EQ(p.o().cview()(0, i, h, 0), 0.0f);
            EXPECT_EQ(p.lse().view()(0, h, i), -std::numeric_limits<float>::infinity());
          }
        }
    }
}

// Causal, top-left (PyTorch SDPA's is_causal): the first query sees only the first key, for
// any Nq and Nk. Bottom-right with Nq > Nk: the first Nq - Nk queries see nothing.
TEST(WindowSemantics, CausalAlignmentAnchorsTheDiagonal) {
  Problem p({2, 3, 3, 40, 25, 64}, KvStorage::window, 9);
  ForwardOptions opts;
  opts.causal = true;
  opts.alignment = MaskAlignment::top_left;
  p.run(opts);
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 3; ++h) EXPECT_LE(distance_to_value_row(p, b, 0, h, 0), 1e-6f);

  p.reset_outputs();
  opts.alignment = MaskAlignment::bottom_right;
  const Deviation dev = p.run_and_compare(opts);
  EXPECT_TRUE(within_bounds(dev));
  EXPECT_EQ(rows_without_keys(p.reference(opts)), 2 * 3 * (40 - 25));
  for (index_t i = 0; i < 40 - 25; ++i) EXPECT_EQ(p.lse().view()(1, 2, i), -std::numeric_limits<float>::infinity());
  EXPECT_LE(distance_to_value_row(p, 1, 40 - 25, 2, 0), 1e-6f);  // first query with a key sees key 0 only
}

// causal = true makes window_right 0 whatever it says (FlashAttention's rule), and with
// Nq == Nk the two alignments are the same mask: all bitwise identical.
TEST(WindowSemantics, CausalOverridesWindowRightAndSquareAlignmentsAgree) {
  Problem p({2, 4, 2, 77, 77, 80}, KvStorage::window, 21);
  ForwardOptions opts;
  opts.causal = true;
  opts.window_left = 19;
  opts.sram_budget_bytes = rows_budget(16, 80);
  p.run(opts);
  const std::vector<float> want = p.outputs();
  for (index_t right : {-1, 0, 7, 1000})
    for (MaskAlignment a : {MaskAlignment::bottom_right, MaskAlignment::top_left}) {
      opts.window_right = right;
      opts.alignment = a;
      p.reset_outputs();
      p.run(opts);
      EXPECT_TRUE(bitwise_equal(p.outputs(), want)) << "window_right " << right;
    }
  // And causal equals window (left, 0) without the flag.
  ForwardOptions window_only = opts;
  window_only.causal = false;
  window_only.window_right = 0;
  p.reset_outputs();
  p.run(window_only);
  EXPECT_TRUE(bitwise_equal(p.outputs(), want));
}

// Windows that leave some rows without keys, in the middle of a sequence too: a window
// entirely to the right of the keys (top-left, Nq > Nk), a mask band inside one tile.
TEST(WindowSemantics, RowsWithoutKeysGetZeroAndMinusInfinity) {
  struct Case {
    index_t nq, nk, left, right;
    MaskAlignment alignment;
  };
  for (const Case& c : {Case{90, 30, 3, 2, MaskAlignment::top_left},        // rows >= 33 see nothing
                        Case{30, 90, 5, 0, MaskAlignment::top_left},        // keys past 29 never seen
                        Case{70, 40, 0, 4, MaskAlignment::bottom_right}}) {  // rows < 26 see nothing
    Problem p({1, 4, 4, c.nq, c.nk, 64}, KvStorage::contiguous, 31);
    ForwardOptions opts;
    opts.window_left = c.left;
    opts.window_right = c.right;
    opts.alignment = c.alignment;
    opts.sram_budget_bytes = rows_budget(8, 64);
    EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
    if (c.nq > c.nk) {
      EXPECT_GT(rows_without_keys(p.reference(opts)), 0);
    }
  }
}

// ---- Keys outside the window are never read ---------------------------------------------------

/// K/V bytes read by a causal call at Nq = Nk = n with window_left = left (-1: none) and
/// attention_chunk = chunk (0: none), and in *analytic the kernel loop's count.
std::uint64_t causal_kv_bytes(index_t n, index_t left, index_t chunk, std::uint64_t* analytic) {
  constexpr index_t d = 64;
  Problem p({1, 2, 2, n, n, d}, KvStorage::contiguous, 3);
  ForwardOptions opts;
  opts.causal = true;
  opts.window_left = left;
  opts.attention_chunk = chunk;
  opts.sram_budget_bytes = rows_budget(64, d);
  IoCounts counts;
  opts.io_counts = &counts;
  p.run(opts);
  const TilePlan plan = forward_tiles(PlanShape{d, d, n, n, 1, 2}, opts);
  *analytic = 2 * kv_bytes_per_kv_head(plan, 1, n, VisibleKeys{0, left, 0, n, chunk}, d);
  const std::uint64_t q_bytes = static_cast<std::uint64_t>(n * 2 * d) * sizeof(float);
  return counts.bytes_read - q_bytes;
}

/// The same for a causal sliding window of w keys back.
std::uint64_t window_kv_bytes(index_t n, index_t w, std::uint64_t* analytic) {
  return causal_kv_bytes(n, w, 0, analytic);
}

// K/V bytes per query row depend on the window, not on the sequence length: each query
// tile of Br rows streams Br + w keys at most (the exact count follows the kernel's loop,
// keys [first(p0), end(p_last)) per tile).
TEST(WindowTraffic, KvBytesGrowWithTheWindowNotTheSequence) {
  constexpr index_t w = 96;
  std::uint64_t analytic_short = 0, analytic_long = 0, analytic_wide = 0;
  const std::uint64_t short_seq = window_kv_bytes(1024, w, &analytic_short);
  const std::uint64_t long_seq = window_kv_bytes(4096, w, &analytic_long);
  const std::uint64_t wide = window_kv_bytes(1024, 4 * w, &analytic_wide);
  EXPECT_EQ(short_seq, analytic_short);
  EXPECT_EQ(long_seq, analytic_long);
  EXPECT_EQ(wide, analytic_wide);
  const double per_row_short = static_cast<double>(short_seq) / 1024;
  const double per_row_long = static_cast<double>(long_seq) / 4096;
  // Within 8%: the first query tiles of a sequence see fewer keys, a larger share of 1024
  // rows than of 4096 (key tiles start at multiples of Bc, so each tile reads up to Bc - 1
  // keys before its window).
  EXPECT_NEAR(per_row_long / per_row_short, 1.0, 0.08) << "K/V bytes per query row grew with N";
  // And they grow with the window: (Br + 4w) / (Br + w) for Br = 64 is about 2.9.
  EXPECT_GT(static_cast<double>(wide) / static_cast<double>(short_seq), 2.0);
  // Far below full causal attention, which reads ~N/2 keys per row.
  EXPECT_LT(per_row_long, 0.1 * (4096 / 2) * 2 * 2 * 64 * sizeof(float));
}

// A right bound alone cannot skip keys on the left: bytes follow end(p_last) exactly.
TEST(WindowTraffic, RightBoundOnlyReadsUpToTheLastVisibleKey) {
  constexpr index_t d = 32, nq = 150, nk = 200, right = 10;
  Problem p({1, 1, 1, nq, nk, d}, KvStorage::window, 3);
  ForwardOptions opts;
  opts.window_right = right;
  opts.alignment = MaskAlignment::top_left;
  opts.sram_budget_bytes = rows_budget(16, d);
  IoCounts counts;
  opts.io_counts = &counts;
  p.run(opts);
  const TilePlan plan = forward_tiles(PlanShape{d, d, nq, nk, 1, 1}, opts);
  const std::uint64_t q_bytes = static_cast<std::uint64_t>(nq * d) * sizeof(float);
  EXPECT_EQ(counts.bytes_read - q_bytes,
            kv_bytes_per_kv_head(plan, 1, nq, VisibleKeys{0, -1, right, nk}, d));
}

}  // namespace
}  // namespace tileattn::test

namespace tileattn::test {
namespace {

// Windows at or beyond the sequence, up to INT64_MAX on either side, mean "unbounded":
// full attention (before: int64 overflow in KeyWindow; O = 0, LSE = -inf in Release).
TEST(WindowSemantics, WindowsBeyondTheSequenceAreUnbounded) {
  constexpr index_t huge = std::numeric_limits<index_t>::max();
  for (auto [nq, nk] : {std::pair<index_t, index_t>{40, 24}, {24, 40}, {17, 17}})
    for (index_t side : {nq + nk, nq + nk + 1, huge / 2, huge - 1, huge})
      for (MaskAlignment alignment : {MaskAlignment::bottom_right, MaskAlignment::top_left}) {
        Problem p({1, 2, 2, nq, nk, 32}, KvStorage::window, 3);
        ForwardOptions full;
        full.alignment = alignment;
        p.run(full);
        const std::vector<float> want = p.outputs();
        for (int which = 0; which < 3; ++which) {
          ForwardOptions opts = full;
          opts.window_left = which != 1 ? side : -1;
          opts.window_right = which != 0 ? side : -1;
          p.reset_outputs();
          EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
          EXPECT_TRUE(bitwise_equal(p.outputs(), want))
              << nq << " x " << nk << ", side " << side << ", which " << which;
        }
      }
}

}  // namespace
}  // namespace tileattn::test

// ---- attention_chunk (Llama 4's chunked local attention) --------------------------------------

namespace tileattn::test {
namespace {

struct ChunkCase {
  index_t seqlen_q, seqlen_k, chunk;
  bool causal;
  index_t left;  // window_left with the chunk (-1: none)
  MaskAlignment alignment;
};

std::vector<ChunkCase> chunk_cases() {
  std::vector<ChunkCase> out;
  const std::pair<index_t, index_t> seqlens[] = {{67, 67}, {45, 131}, {131, 45}, {1, 1000}};
  for (auto [nq, nk] : seqlens)
    for (index_t chunk : {1, 7, 40, 64})
      for (bool causal : {true, false})
        out.push_back({nq, nk, chunk, causal, chunk == 40 && causal ? 17 : -1,
                       nq == 131 && !causal ? MaskAlignment::top_left : MaskAlignment::bottom_right});
  return out;
}

class ChunkVsReference : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(ChunkVsReference, MatchesWithinBound) {
  const ChunkCase& c = GetParam();
  Problem p({2, 4, 2, c.seqlen_q, c.seqlen_k, 32}, KvStorage::window, 29);
  ForwardOptions opts;
  opts.attention_chunk = c.chunk;
  opts.causal = c.causal;
  opts.window_left = c.left;
  opts.alignment = c.alignment;
  opts.sram_budget_bytes = rows_budget(16, 32);  // query tiles across chunk edges
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
}

INSTANTIATE_TEST_SUITE_P(Chunks, ChunkVsReference, ::testing::ValuesIn(chunk_cases()), [](const auto& info) {
  const ChunkCase& c = info.param;
  return std::to_string(c.seqlen_q) + "x" + std::to_string(c.seqlen_k) + "_chunk" + std::to_string(c.chunk) +
         (c.causal ? "_causal" : "") + (c.left >= 0 ? "_left" + std::to_string(c.left) : "") +
         (c.alignment == MaskAlignment::top_left ? "_topleft" : "");
});

// Chunks of one key with causal: each query sees only the key at its own position, so its
// output row is that key's V row; chunks as long as the sequence (or longer, up to
// INT64_MAX) change nothing, bitwise.
TEST(ChunkSemantics, OneKeyChunksCopyTheAlignedValueRowAndLongChunksAreNoChunk) {
  Problem p({1, 2, 1, 33, 33, 16}, KvStorage::window, 5);
  ForwardOptions opts;
  opts.causal = true;
  opts.attention_chunk = 1;
  p.run(opts);
  for (index_t i = 0; i < 33; ++i)
    for (index_t h = 0; h < 2; ++h) EXPECT_LT(distance_to_value_row(p, 0, i, h, i), 1e-6f) << "row " << i;
  for (bool causal : {true, false}) {
    ForwardOptions none;
    none.causal = causal;
    p.reset_outputs();
    p.run(none);
    const std::vector<float> want = p.outputs();
    for (index_t chunk : {index_t{33}, index_t{34}, std::numeric_limits<index_t>::max()}) {
      ForwardOptions chunked = none;
      chunked.attention_chunk = chunk;
      p.reset_outputs();
      p.run(chunked);
      EXPECT_TRUE(bitwise_equal(p.outputs(), want)) << "chunk " << chunk;
    }
  }
}

// A query tile reads only the keys of the chunks its rows lie in: the bytes per query row
// stay flat as the sequence grows, and follow the kernel's loop exactly.
TEST(ChunkTraffic, KvBytesGrowWithTheChunkNotTheSequence) {
  constexpr index_t chunk = 256;
  std::uint64_t analytic_short = 0, analytic_long = 0;
  const std::uint64_t short_seq = causal_kv_bytes(1024, -1, chunk, &analytic_short);
  const std::uint64_t long_seq = causal_kv_bytes(4096, -1, chunk, &analytic_long);
  EXPECT_EQ(short_seq, analytic_short);
  EXPECT_EQ(long_seq, analytic_long);
  EXPECT_NEAR(static_cast<double>(long_seq) / static_cast<double>(short_seq), 4.0, 0.01);
  // Causal attention over 4096 keys reads ~N/2 keys per row; a chunk of 256, ~128 + Br/2.
  EXPECT_LT(static_cast<double>(long_seq) / 4096, 0.1 * (4096 / 2) * 2 * 2 * 64 * sizeof(float));
}

}  // namespace
}  // namespace tileattn::test
