// tests/flex/flex_forward_test.cpp: tileattn::forward_flex and forward_flex_varlen (flex.hpp)
// against the double-precision reference of tests/reference/naive_flex.hpp:
//   - every library mask and score mod, a per-head / per-batch mask and custom mods, with
//     bare mask_mods and block masks of sizes that match no tile (a block mask must change no
//     bit; the masks tested alone run behind one std::function type, to compile fewer
//     kernels), GQA, seqlen_q != seqlen_k, head_dim_v != head_dim, strided
//     layouts, LSE, a varlen batch with an empty sequence. fp32 bound: FlashAttention's rule
//     as forward_test.cpp applies it to custom scales, 2e-5 + 2 x the error of a naive fp32
//     flex attention on the same inputs (that error itself capped, so that a wrong reference
//     cannot widen the bound);
//   - the mods that duplicate built-in options give the options' results: causal, window
//     and no mods bitwise, ALiBi and softcap within fp32 rounding;
//   - bf16 and fp16 under FlashAttention's rule (2 x the naive same-precision error + 1e-5);
//   - the same bits for every backend and thread count, at two SRAM budgets, with a 24 x 40
//     block mask; and the block mask adds no plan dependence (every query tiling of one key
//     tile the same bits; every budget the bits of the bare mask_mod);
//   - IO: the K/V bytes of a block-sparse call are exactly those of the key tiles it sees;
//   - edited block masks, copies, argument errors (nothing written), NaN and fully masked rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/flex_support.hpp"
#include "reference/naive_flex.hpp"
#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

// ---- Inputs of the mods -----------------------------------------------------------------------

/// A q_blocks x kv_blocks layout with about `density` of its blocks set.
std::vector<std::uint8_t> random_layout(index_t q_blocks, index_t kv_blocks, double density, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution set(density);
  std::vector<std::uint8_t> layout(static_cast<std::size_t>(q_blocks * kv_blocks));
  for (auto& x : layout) x = set(rng) ? 1 : 0;
  return layout;
}

std::vector<float> alibi_slopes(index_t heads) {
  std::vector<float> s;
  for (index_t h = 0; h < heads; ++h) s.push_back(0.5f / static_cast<float>(1 << h));
  return s;
}

/// A custom score_mod and its derivative, generic so that the reference runs it in double.
const auto wavy = flex::with_grad{[](auto s, index_t, index_t h, index_t i, index_t j) {
                                    using S = decltype(s);
                                    return s + S(0.5) * std::sin(s) -
                                           S(0.01) * static_cast<S>(h + 1) * static_cast<S>(i > j ? i - j : j - i);
                                  },
                                  [](auto s, index_t, index_t, index_t, index_t) {
                                    using S = decltype(s);
                                    return S(1) + S(0.5) * std::cos(s);
                                  }};

/// A mask_mod behind a std::function. Every (score_mod, mask) pair is a kernel instantiation
/// of its own, ~1 s of compile time in Release and several under the sanitizers, so the
/// masks tested without a score_mod that no other test needs as a type share this one; the
/// kernel still runs each mask's semantics, checked against the reference.
struct AnyMask {
  std::function<bool(index_t, index_t, index_t, index_t)> f;
  bool operator()(index_t b, index_t h, index_t i, index_t j) const { return f(b, h, i, j); }
};

// ---- Running and checking -------------------------------------------------------------------------

std::string shape_name(const ProblemShape& s) {
  return "b" + std::to_string(s.batch) + " " + std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k) + " h" +
         std::to_string(s.heads) + "/" + std::to_string(s.heads_kv) + " d" + std::to_string(s.head_dim);
}

template <class T>
TensorView<const T> c(const TensorView<T>& v) {
  return v;
}

/// forward_flex on p's inputs into p.o and p.lse (both reset to the sentinel first).
template <class T, class ScoreMod, class Mask>
void run_forward(BackwardProblem<T>& p, const ScoreMod& score_mod, const Mask& mask, const ForwardOptions& opts = {}) {
  std::fill(p.o.begin(), p.o.end(), from_float<T>(sentinel));
  std::fill(p.lse.begin(), p.lse.end(), sentinel);
  forward_flex(c(p.qv), c(p.kv), c(p.vv), p.ov, p.lse_view(), score_mod, mask, opts);
}

/// The kernel's O as floats in a contiguous [B, N, H, D] view, for compare_to_reference.
struct FloatOutput {
  std::vector<float> o;
  TensorView<const float> view;
};
template <class T>
FloatOutput float_output(const BackwardProblem<T>& p) {
  FloatOutput f{BackwardProblem<T>::gather(p.ov), {}};
  f.view = make_bshd(static_cast<const float*>(f.o.data()), p.s.batch, p.s.seqlen_q, p.s.heads, p.s.head_dim_v);
  return f;
}

/// The naive flex attention in T on p's inputs, against the reference.
template <class T, class ScoreMod, class MaskMod>
Deviation naive_deviation(const BackwardProblem<T>& p, const reference::AttentionResult& ref, const ScoreMod& score_mod,
                          const MaskMod& mask_mod, float scale) {
  const ProblemShape& s = p.s;
  std::vector<float> o(static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads * s.head_dim_v));
  std::vector<float> lse(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q));
  const TensorView<float> ov = make_bshd(o.data(), s.batch, s.seqlen_q, s.heads, s.head_dim_v);
  const LseView lv = make_lse(lse.data(), s.batch, s.heads, s.seqlen_q);
  reference::flex_attention_naive<T>(c(p.qv), c(p.kv), c(p.vv), score_mod, mask_mod, scale, ov, lv);
  return compare_to_reference(ref, c(ov), lv);
}

/// The largest error a naive attention in T may have on these inputs (N(0, 1), scores of at
/// most a few hundred), 4x to 80x what it shows here (fp32: 1e-7 to 5e-6; bf16: up to 1.2e-2;
/// fp16: up to 1.2e-3). More means the reference, not the rounding, differs, and the rule's
/// bound, which grows with the naive error, would hide it.
template <class T>
double naive_ceiling() {
  return std::is_same_v<T, float> ? 1e-4 : std::is_same_v<T, bf16> ? 5e-2 : 1e-2;
}

/// FlashAttention's rule: kernel max |error| <= 2 x the naive same-precision error + `floor`.
template <class T = float>
void expect_rule(const Deviation& kernel, const Deviation& naive, double floor) {
  EXPECT_EQ(kernel.problem, "");
  EXPECT_EQ(naive.problem, "") << "(the naive implementation)";
  EXPECT_LE(kernel.o, floor + 2.0 * naive.o) << "O error; naive " << naive.o;
  EXPECT_LE(kernel.lse, floor + 2.0 * naive.lse) << "LSE error; naive " << naive.lse;
  EXPECT_LE(naive.o, naive_ceiling<T>()) << "the naive attention is far from the reference";
  EXPECT_LE(naive.lse, naive_ceiling<T>()) << "the naive attention is far from the reference";
  if (std::getenv("TILEATTN_TEST_PRINT_ERRORS"))
    std::printf("ERR %s o %.3g (naive %.3g) lse %.3g (naive %.3g)\n", type_name<T>(), kernel.o, naive.o, kernel.lse,
                naive.lse);
}

