// tests/variants/varlen_test.cpp: forward_varlen (packed variable-length batches, as
// FlashAttention's flash_attn_varlen_func) against the reference run on each sequence alone:
// empty query and empty key sequences, seqlen_q != seqlen_k per sequence, masks and ALiBi
// aligned per sequence, per-sequence bias / mask [B, H, max_q, max_k] and slopes; rows past
// the last sequence untouched; equal lengths give the fixed-length result bitwise.
#include <gtest/gtest.h>

#include <sstream>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

/// The options one varlen case turns on (besides a small SRAM budget, so sequences span tiles).
enum class VarlenOption {
  none, causal, causal_top_left, window, chunk, alibi_per_sequence, bias, bias_broadcast,
  mask, sinks, softcap, everything
};

const char* to_string(VarlenOption o) {
  switch (o) {
    case VarlenOption::none: return "none";
    case VarlenOption::causal: return "causal";
    case VarlenOption::causal_top_left: return "causal_topleft";
    case VarlenOption::window: return "window";
    case VarlenOption::chunk: return "chunk";
    case VarlenOption::alibi_per_sequence: return "alibi_per_sequence";
    case VarlenOption::bias: return "bias";
    case VarlenOption::bias_broadcast: return "bias_broadcast";
    case VarlenOption::mask: return "mask";
    case VarlenOption::sinks: return "sinks";
    case VarlenOption::softcap: return "softcap";
    case VarlenOption::everything: return "everything";
  }
  return "unknown";
}

struct VarlenCase {
  VarlenOption option;
  index_t heads_q, heads_kv, head_dim;
};

// Five sequences: ordinary, empty queries, empty keys (its 64 query rows see nothing),
// one query over many keys, and more queries than keys.
const std::vector<std::int32_t> q_lens{37, 0, 64, 1, 90};
const std::vector<std::int32_t> k_lens{50, 13, 0, 77, 41};

class VarlenVsReference : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(VarlenVsReference, EverySequenceMatchesItsReference) {
  const VarlenCase& c = GetParam();
  VarlenProblem p(q_lens, k_lens, c.heads_q, c.heads_kv, c.head_dim, 71);
  const index_t B = p.batch(), H = c.heads_q;
  const auto bias = random_bias({B, H, p.max_q(), p.max_k()}, ScoreLayout::transposed, 72);
  const auto bias1 = random_bias({1, 1, p.max_q(), p.max_k()}, ScoreLayout::contiguous, 73);
  const auto mask = random_mask({B, 1, p.max_q(), p.max_k()}, ScoreLayout::contiguous, 74, 0.75);
  const std::vector<float> slopes = uniform_values(static_cast<std::size_t>(B * H), 0.0f, 0.5f, 75);
  const std::vector<float> sinks = uniform_values(static_cast<std::size_t>(H), -1.0f, 2.0f, 76);

  ForwardOptions opts;
  opts.sram_budget_bytes = rows_budget(16, c.head_dim);
  const VarlenOption o = c.option;
  const bool all = o == VarlenOption::everything;
  opts.causal = o == VarlenOption::causal || o == VarlenOption::causal_top_left || all;
  if (o == VarlenOption::causal_top_left) opts.alignment = MaskAlignment::top_left;
  if (o == VarlenOption::window || all) opts.window_left = 10;
  if (o == VarlenOption::window) opts.window_right = 3;
  if (o == VarlenOption::chunk || all) opts.attention_chunk = 16;
  if (o == VarlenOption::chunk) opts.causal = true;
  if (o == VarlenOption::alibi_per_sequence || all) opts.alibi_slopes = slopes;
  if (o == VarlenOption::bias || all) opts.bias = bias.view();
  if (o == VarlenOption::bias_broadcast) opts.bias = bias1.view();
  if (o == VarlenOption::mask || all) opts.mask = mask.view();
  if (o == VarlenOption::sinks || all) opts.sinks = sinks;
  if (o == VarlenOption::softcap || all) opts.softcap = 4.0f;

  index_t masked = 0;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts, &masked)));
  if (opts.sinks.empty()) {
    EXPECT_GE(masked, 64 * H) << "the empty-key sequence's rows see no key";
  }
  EXPECT_EQ(p.spare_rows_written(), 0) << "forward_varlen wrote past the last sequence";
  // The empty-key sequence (b = 2), explicitly: O = 0, LSE = -inf (the sink's logit with sinks).
  const TensorView<const float> o2 = p.o_of(2);
  const LseView lse2 = p.lse_of(2);
  index_t wrong = 0;
  for (index_t i = 0; i < 64; ++i)
    for (index_t h = 0; h < H; ++h) {
      const float want = opts.sinks.empty() ? -inf : sinks[static_cast<std::size_t>(h)];
      wrong += !(lse2(0, h, i) == want || std::abs(lse2(0, h, i) - want) <= 1e-6f);
      for (index_t d = 0; d < c.head_dim; ++d) wrong += o2(0, i, h, d) != 0.0f;
    }
  EXPECT_EQ(wrong, 0) << "elements of the empty-key sequence that are not O = 0 / LSE = -inf or the sink";
}