/// What check_forward runs. BlockSizes: the bare mask_mod, then block masks of these sizes,
/// which must give the same bits. NoBlocks: the bare mask_mod only; BlockOnly: the block
/// masks only, each against the reference. (Each (score_mod, mask) pair is a kernel compiled
/// of its own, several seconds under the sanitizers: the cases compile only what they need.)
struct BlockSizes {
  std::vector<BlockSize> sizes;
  BlockSizes(std::initializer_list<BlockSize> s) : sizes(s) {}
};
struct NoBlocks {};
struct BlockOnly {
  std::vector<BlockSize> sizes;
  BlockOnly(std::initializer_list<BlockSize> s) : sizes(s) {}
};

/// One float case: forward_flex against the double reference with the bare mask_mod and/or
/// block masks of the given sizes (over mask_batch x mask_heads: 1 broadcasts).
template <class ScoreMod, class MaskMod, class Blocks = BlockSizes>
void check_forward(const std::string& name, const ProblemShape& s, std::uint64_t seed, const ScoreMod& score_mod,
                   const MaskMod& mask_mod, const Blocks& blocks, index_t mask_batch = 1, index_t mask_heads = 1,
                   std::optional<float> scale = std::nullopt) {
  SCOPED_TRACE(name + ", " + shape_name(s));
  BackwardProblem<float> p(s, seed);
  ForwardOptions opts;
  opts.softmax_scale = scale;
  const float fscale = scale.value_or(1.0f / std::sqrt(static_cast<float>(s.head_dim)));
  const auto ref = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), score_mod, mask_mod, fscale);
  const Deviation naive = naive_deviation(p, ref, score_mod, mask_mod, fscale);
  if constexpr (std::is_same_v<Blocks, BlockOnly>) {
    for (const BlockSize& bs : blocks.sizes) {
      SCOPED_TRACE("block mask " + std::to_string(bs.q) + " x " + std::to_string(bs.kv));
      run_forward(p, score_mod, create_block_mask(mask_mod, mask_batch, mask_heads, s.seqlen_q, s.seqlen_k, bs), opts);
      expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()), naive, forward_o_tolerance);
    }
    return;
  } else {
    run_forward(p, score_mod, mask_mod, opts);
    expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()), naive, forward_o_tolerance);
  }
  if constexpr (std::is_same_v<Blocks, BlockSizes>) {
    const std::vector<float> bare_o = p.o, bare_lse = p.lse;
    for (const BlockSize& bs : blocks.sizes) {
      SCOPED_TRACE("block mask " + std::to_string(bs.q) + " x " + std::to_string(bs.kv));
      const auto blocks_of = create_block_mask(mask_mod, mask_batch, mask_heads, s.seqlen_q, s.seqlen_k, bs);
      run_forward(p, score_mod, blocks_of, opts);
      EXPECT_TRUE(bitwise_equal(p.o, bare_o)) << "the block mask changed O";
      EXPECT_TRUE(bitwise_equal(p.lse, bare_lse)) << "the block mask changed the LSE";
    }
  }
}

// ---- Every library mask ------------------------------------------------------------------------

TEST(FlexForwardMasks, Causal) {
  using flex::causal;
  const flex::no_score_mod none;
  check_forward("top-left", {2, 127, 300, 4, 2, 32, 32}, 1, none, causal{}, {{16, 16}, {128, 128}});
  check_forward("bottom-right, rows that see nothing", {1, 300, 127, 4, 2, 40, 40}, 2, none, causal{127 - 300},
                {{7, 13}});
  check_forward("one by one", {1, 1, 1, 1, 1, 8, 8}, 3, none, causal{}, {{16, 16}});
  check_forward("17 x 1", {2, 17, 1, 2, 1, 16, 16}, 4, none, causal{}, {{7, 13}});
  check_forward("decode (K/V read in place)", {2, 1, 300, 4, 2, 32, 32}, 5, none, causal{299}, {{1, 64}});
}

TEST(FlexForwardMasks, SlidingWindow) {
  using flex::sliding_window;
  const flex::no_score_mod none;
  check_forward("20 left, 5 right", {1, 300, 300, 2, 2, 32, 32}, 6, none, sliding_window{20, 5, 0},
                {{16, 16}, {64, 64}});
  check_forward("causal window, bottom-right", {1, 127, 300, 4, 2, 32, 32}, 7, none, sliding_window{30, 0, 173},
                {{7, 13}});
  check_forward("left only, more queries", {2, 127, 17, 2, 2, 16, 16}, 8, none, sliding_window{10, -1, 0}, {{16, 16}});
}

TEST(FlexForwardMasks, Document) {
  const auto ids = document_ids(300, 9, 60);
  const auto q_ids = document_ids(127, 9, 25);
  check_forward("self", {1, 300, 300, 4, 2, 32, 32}, 10, flex::no_score_mod{}, flex::document{ids},
                {{16, 16}, {128, 128}});
  check_forward("cross, head_dim_v 40", {2, 127, 300, 2, 1, 24, 40}, 11, flex::no_score_mod{},
                flex::document{q_ids, ids}, {{7, 13}});
}

TEST(FlexForwardMasks, PrefixLm) {
  check_forward("prefix 50", {1, 300, 300, 4, 2, 32, 32}, 12, flex::no_score_mod{}, AnyMask{flex::prefix_lm{50}},
                {{16, 16}, {128, 128}});
  check_forward("no prefix", {1, 17, 127, 2, 2, 16, 16}, 13, flex::no_score_mod{}, AnyMask{flex::prefix_lm{0}},
                {{7, 13}});
}

TEST(FlexForwardMasks, GlobalWindow) {
  check_forward("3 globals, window 10", {1, 300, 300, 2, 1, 32, 32}, 14, flex::no_score_mod{},
                AnyMask{flex::global_window{3, 10}}, {{16, 16}, {7, 13}});
}

TEST(FlexForwardMasks, DilatedWindow) {
  check_forward("window 20, dilation 3", {1, 127, 127, 4, 2, 32, 32}, 15, flex::no_score_mod{},
                AnyMask{flex::dilated_window{20, 3}}, {{16, 16}, {7, 13}});
  check_forward("dilation 1", {1, 17, 17, 1, 1, 59, 59}, 16, flex::no_score_mod{}, AnyMask{flex::dilated_window{4, 1}},
                {{16, 16}});
}

TEST(FlexForwardMasks, BlockSparse) {
  const index_t n = 300, block = 32, blocks = (n + block - 1) / block;
  const auto layout = random_layout(blocks, blocks, 0.4, 17);
  const flex::block_sparse mask{layout, blocks, block};
  check_forward("random layout of 32 x 32", {1, n, n, 4, 2, 32, 32}, 18, flex::no_score_mod{}, mask,
                {{block, block}, {7, 13}, {128, 128}});
  // A block mask of the layout's block size finds its blocks exactly: none partial.
  const auto bm = create_block_mask(mask, 1, 1, n, n, {block, block});
  EXPECT_EQ(bm.count(BlockKind::partial), 0);
  EXPECT_GT(bm.count(BlockKind::empty), 0);
  EXPECT_GT(bm.count(BlockKind::full), 0);
}

TEST(FlexForwardMasks, AndOrMasks) {
  const auto ids = document_ids(300, 19, 80);
  check_forward("causal and document", {1, 300, 300, 4, 2, 32, 32}, 20, flex::no_score_mod{},
                AnyMask{flex::and_masks{flex::causal{}, flex::document{ids}}}, {{16, 16}, {128, 128}});
  check_forward("window or prefix", {1, 127, 300, 2, 2, 32, 32}, 21, flex::no_score_mod{},
                AnyMask{flex::or_masks{flex::sliding_window{8, 8, 0}, flex::prefix_lm{5}}}, {{7, 13}});
}

TEST(FlexForwardMasks, PerHeadAndPerBatch) {
  const AnyMask mask{[](index_t b, index_t h, index_t i, index_t j) {
    return (i + 2 * j + 3 * b + 5 * h) % 7 != 0 && j <= i + 40 * h + 13 * b;
  }};
  check_forward("mask over b and h", {2, 127, 300, 4, 2, 32, 32}, 22, flex::no_score_mod{}, mask, {{16, 16}, {7, 13}},
                2, 4);
}

// ---- Every library score mod, and custom ones -------------------------------------------------------

TEST(FlexForwardScoreMods, Alibi) {
  const auto slopes = alibi_slopes(4);
  check_forward("alibi, causal", {1, 127, 300, 4, 2, 32, 32}, 23, flex::alibi{slopes, 0}, flex::causal{},
                BlockOnly{{16, 16}, {128, 128}});
  check_forward("alibi with offset, no mask", {2, 17, 127, 4, 4, 16, 16}, 24, flex::alibi{slopes, 110}, flex::no_mask{},
                NoBlocks{});
}

TEST(FlexForwardScoreMods, Softcap) {
  check_forward("softcap 2, window, scale 0.7", {1, 300, 300, 2, 2, 32, 32}, 25, flex::softcap{2.0f},
                flex::sliding_window{40, 40, 0}, BlockOnly{{16, 16}}, 1, 1, 0.7f);
  check_forward("softcap 30, no mask", {1, 17, 127, 4, 2, 32, 32}, 26, flex::softcap{30.0f}, flex::no_mask{},
                NoBlocks{});
}

TEST(FlexForwardScoreMods, RelativeBias) {
  const index_t max_distance = 16;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * max_distance + 1)), 27);
  const auto ids = document_ids(300, 28, 70);
  check_forward("relative bias, document", {1, 300, 300, 4, 2, 32, 32}, 29, flex::relative_bias{table, max_distance},
                flex::document{ids}, {{16, 16}, {128, 128}});
  check_forward("relative bias, no mask", {2, 127, 17, 4, 1, 24, 24}, 30, flex::relative_bias{table, max_distance},
                flex::no_mask{}, NoBlocks{});
}

// The views' layouts (test_support.hpp): head-major, a padded KV-cache window, head_dim strided.
TEST(FlexForwardScoreMods, StridedLayouts) {
  const ProblemShape s{1, 127, 300, 4, 2, 32, 32};
  const index_t max_distance = 16;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * max_distance + 1)), 27);
  const auto ids = document_ids(300, 28, 70);
  const flex::relative_bias bias{table, max_distance};
  const flex::document mask{ids};
  const float scale = 1.0f / std::sqrt(32.0f);
  for (Layout layout : all_layouts) {
    SCOPED_TRACE(to_string(layout));
    BackwardProblem<float> p(s, 39, layout);
    const auto ref = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), bias, mask, scale);
    const Deviation naive = naive_deviation(p, ref, bias, mask, scale);
    run_forward(p, bias, mask);
    expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()), naive, forward_o_tolerance);
    run_forward(p, bias, create_block_mask(mask, 1, 1, 127, 300, {16, 16}));
    expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()), naive, forward_o_tolerance);
  }
}

TEST(FlexForwardScoreMods, CustomWithGrad) {
  check_forward("wavy, prefix-LM", {1, 300, 300, 4, 2, 32, 32}, 31, wavy, flex::prefix_lm{30}, {{16, 16}, {7, 13}});
  check_forward("wavy, one query, every key", {1, 1, 127, 2, 2, 16, 16}, 32, wavy, flex::prefix_lm{127}, NoBlocks{});
}

// A score_mod that returns -inf hides the score: the causal mask written as a score_mod, and
// a row (5) every score of which it hides. A plain lambda, with no derivative: the forward
// needs none (compile_fail/compiles.cpp checks the same at compile time).
TEST(FlexForwardScoreMods, MinusInfinityHidesTheScore) {
  const auto hide = [](auto s, index_t, index_t, index_t i, index_t j) {
    return j > i || i == 5 ? -std::numeric_limits<decltype(s)>::infinity() : s;
  };
  check_forward("causal as a score_mod", {1, 127, 300, 2, 2, 32, 32}, 33, hide, flex::no_mask{}, NoBlocks{});
  check_forward("17 x 17", {1, 17, 17, 2, 2, 16, 16}, 34, hide, flex::no_mask{}, NoBlocks{});
}

// The built-in options apply before the mods (docs/flex.md): causal and a relative bias.
TEST(FlexForwardScoreMods, OptionsCombineWithMods) {
  const ProblemShape s{1, 127, 300, 4, 2, 32, 32};
  const index_t max_distance = 8;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * max_distance + 1)), 35);
  const flex::relative_bias bias{table, max_distance};
  BackwardProblem<float> p(s, 36);
  ForwardOptions opts;
  opts.causal = true;  // bottom-right
  run_forward(p, bias, flex::no_mask{}, opts);
  const float scale = 1.0f / std::sqrt(32.0f);
  const flex::causal mask{300 - 127};
  const auto ref = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), bias, mask, scale);
  expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()), naive_deviation(p, ref, bias, mask, scale),
              forward_o_tolerance);
}

// ---- Varlen ---------------------------------------------------------------------------------------

TEST(FlexForwardVarlen, ThreeSequencesOneEmpty) {
  const std::vector<std::int32_t> cu_q{0, 37, 37, 150}, cu_k{0, 50, 61, 150};
  const index_t H = 4, Hkv = 2, d = 24, total_q = 150, total_k = 150, max_q = 113, max_k = 89;
  BackwardProblem<float> p({1, total_q, total_k, H, Hkv, d, d}, 37);  // batch 1 views over the packed rows
  const auto packed = [](const auto& t) {
    using E = std::remove_reference_t<decltype(*t.data)>;
    return PackedView<E>{t.data, {t.shape[1], t.shape[2], t.shape[3]}, {t.stride[1], t.stride[2], t.stride[3]}};
  };
  const index_t max_distance = 12;
  const auto table = normal_values(static_cast<std::size_t>(H * (2 * max_distance + 1)), 38);
  const flex::relative_bias bias{table, max_distance};
  // A window whose sides grow with the sequence index b and the query head h. (Behind
  // AnyMask, as the causal block mask below: one varlen kernel for all three calls.)
  const AnyMask mask{
      [](index_t b, index_t h, index_t i, index_t j) { return j <= i + 10 + h && i - j <= 20 + 30 * b + 5 * h; }};
  const VarlenSequences seqs{cu_q, cu_k, max_q, max_k};
  const PackedLseView lse{p.lse.data(), {H, total_q}, {total_q, 1}};
  const float scale = 1.0f / std::sqrt(24.0f);
  const auto run = [&](const auto& m, const auto& mask_mod) {
    std::fill(p.o.begin(), p.o.end(), sentinel);
    std::fill(p.lse.begin(), p.lse.end(), sentinel);
    forward_flex_varlen(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)), packed(p.ov), lse, seqs, bias, m);
    const auto ref = reference::flex_attention_varlen<float>(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)), cu_q,
                                                             cu_k, bias, mask_mod, scale);
    const Deviation dev = compare_to_reference(ref, c(p.ov), make_lse(p.lse.data(), 1, H, total_q));
    EXPECT_EQ(dev.problem, "");
    EXPECT_LE(dev.o, forward_o_tolerance);
    EXPECT_LE(dev.lse, forward_lse_tolerance);
  };
  run(mask, mask);
  const std::vector<float> bare = p.o;
  run(create_block_mask(mask, 3, H, max_q, max_k, {16, 16}), mask);
  EXPECT_TRUE(bitwise_equal(p.o, bare));
  // A block mask of a mask_mod that ignores b, shared by every sequence (batch 1).
  run(create_block_mask(AnyMask{flex::causal{}}, 1, 1, max_q, max_k, {7, 13}), flex::causal{});
}