std::vector<VarlenCase> varlen_cases() {
  const VarlenOption options[] = {
      VarlenOption::none,  VarlenOption::causal,  VarlenOption::causal_top_left,
      VarlenOption::window, VarlenOption::chunk, VarlenOption::alibi_per_sequence, VarlenOption::bias,
      VarlenOption::bias_broadcast, VarlenOption::mask, VarlenOption::sinks,
      VarlenOption::softcap, VarlenOption::everything};
  struct Heads {
    index_t q, kv;
  };
  const Heads heads[] = {{4, 4}, {6, 2}, {5, 1}};
  std::vector<VarlenCase> out;
  int n = 0;
  for (VarlenOption o : options) {
    const Heads h = heads[n % 3];
    out.push_back({o, h.q, h.kv, test_head_dims[static_cast<std::size_t>(n) % test_head_dims.size()]});
    ++n;
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Options, VarlenVsReference, ::testing::ValuesIn(varlen_cases()),
                         [](const auto& info) {
                           const VarlenCase& c = info.param;
                           return std::string(to_string(c.option)) + "_h" + std::to_string(c.heads_q) +
                                  "_kv" + std::to_string(c.heads_kv) + "_d" + std::to_string(c.head_dim);
                         });

// Sinks with the empty-key sequence: its rows' LSE is the sink, O = 0.
TEST(Varlen, SinksOnTheEmptyKeySequence) {
  VarlenProblem p(q_lens, k_lens, 3, 1, 32, 77);
  const std::vector<float> sinks{0.25f, -2.0f, 3.0f};
  ForwardOptions opts;
  opts.sinks = sinks;
  opts.causal = true;
  opts.sram_budget_bytes = rows_budget(16, 32);
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  EXPECT_NEAR(p.lse_of(2)(0, 2, 10), 3.0f, 1e-6f);
  EXPECT_EQ(p.o_of(2)(0, 10, 2, 5), 0.0f);
}

// A batch whose sequences all have the same lengths is a fixed-length batch: same views of
// the same memory, same tile plan, so bitwise the same O and LSE.
TEST(Varlen, EqualLengthsEqualFixedLengthBatch) {
  constexpr index_t B = 3, nq = 45, nk = 70, Hq = 6, Hkv = 3, d = 80;
  VarlenProblem p(std::vector<std::int32_t>(B, nq), std::vector<std::int32_t>(B, nk), Hq, Hkv, d, 78);
  const auto bias = random_bias({B, 1, nq, nk}, ScoreLayout::contiguous, 79);
  const std::vector<float> slopes = uniform_values(static_cast<std::size_t>(B * Hq), 0.0f, 0.5f, 80);
  ForwardOptions opts;
  opts.causal = true;
  opts.window_left = 20;
  opts.bias = bias.view();
  opts.alibi_slopes = slopes;
  opts.softcap = 6.0f;
  opts.sram_budget_bytes = rows_budget(16, d);
  p.run(opts);

  const PackedView<const float> q = p.q(), k = p.k(), v = p.v();
  const TensorView<const float> qf{q.data, {B, nq, Hq, d}, {nq * q.stride[0], q.stride[0], q.stride[1], q.stride[2]}};
  const TensorView<const float> kf{k.data, {B, nk, Hkv, d}, {nk * k.stride[0], k.stride[0], k.stride[1], k.stride[2]}};
  const TensorView<const float> vf{v.data, {B, nk, Hkv, d}, {nk * v.stride[0], v.stride[0], v.stride[1], v.stride[2]}};
  HostTensor o({B, nq, Hq, d}, Layout::bshd);
  HostLse lse(B, Hq, nq);
  forward(qf, kf, vf, o.view(), lse.view(), opts);

  index_t differ = 0;
  for (index_t b = 0; b < B; ++b) {
    const TensorView<const float> ob = p.o_of(b);
    const LseView lb = p.lse_of(b);
    for_each_index({1, nq, Hq, d}, [&](index_t, index_t i, index_t h, index_t c) {
      differ += std::memcmp(&ob(0, i, h, c), &o.cview()(b, i, h, c), sizeof(float)) != 0;
    });
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < nq; ++i) differ += std::memcmp(&lb(0, h, i), &lse.view()(b, h, i), sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0) << "elements where varlen and fixed-length results differ";
}

// Many sequences of awkward lengths, including several empty ones in a row and a long one.
TEST(Varlen, ManySequencesWithRunsOfEmptyOnes) {
  const std::vector<std::int32_t> ql{0, 0, 3, 17, 0, 250, 1, 0, 33};
  const std::vector<std::int32_t> kl{5, 0, 0, 17, 0, 260, 1, 9, 120};
  VarlenProblem p(ql, kl, 4, 2, 64, 81);
  ForwardOptions opts;
  opts.causal = true;
  opts.sram_budget_bytes = rows_budget(16, 64);
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  EXPECT_EQ(p.spare_rows_written(), 0);
}

// A batch of one sequence in a buffer longer than it (3 spare rows): the window aligns
// top-left from the sequence's start, and the spare rows are not written.
TEST(Varlen, OneSequenceInALongerBuffer) {
  constexpr index_t nq = 61, nk = 99, H = 4, d = 96;
  VarlenProblem p({nq}, {nk}, H, H, d, 82);
  ForwardOptions opts;
  opts.window_left = 30;
  opts.window_right = 30;
  opts.alignment = MaskAlignment::top_left;
  opts.sram_budget_bytes = rows_budget(16, d);
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  EXPECT_EQ(p.spare_rows_written(), 0);
}

}  // namespace
}  // namespace tileattn::test