// ---- Equal to the built-in options ----------------------------------------------------------------

/// O and LSE of forward() with `opts` and of forward_flex with the mods, on the same inputs.
struct Pair {
  std::vector<float> builtin_o, builtin_lse, flex_o, flex_lse;
  double max_o_difference() const {
    double m = 0.0;
    for (std::size_t e = 0; e < builtin_o.size(); ++e)
      m = std::max(m, std::abs(static_cast<double>(builtin_o[e]) - flex_o[e]));
    return m;
  }
  double max_lse_difference() const {
    double m = 0.0;
    for (std::size_t e = 0; e < builtin_lse.size(); ++e)
      if (builtin_lse[e] != flex_lse[e]) m = std::max(m, std::abs(static_cast<double>(builtin_lse[e]) - flex_lse[e]));
    return m;
  }
};

template <class ScoreMod, class Mask>
Pair builtin_and_flex(const ProblemShape& s, std::uint64_t seed, const ForwardOptions& builtin, const ScoreMod& sm,
                      const Mask& mask, ForwardOptions flex_opts = {}) {
  BackwardProblem<float> p(s, seed);
  Pair r;
  std::fill(p.o.begin(), p.o.end(), sentinel);
  forward(c(p.qv), c(p.kv), c(p.vv), p.ov, p.lse_view(), builtin);
  r.builtin_o = p.o;
  r.builtin_lse = p.lse;
  run_forward(p, sm, mask, flex_opts);
  r.flex_o = p.o;
  r.flex_lse = p.lse;
  return r;
}

const ProblemShape equality_shapes[] = {
    {1, 127, 300, 4, 2, 32, 32}, {2, 300, 127, 2, 1, 40, 40}, {1, 17, 17, 2, 2, 16, 16}};

TEST(FlexForwardEqualsBuiltin, CausalBitwise) {
  for (const ProblemShape& s : equality_shapes) {
    SCOPED_TRACE(shape_name(s));
    ForwardOptions opts;
    opts.causal = true;
    const flex::causal mask{s.seqlen_k - s.seqlen_q};
    const Pair bare = builtin_and_flex(s, 40, opts, flex::no_score_mod{}, mask);
    EXPECT_TRUE(bitwise_equal(bare.builtin_o, bare.flex_o)) << "max |difference| " << bare.max_o_difference();
    EXPECT_TRUE(bitwise_equal(bare.builtin_lse, bare.flex_lse)) << "max |difference| " << bare.max_lse_difference();
    const auto blocks = create_block_mask(mask, 1, 1, s.seqlen_q, s.seqlen_k, {64, 64});
    const Pair blocked = builtin_and_flex(s, 40, opts, flex::no_score_mod{}, blocks);
    EXPECT_TRUE(bitwise_equal(blocked.builtin_o, blocked.flex_o)) << "max |difference| " << blocked.max_o_difference();
    EXPECT_TRUE(bitwise_equal(blocked.builtin_lse, blocked.flex_lse));
  }
}

TEST(FlexForwardEqualsBuiltin, WindowBitwise) {
  for (const ProblemShape& s : equality_shapes)
    for (auto [left, right] : {std::pair<index_t, index_t>{17, 5}, {40, -1}}) {
      SCOPED_TRACE(shape_name(s) + ", window " + std::to_string(left) + ", " + std::to_string(right));
      ForwardOptions opts;
      opts.window_left = left;
      opts.window_right = right;
      const flex::sliding_window mask{left, right, s.seqlen_k - s.seqlen_q};
      const Pair bare = builtin_and_flex(s, 41, opts, flex::no_score_mod{}, mask);
      EXPECT_TRUE(bitwise_equal(bare.builtin_o, bare.flex_o)) << "max |difference| " << bare.max_o_difference();
      EXPECT_TRUE(bitwise_equal(bare.builtin_lse, bare.flex_lse));
      const Pair blocked = builtin_and_flex(s, 41, opts, flex::no_score_mod{},
                                            create_block_mask(mask, 1, 1, s.seqlen_q, s.seqlen_k, {16, 16}));
      EXPECT_TRUE(bitwise_equal(blocked.builtin_o, blocked.flex_o))
          << "max |difference| " << blocked.max_o_difference();
      EXPECT_TRUE(bitwise_equal(blocked.builtin_lse, blocked.flex_lse));
    }
}

TEST(FlexForwardEqualsBuiltin, NoModsBitwise) {
  for (const ProblemShape& s : equality_shapes) {
    SCOPED_TRACE(shape_name(s));
    const Pair r = builtin_and_flex(s, 42, {}, flex::no_score_mod{}, flex::no_mask{});
    EXPECT_TRUE(bitwise_equal(r.builtin_o, r.flex_o));
    EXPECT_TRUE(bitwise_equal(r.builtin_lse, r.flex_lse));
  }
}

/// "Within fp32 rounding": both kernels are within FlashAttention's rule of the double
/// reference, so they differ by at most twice that: 4 x the error of a naive fp32 attention
/// on the same inputs (what fp32 rounding does there), plus 1e-6. The scores' magnitude sets
/// it: ALiBi biases of up to 150 round to ~1e-5 in fp32, and O and the LSE move with them.
template <class ScoreMod>
void expect_within_rounding(const ProblemShape& s, std::uint64_t seed, const ForwardOptions& builtin,
                            const ScoreMod& score_mod, std::optional<float> scale = std::nullopt) {
  ForwardOptions flex_opts;
  flex_opts.softmax_scale = scale;
  const Pair r = builtin_and_flex(s, seed, builtin, score_mod, flex::no_mask{}, flex_opts);
  BackwardProblem<float> p(s, seed);
  const float fscale = scale.value_or(1.0f / std::sqrt(static_cast<float>(s.head_dim)));
  const auto ref = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), score_mod, flex::no_mask{}, fscale);
  const Deviation naive = naive_deviation(p, ref, score_mod, flex::no_mask{}, fscale);
  EXPECT_LE(r.max_o_difference(), 1e-6 + 4 * naive.o);
  EXPECT_LE(r.max_lse_difference(), 1e-6 + 4 * naive.lse);
  EXPECT_LE(naive.o, naive_ceiling<float>()) << "the naive attention is far from the reference";
}

TEST(FlexForwardEqualsBuiltin, AlibiWithinRounding) {
  for (const ProblemShape& s : equality_shapes) {
    SCOPED_TRACE(shape_name(s));
    const auto slopes = alibi_slopes(s.heads);
    ForwardOptions opts;
    opts.alibi_slopes = slopes;
    expect_within_rounding(s, 43, opts, flex::alibi{slopes, s.seqlen_k - s.seqlen_q});
  }
}

TEST(FlexForwardEqualsBuiltin, SoftcapWithinRounding) {
  for (const ProblemShape& s : equality_shapes)
    for (float scale : {0.2f, 0.9f}) {
      SCOPED_TRACE(shape_name(s) + ", scale " + std::to_string(scale));
      ForwardOptions opts;
      opts.softcap = 3.0f;
      opts.softmax_scale = scale;
      expect_within_rounding(s, 44, opts, flex::softcap{3.0f}, scale);
    }
}

// ---- bf16 and fp16 --------------------------------------------------------------------------------

template <class T>
void check_precision(const ProblemShape& s, std::uint64_t seed) {
  SCOPED_TRACE(std::string(type_name<T>()) + ", " + shape_name(s));
  const index_t max_distance = 20;
  const auto table = normal_values(static_cast<std::size_t>(s.heads * (2 * max_distance + 1)), seed + 1);
  const auto q_ids = document_ids(s.seqlen_q, seed + 2, 90), k_ids = document_ids(s.seqlen_k, seed + 2, 90);
  const flex::relative_bias bias{table, max_distance};
  const flex::document mask{q_ids, k_ids};
  BackwardProblem<T> p(s, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const auto ref = reference::flex_attention<T>(c(p.qv), c(p.kv), c(p.vv), bias, mask, scale);
  const Deviation naive = naive_deviation(p, ref, bias, mask, scale);
  run_forward(p, bias, create_block_mask(mask, 1, 1, s.seqlen_q, s.seqlen_k, {32, 32}));
  const FloatOutput out = float_output(p);
  expect_rule<T>(compare_to_reference(ref, out.view, p.lse_view()), naive, 1e-5);
}

TEST(FlexForwardPrecision, Bf16DocumentAndRelativeBias) {
  check_precision<bf16>({1, 300, 300, 4, 2, 64, 64}, 50);
  check_precision<bf16>({2, 127, 17, 2, 2, 40, 40}, 51);
}

TEST(FlexForwardPrecision, Fp16DocumentAndRelativeBias) {
  check_precision<fp16>({1, 300, 300, 4, 2, 64, 64}, 52);
  check_precision<fp16>({2, 17, 127, 2, 1, 40, 40}, 53);
}

// ---- Same bits for every plan, backend and thread count ---------------------------------------------

struct DeterminismCase {
  ProblemShape s{2, 300, 257, 4, 2, 32, 32};
  std::vector<std::int32_t> ids = document_ids(300, 60, 90);
  std::vector<float> table = normal_values(4 * 21, 61);
  flex::relative_bias bias{table, 10};
  flex::document mask{ids};  // (the types of the RelativeBias cases: no new kernel to compile)
  BlockMask<flex::document> blocks = create_block_mask(mask, 1, 1, 300, 257, {24, 40});  // matches no tile
  BackwardProblem<float> p{s, 62};

  struct Bits {
    std::vector<float> o, lse;
  };
  template <class Mask>
  Bits run(const Mask& m, Execution exec, std::size_t budget) {
    ForwardOptions opts;
    opts.execution = exec;
    opts.sram_budget_bytes = budget;
    run_forward(p, bias, m, opts);
    return {p.o, p.lse};
  }
};

TEST(FlexForwardDeterminism, SameBitsForEveryBackendAndThreadCount) {
  DeterminismCase t;
  ASSERT_GT(t.blocks.count(BlockKind::partial), 0);
  ASSERT_GT(t.blocks.count(BlockKind::empty), 0);
  const float scale = 1.0f / std::sqrt(32.0f);
  const auto ref = reference::flex_attention<float>(c(t.p.qv), c(t.p.kv), c(t.p.vv), t.bias, t.mask, scale);
  const Deviation naive = naive_deviation(t.p, ref, t.bias, t.mask, scale);
  const int repeats = std::min(determinism_repeats(), 3);
  for (std::size_t budget : {std::size_t{0}, std::size_t{48 * 1024}}) {
    ForwardOptions at_budget;
    at_budget.sram_budget_bytes = budget;
    const TilePlan plan = plan_forward(c(t.p.qv), c(t.p.kv), c(t.p.vv), at_budget).tiles();
    SCOPED_TRACE("budget " + std::to_string(budget) + ", tiles " + std::to_string(plan.query_tile_rows) + " x " +
                 std::to_string(plan.key_tile_rows));
    const auto base = t.run(t.blocks, {Backend::serial, 1}, budget);
    expect_rule(compare_to_reference(ref, c(t.p.ov), t.p.lse_view()), naive, forward_o_tolerance);
    const auto bare = t.run(t.mask, {Backend::serial, 1}, budget);
    EXPECT_TRUE(bitwise_equal(bare.o, base.o) && bitwise_equal(bare.lse, base.lse)) << "the block mask changed bits";
    for (Backend b : compiled_backends())
      for (int threads : {1, 2, 3})
        for (int r = 0; r < (threads > 1 ? repeats : 1); ++r) {
          SCOPED_TRACE(std::string(to_string(b)) + " x " + std::to_string(threads));
          const auto got = t.run(t.blocks, {b, threads}, budget);
          EXPECT_TRUE(bitwise_equal(got.o, base.o));
          EXPECT_TRUE(bitwise_equal(got.lse, base.lse));
        }
  }
}

// docs/flex.md: the block mask never makes a result depend on the plan. Query tiles of other
// heights (budgets that keep the key tile) cut the 24 x 40 blocks into other row runs, and
// give the same bits. Budgets that change the key tile move the online softmax's rescaling
// points and so the last bits, as forward() does without flex: there the flex forward with
// a block mask gives the same bits as with the bare mask_mod (no block mask, no skipping).
TEST(FlexForwardDeterminism, BlockMaskAddsNoPlanDependence) {
  DeterminismCase t;
  std::vector<std::pair<std::size_t, TilePlan>> plans;
  for (std::size_t kib = 24; kib <= 512; kib += 16) {
    ForwardOptions at_budget;
    at_budget.sram_budget_bytes = kib * 1024;
    plans.emplace_back(kib * 1024, plan_forward(c(t.p.qv), c(t.p.kv), c(t.p.vv), at_budget).tiles());
  }
  const auto base = t.run(t.blocks, {Backend::serial, 1}, plans.front().first);
  int same_key_tile = 0;
  index_t last_rows = plans.front().second.query_tile_rows;
  for (const auto& [budget, plan] : plans) {
    SCOPED_TRACE("budget " + std::to_string(budget) + ", tiles " + std::to_string(plan.query_tile_rows) + " x " +
                 std::to_string(plan.key_tile_rows));
    const auto with_blocks = t.run(t.blocks, {Backend::serial, 1}, budget);
    const auto bare = t.run(t.mask, {Backend::serial, 1}, budget);
    EXPECT_TRUE(bitwise_equal(with_blocks.o, bare.o));
    EXPECT_TRUE(bitwise_equal(with_blocks.lse, bare.lse));
    if (plan.key_tile_rows == plans.front().second.key_tile_rows && plan.query_tile_rows != last_rows) {
      ++same_key_tile;
      last_rows = plan.query_tile_rows;
      EXPECT_TRUE(bitwise_equal(with_blocks.o, base.o));
      EXPECT_TRUE(bitwise_equal(with_blocks.lse, base.lse));
    }
  }
  EXPECT_GE(same_key_tile, 1) << "no two budgets gave query tiles of other heights over the same key tile";
}

// ---- IO: empty blocks are never loaded --------------------------------------------------------------

constexpr std::uint64_t f32 = sizeof(float);

/// forward()'s count (forward_io_test.cpp's analytic_io) when each query tile reads the K/V
/// rows of the key tiles `seen(row0, rows, col0, cols)` says it sees: Q, O and LSE once, and
/// K and V once per query tile and head chunk for each key tile seen.
template <class Seen>
IoCounts expected_io(const ProblemShape& s, const TilePlan& plan, Seen&& seen) {
  const index_t group = s.heads / s.heads_kv, chunks = plan.head_chunks(group);
  std::uint64_t read = 0;
  for (index_t row0 = 0; row0 < s.seqlen_q; row0 += plan.query_tile_rows) {
    const index_t rows = std::min(plan.query_tile_rows, s.seqlen_q - row0);
    read += static_cast<std::uint64_t>(group * rows * s.head_dim);  // Q
    for (index_t col0 = 0; col0 < s.seqlen_k; col0 += plan.key_tile_rows) {
      const index_t cols = std::min(plan.key_tile_rows, s.seqlen_k - col0);
      if (seen(row0, rows, col0, cols)) read += static_cast<std::uint64_t>(chunks * cols * (s.head_dim + s.head_dim_v));
    }
  }
  IoCounts io;
  io.bytes_read = read * static_cast<std::uint64_t>(s.batch * s.heads_kv) * f32;
  io.bytes_written = static_cast<std::uint64_t>(s.batch * s.heads * s.seqlen_q * (s.head_dim_v + 1)) * f32;
  return io;
}

TEST(FlexForwardIo, BlockSparseReadsOnlyTheKeyTilesItSees) {
  const ProblemShape s{2, 300, 300, 4, 2, 32, 32};
  BackwardProblem<float> p(s, 70);
  for (std::size_t budget : {std::size_t{0}, rows_budget(16, 32)}) {
    ForwardOptions opts;
    opts.execution = {Backend::serial, 1};
    opts.sram_budget_bytes = budget;
    const TilePlan plan = plan_forward(c(p.qv), c(p.kv), c(p.vv), opts).tiles();
    SCOPED_TRACE("tiles " + std::to_string(plan.query_tile_rows) + " x " + std::to_string(plan.key_tile_rows) +
                 ", heads per tile " + std::to_string(plan.heads_per_tile));
    const index_t bc = plan.key_tile_rows, kv_blocks = (300 + bc - 1) / bc;
    IoCounts dense;
    opts.io_counts = &dense;
    run_forward(p, flex::no_score_mod{}, flex::no_mask{}, opts);
    EXPECT_EQ(dense, expected_io(s, plan, [](auto...) { return true; }));
    const std::vector<float> dense_o = p.o;

    // Square blocks of the key tile's size, so key tile c is key block c exactly.
    // (The last key block is seen by no query block, so even one query tile skips a key tile.)
    auto layout = random_layout(kv_blocks, kv_blocks, 0.35, 71);
    for (index_t qb = 0; qb < kv_blocks; ++qb) layout[static_cast<std::size_t>(qb * kv_blocks + kv_blocks - 1)] = 0;
    const flex::block_sparse mask{layout, kv_blocks, bc};
    const auto blocks = create_block_mask(mask, 1, 1, 300, 300, {bc, bc});
    const auto seen = [&](index_t row0, index_t rows, index_t col0, index_t) {
      for (index_t qb = row0 / bc; qb * bc < row0 + rows; ++qb)
        if (layout[static_cast<std::size_t>(qb * kv_blocks + col0 / bc)]) return true;
      return false;
    };
    IoCounts sparse;
    opts.io_counts = &sparse;
    run_forward(p, flex::no_score_mod{}, blocks, opts);
    EXPECT_EQ(sparse, expected_io(s, plan, seen));
    EXPECT_LT(sparse.bytes_read, dense.bytes_read);

    // Every block empty but one column: that column's K/V once per query tile, plus Q and O.
    auto one_column = create_block_mask(flex::no_mask{}, 1, 1, 300, 300, {bc, bc});
    for (index_t qb = 0; qb < kv_blocks; ++qb)
      for (index_t kb = 0; kb < kv_blocks; ++kb)
        if (kb != 1) one_column.set_kind(0, 0, qb, kb, BlockKind::empty);
    IoCounts column;
    opts.io_counts = &column;
    run_forward(p, flex::no_score_mod{}, one_column, opts);
    const std::uint64_t q_tiles = static_cast<std::uint64_t>(plan.query_tiles(300)), B = 2, H = 4, Hkv = 2, N = 300,
                        D = 32;
    const auto cols = static_cast<std::uint64_t>(std::min<index_t>(bc, 300 - bc));
    const auto chunks = static_cast<std::uint64_t>(plan.head_chunks(2));
    EXPECT_EQ(column.bytes_read, (B * H * N * D + B * Hkv * q_tiles * chunks * cols * 2 * D) * f32);
    EXPECT_EQ(column.bytes_written, B * H * N * (D + 1) * f32);
  }
}

// ---- Edited block masks ---------------------------------------------------------------------------

// A block mask is applied as edited (set_kind): empty blocks hide every score, full ones none,
// partial ones ask the mask_mod; with flex::no_mask only the empty blocks hide.
TEST(FlexForwardBlockMask, EditedBlocksAreAppliedAsEdited) {
  const ProblemShape s{1, 127, 300, 2, 2, 32, 32};
  const BlockSize bs{16, 40};
  const float scale = 1.0f / std::sqrt(32.0f);
  BackwardProblem<float> p(s, 80);
  {
    auto blocks = create_block_mask(flex::causal{}, 1, 1, 127, 300, bs);
    blocks.set_kind(0, 0, 2, 0, BlockKind::empty);    // was full
    blocks.set_kind(0, 0, 3, 1, BlockKind::partial);  // was full: the mask_mod says visible
    blocks.set_kind(0, 0, 0, 5, BlockKind::full);     // was empty: now visible
    blocks.set_kind(0, 0, 1, 6, BlockKind::partial);  // was empty: the mask_mod says hidden
    const auto as_edited = [&](index_t b, index_t h, index_t i, index_t j) {
      const BlockKind k = blocks.kind(b, h, i / bs.q, j / bs.kv);
      return k == BlockKind::full || (k == BlockKind::partial && flex::causal{}(b, h, i, j));
    };
    const auto ref =
        reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), flex::no_score_mod{}, as_edited, scale);
    run_forward(p, flex::no_score_mod{}, blocks);
    expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()),
                naive_deviation(p, ref, flex::no_score_mod{}, as_edited, scale), forward_o_tolerance);
  }
  {
    auto blocks = create_block_mask(flex::no_mask{}, 1, 1, 127, 300, bs);
    EXPECT_EQ(blocks.count(BlockKind::full), blocks.q_blocks() * blocks.kv_blocks());
    for (index_t qb = 0; qb < blocks.q_blocks(); ++qb)
      for (index_t kb = 0; kb < blocks.kv_blocks(); ++kb)
        if ((qb + 2 * kb) % 3 == 0) blocks.set_kind(0, 0, qb, kb, BlockKind::empty);
    blocks.set_kind(0, 0, 7, 4, BlockKind::partial);  // no_mask: a partial block hides nothing
    const auto as_edited = [&](index_t b, index_t h, index_t i, index_t j) {
      return blocks.kind(b, h, i / bs.q, j / bs.kv) != BlockKind::empty;
    };
    const auto ref =
        reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), flex::no_score_mod{}, as_edited, scale);
    run_forward(p, flex::no_score_mod{}, blocks);
    expect_rule(compare_to_reference(ref, c(p.ov), p.lse_view()),
                naive_deviation(p, ref, flex::no_score_mod{}, as_edited, scale), forward_o_tolerance);
  }
}