namespace tileattn::test {
namespace {

// A batch with an empty side (max_seqlen_q == 0 or max_seqlen_k == 0) takes a bias or mask
// of extent 0 or 1 on that side (the review's repro: one head, d 64, cu_seqlens_q {0, 0},
// cu_seqlens_k {0, 17}); nothing is read from it. With no queries nothing is written; with
// no keys every row gets O = 0, LSE = -inf.
TEST(Varlen, EmptySideTakesABiasOrMaskOfExtentZeroOrOne) {
  for (bool empty_queries : {true, false})
    for (index_t extent : {0, 1}) {
      SCOPED_TRACE(std::string(empty_queries ? "no queries" : "no keys") + ", extent " + std::to_string(extent));
      const std::vector<std::int32_t> q_lens{empty_queries ? 0 : 5}, k_lens{empty_queries ? 17 : 0};
      VarlenProblem p(q_lens, k_lens, 1, 1, 64, 5);
      const index_t nq = empty_queries ? extent : 5, nk = empty_queries ? 17 : extent;
      std::vector<float> bias(static_cast<std::size_t>(std::max<index_t>(nq * nk, 1)), 0.5f);
      std::unique_ptr<bool[]> mask(new bool[static_cast<std::size_t>(std::max<index_t>(nq * nk, 1))]());
      ForwardOptions opts;
      opts.bias = {bias.data(), {1, 1, nq, nk}, {0, 0, nk, 1}};
      opts.mask = {mask.get(), {1, 1, nq, nk}, {0, 0, nk, 1}};
      ASSERT_NO_THROW(p.run(opts));
      EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
      if (empty_queries) {
        EXPECT_TRUE(all_equal(p.o_buffer(), sentinel));
        EXPECT_TRUE(all_equal(p.lse_buffer(), sentinel));
      } else {
        EXPECT_EQ(p.lse_of(0)(0, 0, 2), -std::numeric_limits<float>::infinity());
      }
    }
  // An extent of 2 on the empty side is still wrong, and named.
  VarlenProblem p({0}, {17}, 1, 1, 64, 5);
  std::vector<float> bias(34, 0.5f);
  ForwardOptions opts;
  opts.bias = {bias.data(), {1, 1, 2, 17}, {0, 0, 17, 1}};
  EXPECT_TRUE(throws_naming([&] { p.run(opts); }, "bias.shape[2] (seqlen_q)"));
}

// A last sequence with no keys starts at the end of K (cu_seqlens_k = {0, 1, 1}); with a huge
// row stride the address of that missing row wraps (the fuzzer's find: UBSan "pointer index
// expression overflowed"). No address of a row that does not exist is formed now; the
// sequence's query gets O = 0 and LSE = -inf.
TEST(Varlen, EmptyLastSequenceAtTheEndOfAHugelyStridedK) {
  std::vector<float> q(4, 0.5f), k(4, 0.25f), v(1, 3.0f), o(1, sentinel), lse(1, sentinel);
  const index_t huge = index_t{1} << 61;
  const PackedView<const float> kv{k.data(), {1, 1, 4}, {huge, 4, 1}};
  const PackedView<const float> vv{v.data(), {1, 1, 1}, {huge, 1, 1}};
  const std::vector<std::int32_t> cu_q{0, 0, 1}, cu_k{0, 1, 1};
  forward_varlen(make_thd(q.data(), 1, 1, 4), kv, vv, make_thd(o.data(), 1, 1, 1),
                 make_packed_lse(lse.data(), 1, 1), VarlenSequences{cu_q, cu_k, 1, 1});
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
}

}  // namespace
}  // namespace tileattn::test