// A copy of a block mask outlives its original; a moved one keeps working.
TEST(FlexForwardBlockMask, CopiesAndMovesOutliveTheOriginal) {
  const ProblemShape s{1, 127, 127, 2, 2, 16, 16};
  BackwardProblem<float> p(s, 81);
  run_forward(p, flex::no_score_mod{}, flex::causal{});
  const std::vector<float> want = p.o;
  std::optional<BlockMask<flex::causal>> original = create_block_mask(flex::causal{}, 1, 1, 127, 127, {16, 16});
  BlockMask<flex::causal> copy = *original;
  BlockMask<flex::causal> assigned = create_block_mask(flex::causal{}, 1, 1, 5, 5, {16, 16});
  assigned = *original;
  original.reset();
  run_forward(p, flex::no_score_mod{}, copy);
  EXPECT_TRUE(bitwise_equal(p.o, want));
  run_forward(p, flex::no_score_mod{}, assigned);
  EXPECT_TRUE(bitwise_equal(p.o, want));
  BlockMask<flex::causal> moved = std::move(copy);
  run_forward(p, flex::no_score_mod{}, moved);
  EXPECT_TRUE(bitwise_equal(p.o, want));
}

// The overload without the LSE writes the same O.
TEST(FlexForwardBlockMask, WithoutLseGivesTheSameO) {
  const ProblemShape s{1, 127, 300, 4, 2, 32, 32};
  BackwardProblem<float> p(s, 82);
  const auto blocks = create_block_mask(flex::causal{}, 1, 1, 127, 300, {16, 16});
  run_forward(p, flex::no_score_mod{}, blocks);
  const std::vector<float> want = p.o;
  std::fill(p.o.begin(), p.o.end(), sentinel);
  forward_flex(c(p.qv), c(p.kv), c(p.vv), p.ov, flex::no_score_mod{}, blocks);
  EXPECT_TRUE(bitwise_equal(p.o, want));
}

// ---- Errors ---------------------------------------------------------------------------------------

template <class F>
void expect_invalid(F&& f, const std::string& parameter) {
  try {
    f();
    ADD_FAILURE() << "no invalid_argument (expected one naming " << parameter << ")";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
  }
}

TEST(FlexForwardErrors, BlockMaskOfAnotherShapeWritesNothing) {
  const ProblemShape s{2, 17, 127, 4, 2, 16, 16};
  BackwardProblem<float> p(s, 90);
  std::fill(p.lse.begin(), p.lse.end(), sentinel);
  const auto call = [&](const auto& blocks) {
    return [&] { forward_flex(c(p.qv), c(p.kv), c(p.vv), p.ov, p.lse_view(), flex::no_score_mod{}, blocks); };
  };
  const flex::causal m{};
  expect_invalid(call(create_block_mask(m, 1, 1, 18, 127)), "block_mask");  // seqlen_q
  expect_invalid(call(create_block_mask(m, 1, 1, 17, 126)), "block_mask");  // seqlen_k
  expect_invalid(call(create_block_mask(m, 1, 2, 17, 127)), "block_mask");  // heads: neither 1 nor 4
  expect_invalid(call(create_block_mask(m, 1, 8, 17, 127)), "block_mask");
  expect_invalid(call(create_block_mask(m, 3, 1, 17, 127)), "block_mask");  // batch: neither 1 nor 2
  EXPECT_TRUE(all_equal(p.o, sentinel)) << "a rejected call wrote O";
  EXPECT_TRUE(all_equal(p.lse, sentinel)) << "a rejected call wrote the LSE";
  // Varlen: the block mask covers max_seqlen_q x max_seqlen_k.
  const std::vector<std::int32_t> cu{0, 5, 17};
  const std::vector<std::int32_t> cu_k{0, 100, 127};
  const VarlenSequences seqs{cu, cu_k, 12, 100};
  const auto packed = [](const auto& t) {
    using E = std::remove_reference_t<decltype(*t.data)>;
    return PackedView<E>{t.data, {t.shape[1], t.shape[2], t.shape[3]}, {t.stride[1], t.stride[2], t.stride[3]}};
  };
  BackwardProblem<float> v(ProblemShape{1, 17, 127, 4, 2, 16, 16}, 91);
  // (The types of the varlen test's calls: no new kernel to compile.)
  const auto table = normal_values(4 * 5, 96);
  const flex::relative_bias bias{table, 2};
  const AnyMask any{m};
  expect_invalid(
      [&] {
        forward_flex_varlen(packed(c(v.qv)), packed(c(v.kv)), packed(c(v.vv)), packed(v.ov), PackedLseView{}, seqs,
                            bias, create_block_mask(any, 1, 1, 17, 127));
      },
      "block_mask");
  EXPECT_TRUE(all_equal(v.o, sentinel));
  // The right shapes pass.
  forward_flex(c(p.qv), c(p.kv), c(p.vv), p.ov, p.lse_view(), flex::no_score_mod{},
               create_block_mask(m, 2, 4, 17, 127));
  forward_flex_varlen(packed(c(v.qv)), packed(c(v.kv)), packed(c(v.vv)), packed(v.ov), PackedLseView{}, seqs, bias,
                      create_block_mask(any, 2, 1, 12, 100));
}

// ---- Non-finite values and rows that see nothing ------------------------------------------------------

/// Rows (b, i, h) of O holding a NaN.
std::vector<std::array<index_t, 3>> nan_rows(const BackwardProblem<float>& p) {
  std::vector<std::array<index_t, 3>> rows;
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t i = 0; i < p.s.seqlen_q; ++i)
      for (index_t h = 0; h < p.s.heads; ++h)
        for (index_t c = 0; c < p.s.head_dim_v; ++c)
          if (std::isnan(p.ov(b, i, h, c))) {
            rows.push_back({b, i, h});
            break;
          }
  return rows;
}

// (Both tests use document masks with the types of the Document and RelativeBias cases: no
// new kernel to compile.)
TEST(FlexForwardNonFinite, ANanInQMakesExactlyItsRowNan) {
  const ProblemShape s{2, 127, 300, 4, 2, 32, 32};
  const auto ids = document_ids(300, 92, 50);
  std::vector<std::int32_t> q_ids(ids.begin(), ids.begin() + 127);
  q_ids[9] = -1;  // query 9 is in a document of no key: it sees nothing
  const flex::document mask{q_ids, ids};
  const index_t max_distance = 6;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * max_distance + 1)), 95);
  const flex::relative_bias bias{table, max_distance};
  const float scale = 1.0f / std::sqrt(32.0f);
  BackwardProblem<float> p(s, 93);
  p.qv(1, 40, 3, 7) = nan_value;  // a visible row
  p.qv(0, 9, 0, 0) = nan_value;   // a row that sees nothing
  const auto ref = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), bias, mask, scale);
  const auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(compare_to_reference(ref, c(p.ov), p.lse_view()).problem, "");
    const auto rows = nan_rows(p);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0], (std::array<index_t, 3>{1, 40, 3}));
    for (index_t c = 0; c < 32; ++c) EXPECT_TRUE(std::isnan(p.ov(1, 40, 3, c)));
    EXPECT_TRUE(std::isnan(p.lse_view()(1, 3, 40)));
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 4; ++h) {
        for (index_t c = 0; c < 32; ++c) ASSERT_EQ(p.ov(b, 9, h, c), 0.0f);
        EXPECT_EQ(p.lse_view()(b, h, 9), -inf);
      }
  };
  run_forward(p, bias, mask);
  check("bare mask_mod");
  run_forward(p, bias, create_block_mask(mask, 1, 1, 127, 300, {16, 16}));
  check("block mask");
  run_forward(p, flex::no_score_mod{}, create_block_mask(mask, 1, 1, 127, 300, {7, 13}));
  check("block mask, no score_mod");
}

// Keys the mask_mod hides from every row take no part: an Inf or NaN in their K or V rows
// reaches no output (the forward() contract, reference/naive_attention.hpp).
TEST(FlexForwardNonFinite, NonFiniteKeysThatTheMaskHidesReachNothing) {
  const ProblemShape s{1, 127, 127, 2, 1, 16, 16};
  const std::vector<std::int32_t> q_ids(127, 0);
  std::vector<std::int32_t> kv_ids(127, 0);
  kv_ids[50] = 1;  // key 50 is in a document of no query
  const flex::document mask{q_ids, kv_ids};
  BackwardProblem<float> p(s, 94);
  p.kv(0, 50, 0, 3) = inf;
  p.vv(0, 50, 0, 5) = nan_value;
  const auto ref =
      reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), flex::no_score_mod{}, mask, 1.0f / std::sqrt(16.0f));
  for (int blocked = 0; blocked < 2; ++blocked) {
    SCOPED_TRACE(blocked ? "block mask" : "bare mask_mod");
    if (blocked)
      run_forward(p, flex::no_score_mod{}, create_block_mask(mask, 1, 1, 127, 127, {16, 16}));
    else
      run_forward(p, flex::no_score_mod{}, mask);
    const Deviation dev = compare_to_reference(ref, c(p.ov), p.lse_view());
    EXPECT_EQ(dev.problem, "");
    EXPECT_LE(dev.o, forward_o_tolerance);
    EXPECT_TRUE(nan_rows(p).empty());
  }
}


// ---- 8-bit K/V -----------------------------------------------------------------------------------

/// int8 and fp8 K/V with power-of-two scales per (sequence, K/V head) give the bits of the
/// flex forward over the dequantized K/V in float (as forward() does: QuantizedForward in
/// tests/paged/quantized_kv_test.cpp), on the packed path (40 queries) and the in-place one
/// (3 queries, decode-shaped), GQA, with a block mask and a score_mod.
template <class Q8>
void check_8bit_kv_bitwise_as_float() {
  for (const index_t n : {index_t{40}, index_t{3}}) {
    const index_t B = 2, nk = 300, H = 4, Hkv = 2, d = 32;
    const auto q = normal_values(static_cast<std::size_t>(B * n * H * d), 70);
    const auto k_values = normal_values(static_cast<std::size_t>(B * nk * Hkv * d), 71);
    const auto v_values = normal_values(static_cast<std::size_t>(B * nk * Hkv * d), 72);
    std::vector<float> scales_k(static_cast<std::size_t>(B * Hkv)), scales_v(scales_k.size());
    for (std::size_t i = 0; i < scales_k.size(); ++i) {
      scales_k[i] = std::ldexp(1.0f, -5 + static_cast<int>(i % 3));
      scales_v[i] = std::ldexp(1.0f, -4 - static_cast<int>(i % 2));
    }
    std::vector<Q8> k8(k_values.size()), v8(v_values.size());
    std::vector<float> kd(k_values.size()), vd(v_values.size());
    for (std::size_t i = 0; i < k8.size(); ++i) {
      const std::size_t bh = (i / static_cast<std::size_t>(nk * Hkv * d)) * static_cast<std::size_t>(Hkv) +
                             (i / static_cast<std::size_t>(d)) % static_cast<std::size_t>(Hkv);
      k8[i] = quantize<Q8>(k_values[i], scales_k[bh]);
      v8[i] = quantize<Q8>(v_values[i], scales_v[bh]);
      kd[i] = dequantize(k8[i], scales_k[bh]);
      vd[i] = dequantize(v8[i], scales_v[bh]);
    }
    const auto ids = document_ids(nk, 73, 70);
    const auto q_ids = std::vector<std::int32_t>(ids.end() - n, ids.end());  // the last n positions' documents
    const auto table = normal_values(static_cast<std::size_t>(H * 21), 74);
    const flex::relative_bias bias{table, 10};
    const flex::document mask{q_ids, ids};
    const auto blocks = create_block_mask(mask, 1, 1, n, nk, {16, 32});
    ForwardOptions opts;
    opts.k_scale = {scales_k.data(), {B, Hkv}, {Hkv, 1}};
    opts.v_scale = {scales_v.data(), {B, Hkv}, {Hkv, 1}};
    std::vector<float> o8(static_cast<std::size_t>(B * n * H * d), -7.0f), o32(o8.size(), -7.0f);
    std::vector<float> lse8(static_cast<std::size_t>(B * H * n)), lse32(lse8.size());
    forward_flex(make_bshd(q.data(), B, n, H, d), make_bshd(k8.data(), B, nk, Hkv, d),
                 make_bshd(v8.data(), B, nk, Hkv, d), make_bshd(o8.data(), B, n, H, d),
                 make_lse(lse8.data(), B, H, n), bias, blocks, opts);
    forward_flex(make_bshd(q.data(), B, n, H, d), make_bshd(kd.data(), B, nk, Hkv, d),
                 make_bshd(vd.data(), B, nk, Hkv, d), make_bshd(o32.data(), B, n, H, d),
                 make_lse(lse32.data(), B, H, n), bias, blocks);
    EXPECT_TRUE(bitwise_equal(o8, o32)) << "N " << n;
    EXPECT_TRUE(bitwise_equal(lse8, lse32)) << "N " << n;
    EXPECT_EQ(std::count(o8.begin(), o8.end(), -7.0f), 0) << "N " << n;
  }
}

TEST(FlexForward8BitKv, Int8PowerOfTwoScalesBitwiseAsFloatKv) { check_8bit_kv_bitwise_as_float<std::int8_t>(); }
TEST(FlexForward8BitKv, E4m3PowerOfTwoScalesBitwiseAsFloatKv) { check_8bit_kv_bitwise_as_float<fp8_e4m3>(); }

}  // namespace
}  // namespace tileattn::test
