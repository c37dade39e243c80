// tests/flex/flex_backward_test.cpp: tileattn::backward_flex and backward_flex_varlen (flex.hpp)
// against the analytic double-precision gradients of tests/reference/naive_flex.hpp, under
// backward_test.cpp's form of FlashAttention's rule: max error <= 3 x a naive same-precision
// flex backward's + 2e-4, relative to the gradient's magnitude (fp32 also <= 2e-5 relative):
//   - every differentiable library score mod and a custom with_grad one, with the causal,
//     document, prefix-LM and block-sparse masks as block masks (two of them bare too, which
//     must give the same bits), GQA, odd sizes, head_dim_v != head_dim, the built-in softcap,
//     ALiBi and causal mask chained with a score_mod whose derivative is NaN where scores are
//     hidden, one varlen batch with an empty sequence and a per-sequence, per-head mask, bf16.
//     The backward starts from the reference's O and LSE (rounded to T): forward_flex has its
//     own test, and a forward kernel compiled per case here would cost compile time;
//   - the reference itself against central differences of the double forward;
//   - the same bits for every backend, thread count and SRAM budget, with a 24 x 40 block mask;
//   - IO: query tiles a block mask hides from a key tile load nothing (exact counts);
//   - errors: dbias with a score_mod, a block mask of another shape (nothing written);
//     a NaN in Q reaches what its row sees; rows that see nothing get zero gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/flex_support.hpp"
#include "reference/naive_flex.hpp"
#include "support/backward_rule.hpp"
#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

const auto wavy = flex::with_grad{[](auto s, index_t, index_t h, index_t i, index_t j) {
                                    using S = decltype(s);
                                    return s + S(0.5) * std::sin(s) -
                                           S(0.01) * static_cast<S>(h + 1) * static_cast<S>(i > j ? i - j : j - i);
                                  },
                                  [](auto s, index_t, index_t, index_t, index_t) {
                                    using S = decltype(s);
                                    return S(1) + S(0.5) * std::cos(s);
                                  }};

std::string shape_name(const ProblemShape& s) {
  return "b" + std::to_string(s.batch) + " " + std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k) + " h" +
         std::to_string(s.heads) + "/" + std::to_string(s.heads_kv) + " d" + std::to_string(s.head_dim);
}

template <class T>
TensorView<const T> c(const TensorView<T>& v) {
  return v;
}

template <class T>
void fill(std::vector<T>& x, float value) {
  std::fill(x.begin(), x.end(), from_float<T>(value));
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// forward_flex into p.o and p.lse.
template <class T, class ScoreMod, class Mask>
void run_flex_forward(BackwardProblem<T>& p, const ScoreMod& score_mod, const Mask& mask, ForwardOptions opts = {}) {
  opts.io_counts = nullptr;
  forward_flex(c(p.qv), c(p.kv), c(p.vv), p.ov, p.lse_view(), score_mod, mask, opts);
}

/// The forward's saved state from the double reference: O rounded to T and the LSE to float
/// (what the backward takes: O as stored, and its log-sum-exp). The backward is checked on
/// its own, from exact inputs; the flex forward has flex_forward_test, and each forward
/// kernel compiled here would cost compile time (varlen: r holds the packed rows, batch 1).
template <class T>
void save_forward(BackwardProblem<T>& p, const reference::AttentionResult& r) {
  const LseView lse = make_lse(p.lse.data(), r.batch, r.heads, r.seqlen_q);
  for (index_t b = 0; b < r.batch; ++b)
    for (index_t i = 0; i < r.seqlen_q; ++i)
      for (index_t h = 0; h < r.heads; ++h) {
        lse(b, h, i) = static_cast<float>(r.log_sum_exp(b, h, i));
        for (index_t d = 0; d < r.head_dim; ++d)
          p.ov(b, i, h, d) = from_float<T>(static_cast<float>(r.out(b, i, h, d)));
      }
}
template <class T, class ScoreMod, class MaskMod>
void save_forward(BackwardProblem<T>& p, const ScoreMod& score_mod, const MaskMod& mask_mod, float scale) {
  save_forward(p, reference::flex_attention<T>(c(p.qv), c(p.kv), c(p.vv), score_mod, mask_mod, scale));
}

/// backward_flex from p's O and LSE into p.dq, p.dk, p.dv (reset to the sentinel first).
template <class T, class ScoreMod, class Mask>
void run_flex_backward(BackwardProblem<T>& p, const ScoreMod& score_mod, const Mask& mask,
                       const BackwardOptions& opts = {}) {
  fill(p.dq, sentinel);
  fill(p.dk, sentinel);
  fill(p.dv, sentinel);
  backward_flex(c(p.qv), c(p.kv), c(p.vv), c(p.ov), p.lse_view(), c(p.dov), p.dqv, p.dkv, p.dvv, score_mod, mask, opts);
}

template <class T>
void expect_grads(const BackwardProblem<T>& p, const reference::BackwardResult& ref,
                  const reference::NaiveBackwardF& naive) {
  expect_within_rule<T>(p.grad_q(), ref.dq, naive.dq, "dq");
  expect_within_rule<T>(p.grad_k(), ref.dk, naive.dk, "dk");
  expect_within_rule<T>(p.grad_v(), ref.dv, naive.dv, "dv");
}

/// Block sizes for check_backward: BlockSizes runs the bare mask_mod and then block masks of
/// these sizes, which must give the same bits; BlockOnly runs only the block masks against
/// the reference. (Each (score_mod, mask) pair compiles a forward and a backward kernel of its
/// own, several seconds under the sanitizers: most cases take the block mask only.)
struct BlockSizes {
  std::vector<BlockSize> sizes;
  BlockSizes(std::initializer_list<BlockSize> s) : sizes(s) {}
};
struct BlockOnly {
  std::vector<BlockSize> sizes;
  BlockOnly(std::initializer_list<BlockSize> s) : sizes(s) {}
};

/// One case in storage type T: forward_flex then backward_flex against the reference
/// gradients, with the bare mask_mod and/or block masks of the given sizes (over mask_batch
/// x mask_heads).
template <class T, class ScoreMod, class MaskMod, class Blocks>
void check_backward(const std::string& name, const ProblemShape& s, std::uint64_t seed, const ScoreMod& score_mod,
                    const MaskMod& mask_mod, const Blocks& blocks, index_t mask_batch = 1, index_t mask_heads = 1,
                    std::optional<float> scale = std::nullopt) {
  SCOPED_TRACE(name + ", " + shape_name(s) + ", " + type_name<T>());
  BackwardProblem<T> p(s, seed);
  BackwardOptions opts;
  opts.softmax_scale = scale;
  const float fscale = scale.value_or(1.0f / std::sqrt(static_cast<float>(s.head_dim)));
  const auto ref =
      reference::flex_attention_backward<T>(c(p.qv), c(p.kv), c(p.vv), c(p.dov), score_mod, mask_mod, fscale);
  const auto naive =
      reference::flex_attention_backward_naive<T>(c(p.qv), c(p.kv), c(p.vv), c(p.dov), score_mod, mask_mod, fscale);
  save_forward(p, score_mod, mask_mod, fscale);
  std::vector<T> dq, dk, dv;
  if constexpr (std::is_same_v<Blocks, BlockSizes>) {
    run_flex_backward(p, score_mod, mask_mod, opts);
    expect_grads(p, ref, naive);
    dq = p.dq, dk = p.dk, dv = p.dv;
  }
  for (const BlockSize& bs : blocks.sizes) {
    SCOPED_TRACE("block mask " + std::to_string(bs.q) + " x " + std::to_string(bs.kv));
    const auto blocks_of = create_block_mask(mask_mod, mask_batch, mask_heads, s.seqlen_q, s.seqlen_k, bs);
    run_flex_backward(p, score_mod, blocks_of, opts);
    if constexpr (std::is_same_v<Blocks, BlockSizes>) {
      EXPECT_TRUE(same_bits(p.dq, dq)) << "the block mask changed dq";
      EXPECT_TRUE(same_bits(p.dk, dk)) << "the block mask changed dk";
      EXPECT_TRUE(same_bits(p.dv, dv)) << "the block mask changed dv";
    } else {
      expect_grads(p, ref, naive);
    }
  }
}

// ---- The reference against central differences -------------------------------------------------------

/// flex_attention_backward's dq, dk, dv against central differences of L = sum(dout * O),
/// O from flex_attention, on a tiny double problem: |analytic - numeric| <= 1e-7 (1 + max |numeric|).
template <class ScoreMod, class MaskMod>
void check_reference_gradients(const std::string& what, const ScoreMod& score_mod, const MaskMod& mask_mod) {
  SCOPED_TRACE(what);
  const index_t B = 1, nq = 5, nk = 7, H = 2, Hkv = 1, d = 3;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  const auto draw = [&](index_t n) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (double& e : x) e = normal(rng);
    return x;
  };
  std::vector<double> q = draw(B * nq * H * d), k = draw(B * nk * Hkv * d), v = draw(B * nk * Hkv * d),
                      dout = draw(B * nq * H * d);
  const auto Q = make_bshd(static_cast<const double*>(q.data()), B, nq, H, d);
  const auto K = make_bshd(static_cast<const double*>(k.data()), B, nk, Hkv, d);
  const auto V = make_bshd(static_cast<const double*>(v.data()), B, nk, Hkv, d);
  const auto dO = make_bshd(static_cast<const double*>(dout.data()), B, nq, H, d);
  const double scale = 0.8;
  const auto loss = [&] {
    const auto r = reference::flex_attention<double>(Q, K, V, score_mod, mask_mod, scale);
    double l = 0.0;
    for (std::size_t e = 0; e < r.o.size(); ++e) l += r.o[e] * dout[e];
    return l;
  };
  const auto g = reference::flex_attention_backward<double>(Q, K, V, dO, score_mod, mask_mod, scale);
  const auto check = [&](std::vector<double>& x, const std::vector<double>& analytic, const char* name) {
    constexpr double e = 1e-5;
    std::vector<double> numeric(x.size());
    double magnitude = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + e;
      const double up = loss();
      x[i] = keep - e;
      const double down = loss();
      x[i] = keep;
      numeric[i] = (up - down) / (2 * e);
      magnitude = std::max(magnitude, std::abs(numeric[i]));
    }
    EXPECT_GT(magnitude, 1e-3) << name;
    for (std::size_t i = 0; i < x.size(); ++i)
      EXPECT_NEAR(analytic[i], numeric[i], 1e-7 * (1 + magnitude)) << name << "[" << i << "]";
  };
  check(q, g.dq, "dq");
  check(k, g.dk, "dk");
  check(v, g.dv, "dv");
}

TEST(FlexBackwardReference, MatchesCentralDifferencesOfTheForward) {
  const std::vector<float> slopes{0.7f, 0.2f};
  const std::vector<float> table{0.3f, -1.0f, 0.5f, 2.0f, -0.7f, 0.1f, 1.1f, -0.4f, 0.9f, 0.0f};
  const std::vector<std::int32_t> ids{0, 0, 1, 1, 1, 2, 2};
  check_reference_gradients("wavy, prefix-LM", wavy, flex::prefix_lm{2});
  check_reference_gradients("softcap, causal with rows that see nothing", flex::softcap{1.5f}, flex::causal{-2});
  check_reference_gradients("alibi, document", flex::alibi{slopes, 2}, flex::document{ids});
  check_reference_gradients("relative bias, no mask", flex::relative_bias{table, 2}, flex::no_mask{});
}

// ---- Every differentiable mod and the masks, float --------------------------------------------------

TEST(FlexBackwardAccuracy, AlibiCausal) {
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
  check_backward<float>("alibi, causal", {1, 127, 300, 4, 2, 32, 32}, 1, flex::alibi{slopes, 0}, flex::causal{},
                        BlockOnly{{16, 16}, {7, 13}});
  check_backward<float>("alibi with offset, bottom-right causal", {2, 300, 127, 4, 2, 24, 24}, 2,
                        flex::alibi{slopes, 127 - 300}, flex::causal{127 - 300}, BlockOnly{{128, 128}});
}

TEST(FlexBackwardAccuracy, SoftcapDocument) {
  const auto ids = document_ids(300, 3, 60);
  check_backward<float>("softcap 2, scale 0.7, document", {1, 300, 300, 4, 2, 32, 32}, 4, flex::softcap{2.0f},
                        flex::document{ids}, BlockOnly{{16, 16}, {128, 128}}, 1, 1, 0.7f);
  check_backward<float>("softcap 20, document", {2, 17, 17, 2, 2, 16, 16}, 5, flex::softcap{20.0f}, flex::document{ids},
                        BlockOnly{{7, 13}});
}

TEST(FlexBackwardAccuracy, RelativeBiasPrefixLm) {
  const index_t md = 16;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * md + 1)), 6);
  check_backward<float>("relative bias, prefix 50", {1, 300, 300, 4, 2, 32, 32}, 7, flex::relative_bias{table, md},
                        flex::prefix_lm{50}, BlockSizes{{16, 16}, {24, 40}});
  check_backward<float>("relative bias, prefix 3", {1, 17, 127, 4, 1, 40, 40}, 8, flex::relative_bias{table, md},
                        flex::prefix_lm{3}, BlockSizes{{7, 13}});
}

TEST(FlexBackwardAccuracy, CustomWithGradBlockSparse) {
  const index_t block = 32, n = (300 + block - 1) / block;
  auto layout = random_layout(n * n, 0.4, 9);
  layout[1] = layout[3] = 1;  // query block 0 sees key blocks 1 and 3 (the one-query case)
  const flex::block_sparse mask{layout, n, block};
  check_backward<float>("wavy, block-sparse", {1, 300, 300, 4, 2, 32, 32}, 10, wavy, mask,
                        BlockOnly{{block, block}, {7, 13}, {128, 128}});
  check_backward<float>("wavy, block-sparse, one query", {2, 1, 127, 2, 2, 16, 16}, 11, wavy, mask,
                        BlockOnly{{block, block}});
}

TEST(FlexBackwardAccuracy, DocumentMaskAlone) {
  const auto ids = document_ids(300, 12, 45);
  check_backward<float>("document", {1, 300, 300, 4, 2, 32, 32}, 13, flex::no_score_mod{}, flex::document{ids},
                        BlockSizes{{16, 16}, {128, 128}});
  check_backward<float>("document, 127 x 17, head_dim_v 33", {1, 127, 17, 2, 2, 59, 33}, 14, flex::no_score_mod{},
                        flex::document{ids}, BlockSizes{{7, 13}});
}

// The built-in options apply first (docs/flex.md): the softcap, then ALiBi, then the
// score_mod on their result, whose slope the backward chains with the softcap's; the
// built-in causal mask and the mask_mod both hide, and so does the score_mod where it returns
// -inf. Its derivative is NaN wherever a score is hidden, by any of the three: that must reach
// no gradient (docs/flex.md). The reference runs the composition as one score_mod and the
// intersection as one mask_mod. (The forward too, with the kernel's own O and LSE: no other
// test runs the built-in softcap and ALiBi into a score_mod.)
TEST(FlexBackwardAccuracy, BuiltinOptionsChainWithTheScoreMod) {
  const ProblemShape s{1, 127, 300, 4, 2, 32, 32};
  const index_t offset = 300 - 127;
  const std::vector<float> slopes{0.3f, 0.1f, 0.05f, 0.02f};
  const auto ids = document_ids(300, 30, 60);
  const flex::document doc{ids};
  const flex::softcap cap{3.0f};
  const flex::alibi alibi{slopes, offset};
  const auto hidden = [&](index_t i, index_t j) {
    return (i + j) % 11 == 0 || j > i + offset || ids[static_cast<std::size_t>(i)] != ids[static_cast<std::size_t>(j)];
  };
  const flex::with_grad mod{
      [](auto x, index_t b, index_t h, index_t i, index_t j) {
        return (i + j) % 11 == 0 ? -std::numeric_limits<decltype(x)>::infinity() : wavy(x, b, h, i, j);
      },
      [&](auto x, index_t b, index_t h, index_t i, index_t j) {
        return hidden(i, j) ? std::numeric_limits<decltype(x)>::quiet_NaN() : wavy.grad(x, b, h, i, j);
      }};
  const flex::with_grad composed{[&](auto x, index_t b, index_t h, index_t i, index_t j) {
                                   return mod(alibi(cap(x, b, h, i, j), b, h, i, j), b, h, i, j);
                                 },
                                 [&](auto x, index_t b, index_t h, index_t i, index_t j) {
                                   return mod.grad(alibi(cap(x, b, h, i, j), b, h, i, j), b, h, i, j) *
                                          cap.grad(x, b, h, i, j);
                                 }};
  const flex::and_masks mask{flex::causal{offset}, doc};
  BackwardOptions opts;
  opts.softcap = 3.0f;
  opts.alibi_slopes = slopes;
  opts.causal = true;
  opts.softmax_scale = 0.5f;
  BackwardProblem<float> p(s, 31);
  const auto ref_o = reference::flex_attention<float>(c(p.qv), c(p.kv), c(p.vv), composed, mask, 0.5);
  const auto ref = reference::flex_attention_backward<float>(c(p.qv), c(p.kv), c(p.vv), c(p.dov), composed, mask, 0.5);
  const auto naive =
      reference::flex_attention_backward_naive<float>(c(p.qv), c(p.kv), c(p.vv), c(p.dov), composed, mask, 0.5f);
  const auto blocks = create_block_mask(doc, 1, 1, 127, 300, {16, 16});  // (block mask only: compile time)
  run_flex_forward(p, mod, blocks, opts);
  const Deviation dev = compare_to_reference(ref_o, c(p.ov), p.lse_view());
  EXPECT_EQ(dev.problem, "");
  EXPECT_LE(dev.o, forward_o_tolerance);
  EXPECT_LE(dev.lse, forward_lse_tolerance);
  run_flex_backward(p, mod, blocks, opts);
  expect_grads(p, ref, naive);
}

TEST(FlexBackwardAccuracy, Bf16UnderTheRule) {
  const auto ids = document_ids(300, 15, 80);
  check_backward<bf16>("softcap 2, document", {1, 300, 300, 2, 1, 64, 64}, 16, flex::softcap{2.0f}, flex::document{ids},
                       BlockOnly{{32, 32}});
  check_backward<bf16>("softcap 5, document", {2, 127, 17, 2, 1, 40, 40}, 17, flex::softcap{5.0f}, flex::document{ids},
                       BlockOnly{{7, 13}});
}

// ---- Varlen -----------------------------------------------------------------------------------------

TEST(FlexBackwardVarlen, ThreeSequencesOneEmpty) {
  const std::vector<std::int32_t> cu_q{0, 37, 37, 150}, cu_k{0, 50, 61, 150};
  const index_t H = 4, Hkv = 2, d = 24, total_q = 150, total_k = 150, max_q = 113, max_k = 89;
  BackwardProblem<float> p({1, total_q, total_k, H, Hkv, d, d}, 18);  // batch 1 views over the packed rows
  const auto packed = [](const auto& t) {
    using E = std::remove_reference_t<decltype(*t.data)>;
    return PackedView<E>{t.data, {t.shape[1], t.shape[2], t.shape[3]}, {t.stride[1], t.stride[2], t.stride[3]}};
  };
  const index_t md = 12;
  const auto table = normal_values(static_cast<std::size_t>(H * (2 * md + 1)), 19);
  const flex::relative_bias bias{table, md};
  const auto mask = [](index_t b, index_t h, index_t i, index_t j) {
    return j <= i + 10 + h && i - j <= 20 + 30 * b + 5 * h;
  };
  const VarlenSequences seqs{cu_q, cu_k, max_q, max_k};
  const PackedLseView lse{p.lse.data(), {H, total_q}, {total_q, 1}};
  const float scale = 1.0f / std::sqrt(24.0f);
  save_forward(p, reference::flex_attention_varlen<float>(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)), cu_q, cu_k,
                                                          bias, mask, scale));
  fill(p.dq, sentinel);
  fill(p.dk, sentinel);
  fill(p.dv, sentinel);
  backward_flex_varlen(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)), packed(c(p.ov)), lse, packed(c(p.dov)),
                       packed(p.dqv), packed(p.dkv), packed(p.dvv), seqs, bias,
                       create_block_mask(mask, 3, H, max_q, max_k, {16, 16}));  // (block mask only: compile time)
  const auto ref = reference::flex_attention_backward_varlen<float>(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)),
                                                                    packed(c(p.dov)), cu_q, cu_k, bias, mask, scale);
  for (const auto& [got, want, name] : {std::tuple{p.grad_q(), &ref.dq, "dq"}, std::tuple{p.grad_k(), &ref.dk, "dk"},
                                        std::tuple{p.grad_v(), &ref.dv, "dv"}}) {
    const GradError e = grad_error(got, *want, name);
    EXPECT_EQ(e.problem, "");
    EXPECT_GT(e.magnitude, 0.0) << name;
    EXPECT_LE(e.max_error, 2e-5 * e.magnitude) << name;
  }
  // Keys 50..60 belong to the sequence without queries: zero gradients.
  for (index_t j = 50; j < 61; ++j)
    for (index_t c = 0; c < d; ++c) ASSERT_EQ(p.dkv(0, j, 1, c), 0.0f) << "key " << j;
  // cu_seqlens_q stored in dq's memory (issue 27, N1): rejected naming dq, nothing written
  // (the same call's types: no new kernel).
  std::memcpy(p.dq.data() + 7, cu_q.data(), cu_q.size() * sizeof(std::int32_t));
  const std::vector<float> dq_before = p.dq, dk_before = p.dk;
  const VarlenSequences in_dq{{reinterpret_cast<const std::int32_t*>(p.dq.data() + 7), cu_q.size()}, cu_k, max_q, max_k};
  try {
    backward_flex_varlen(packed(c(p.qv)), packed(c(p.kv)), packed(c(p.vv)), packed(c(p.ov)), lse, packed(c(p.dov)),
                         packed(p.dqv), packed(p.dkv), packed(p.dvv), in_dq, bias,
                         create_block_mask(mask, 3, H, max_q, max_k, {16, 16}));
    ADD_FAILURE() << "backward_flex_varlen accepted cu_seqlens_q inside dq";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "dq") << e.what();
  }
  EXPECT_TRUE(p.dq == dq_before && p.dk == dk_before);
}

// ---- Same bits for every backend, thread count and budget ----------------------------------------------

TEST(FlexBackwardDeterminism, SameBitsForEveryBackendThreadCountAndBudget) {
  const ProblemShape s{2, 300, 257, 4, 2, 32, 32};
  const index_t md = 10;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * md + 1)), 20);
  const flex::relative_bias bias{table, md};
  const auto blocks = create_block_mask(flex::prefix_lm{50}, 1, 1, 300, 257, {24, 40});  // matches no tile
  ASSERT_GT(blocks.count(BlockKind::partial), 0);
  ASSERT_GT(blocks.count(BlockKind::empty), 0);
  BackwardProblem<float> p(s, 21);
  BackwardOptions opts;
  opts.execution = {Backend::serial, 1};
  save_forward(p, bias, flex::prefix_lm{50}, 1.0f / std::sqrt(32.0f));
  run_flex_backward(p, bias, blocks, opts);
  const std::vector<float> dq = p.dq, dk = p.dk, dv = p.dv;
  const int repeats = std::min(determinism_repeats(), 3);
  for (std::size_t budget : {std::size_t{0}, std::size_t{48 * 1024}})
    for (Backend b : compiled_backends())
      for (int threads : {1, 2, 3})
        for (int r = 0; r < (threads > 1 ? repeats : 1); ++r) {
          opts.execution = {b, threads};
          opts.sram_budget_bytes = budget;
          const BackwardTilePlan plan = backward_tiles({32, 32, 300, 257, 4, true}, opts);
          SCOPED_TRACE(std::string(to_string(b)) + " x " + std::to_string(threads) + ", budget " +
                       std::to_string(budget) + ", tiles " + std::to_string(plan.query_tile_rows) + " x " +
                       std::to_string(plan.key_tile_rows));
          run_flex_backward(p, bias, blocks, opts);
          EXPECT_TRUE(same_bits(p.dq, dq));
          EXPECT_TRUE(same_bits(p.dk, dk));
          EXPECT_TRUE(same_bits(p.dv, dv));
        }
  // The budgets really give other tiles.
  BackwardOptions small;
  small.sram_budget_bytes = 48 * 1024;
  EXPECT_NE(backward_tiles({32, 32, 300, 257, 4, true}, small).key_tile_rows,
            backward_tiles({32, 32, 300, 257, 4, true}, BackwardOptions{}).key_tile_rows);
}

// ---- IO ---------------------------------------------------------------------------------------------

/// backward_io_test.cpp's formula (fp32) when query tile rows [row0, row0 + n) are visited
/// for key tile [col0, col0 + cols) only where `seen` says so: O and dO read and D written
/// once; K, V read and dK, dV written once per key tile; per visited (key tile, head, query
/// tile): Q, dO, LSE, D and the dQ accumulator read, the accumulator written; then the
/// accumulator read and dQ written once.
template <class Seen>
IoCounts expected_backward_io(const ProblemShape& s, const BackwardTilePlan& plan, Seen&& seen) {
  const auto u = [](index_t x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t f = 4, bh = u(s.batch * s.heads), bhkv = u(s.batch * s.heads_kv);
  const index_t br = plan.query_tile_rows, bc = plan.key_tile_rows;
  IoCounts io;
  io.bytes_read += bh * u(s.seqlen_q * s.head_dim_v) * 2 * f;
  io.bytes_written += bh * u(s.seqlen_q) * 4;
  io.bytes_read += bhkv * u(s.seqlen_k * (s.head_dim + s.head_dim_v)) * f;
  io.bytes_written += bhkv * u(s.seqlen_k * (s.head_dim + s.head_dim_v)) * f;
  for (index_t col0 = 0; col0 < s.seqlen_k; col0 += bc) {
    const index_t cols = std::min(bc, s.seqlen_k - col0);
    index_t rows = 0;
    for (index_t r0 = 0; r0 < s.seqlen_q; r0 += br) {
      const index_t n = std::min(br, s.seqlen_q - r0);
      if (seen(r0, n, col0, cols)) rows += n;
    }
    io.bytes_read += bh * u(rows) * (u(s.head_dim + s.head_dim_v) * f + 8 + u(s.head_dim) * 4);
    io.bytes_written += bh * u(rows) * u(s.head_dim) * 4;
  }
  io.bytes_read += bh * u(s.seqlen_q * s.head_dim) * 4;
  io.bytes_written += bh * u(s.seqlen_q * s.head_dim) * f;
  return io;
}

TEST(FlexBackwardIo, HiddenQueryTilesLoadNothing) {
  const ProblemShape s{1, 300, 257, 2, 1, 32, 32};
  BackwardProblem<float> p(s, 22);
  for (std::size_t budget : {std::size_t{0}, std::size_t{48 * 1024}}) {
    BackwardOptions opts;
    opts.execution = {Backend::serial, 1};
    opts.sram_budget_bytes = budget;
    const BackwardTilePlan plan = backward_tiles({32, 32, 300, 257, 1}, opts);
    const index_t br = plan.query_tile_rows, bc = plan.key_tile_rows;
    SCOPED_TRACE("tiles " + std::to_string(br) + " x " + std::to_string(bc));
    // Blocks of the plan's tiles: every odd query block's, and a third of the others', empty
    // but for the first column (so that every row sees a key).
    auto blocks = create_block_mask(flex::no_mask{}, 1, 1, 300, 257, {br, bc});
    ASSERT_GE(blocks.q_blocks(), 2);
    ASSERT_GE(blocks.kv_blocks(), 2);
    std::mt19937_64 rng(23);
    for (index_t qb = 0; qb < blocks.q_blocks(); ++qb)
      for (index_t kb = 1; kb < blocks.kv_blocks(); ++kb)
        if (qb % 2 == 1 || rng() % 3 == 0) blocks.set_kind(0, 0, qb, kb, BlockKind::empty);
    const auto dense = create_block_mask(flex::no_mask{}, 1, 1, 300, 257, {br, bc});
    const float scale = 1.0f / std::sqrt(32.0f);
    save_forward(p, flex::no_score_mod{}, flex::no_mask{}, scale);
    IoCounts all;
    opts.io_counts = &all;
    run_flex_backward(p, flex::no_score_mod{}, dense, opts);
    EXPECT_EQ(all, expected_backward_io(s, plan, [](auto...) { return true; }));
    // The blocks hide what the mask the reference runs hides.
    const auto as_edited = [&](index_t, index_t, index_t i, index_t j) {
      return blocks.kind(0, 0, i / br, j / bc) != BlockKind::empty;
    };
    save_forward(p, flex::no_score_mod{}, as_edited, scale);
    IoCounts sparse;
    opts.io_counts = &sparse;
    run_flex_backward(p, flex::no_score_mod{}, blocks, opts);
    const auto seen = [&](index_t r0, index_t, index_t col0, index_t) {
      return blocks.kind(0, 0, r0 / br, col0 / bc) != BlockKind::empty;
    };
    EXPECT_EQ(sparse, expected_backward_io(s, plan, seen));
    EXPECT_LT(sparse.bytes_read, all.bytes_read);
    // And the gradients are those of that mask (at one budget: the reference is the cost here).
    if (budget == 0) continue;
    const auto ref = reference::flex_attention_backward<float>(c(p.qv), c(p.kv), c(p.vv), c(p.dov),
                                                               flex::no_score_mod{}, as_edited, scale);
    const auto naive = reference::flex_attention_backward_naive<float>(c(p.qv), c(p.kv), c(p.vv), c(p.dov),
                                                                       flex::no_score_mod{}, as_edited, scale);
    expect_grads(p, ref, naive);
  }
}

// ---- Errors and non-finite values ------------------------------------------------------------------

template <class F>
void expect_invalid(F&& f, const std::string& parameter) {
  try {
    f();
    ADD_FAILURE() << "no invalid_argument (expected one naming " << parameter << ")";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
  }
}

TEST(FlexBackwardErrors, DbiasWithAScoreModAndBlockMasksOfAnotherShapeWriteNothing) {
  const ProblemShape s{2, 17, 127, 4, 2, 16, 16};
  BackwardProblem<float> p(s, 24);
  const index_t md = 4;
  const auto table = normal_values(static_cast<std::size_t>(4 * (2 * md + 1)), 25);
  const flex::relative_bias bias{table, md};
  save_forward(p, bias, flex::prefix_lm{50}, 0.25f);
  fill(p.dq, sentinel);
  fill(p.dk, sentinel);
  fill(p.dv, sentinel);
  std::vector<float> b(static_cast<std::size_t>(17 * 127), 0.5f), db(b.size(), sentinel);
  BackwardOptions opts;
  opts.bias = {b.data(), {1, 1, 17, 127}, {0, 0, 127, 1}};
  opts.dbias = {db.data(), {1, 1, 17, 127}, {0, 0, 127, 1}};
  const auto call = [&](const auto& mask, const BackwardOptions& o) {
    return [&, o] {
      backward_flex(c(p.qv), c(p.kv), c(p.vv), c(p.ov), p.lse_view(), c(p.dov), p.dqv, p.dkv, p.dvv, bias, mask, o);
    };
  };
  expect_invalid(call(flex::prefix_lm{50}, opts), "dbias");
  EXPECT_TRUE(all_equal(db, sentinel));
  const flex::prefix_lm m{50};
  expect_invalid(call(create_block_mask(m, 1, 1, 17, 126), {}), "block_mask");
  expect_invalid(call(create_block_mask(m, 1, 1, 16, 127), {}), "block_mask");
  expect_invalid(call(create_block_mask(m, 1, 3, 17, 127), {}), "block_mask");
  expect_invalid(call(create_block_mask(m, 4, 1, 17, 127), {}), "block_mask");
  EXPECT_TRUE(all_equal(p.dq, sentinel) && all_equal(p.dk, sentinel) && all_equal(p.dv, sentinel))
      << "a rejected call wrote a gradient";
  run_flex_backward(p, bias, create_block_mask(m, 2, 4, 17, 127));  // the right shape passes
  EXPECT_FALSE(all_equal(p.dq, sentinel));
}

TEST(FlexBackwardNonFinite, ANanInQReachesWhatItsRowSeesAndRowsThatSeeNothingGetZero) {
  const ProblemShape s{1, 127, 127, 4, 2, 16, 16};
  const auto ids = document_ids(127, 26, 30);
  const flex::document mask{ids};
  BackwardProblem<float> p(s, 27);
  p.qv(0, 60, 1, 3) = nan_value;
  const auto ref =
      reference::flex_attention_backward<float>(c(p.qv), c(p.kv), c(p.vv), c(p.dov), flex::no_score_mod{}, mask, 0.25);
  for (int blocked = 0; blocked < 2; ++blocked) {
    SCOPED_TRACE(blocked ? "block mask" : "bare mask_mod");
    const auto blocks = create_block_mask(mask, 1, 1, 127, 127, {16, 16});
    save_forward(p, flex::no_score_mod{}, mask, 0.25f);  // row 60 of head 1: O and LSE NaN
    if (blocked)
      run_flex_backward(p, flex::no_score_mod{}, blocks);
    else
      run_flex_backward(p, flex::no_score_mod{}, mask);
    for (const auto& [got, want, name] : {std::tuple{p.grad_q(), &ref.dq, "dq"}, std::tuple{p.grad_k(), &ref.dk, "dk"},
                                          std::tuple{p.grad_v(), &ref.dv, "dv"}}) {
      const GradError e = grad_error(got, *want, name);
      EXPECT_EQ(e.problem, "") << "the NaN pattern differs from the reference's";
      EXPECT_LE(e.max_error, 2e-5 * e.magnitude) << name;
    }
    const auto nans = [](const std::vector<float>& x) {
      return std::count_if(x.begin(), x.end(), [](float f) { return std::isnan(f); });
    };
    EXPECT_EQ(nans(p.grad_q()), 16) << "only row 60 of head 1";
    EXPECT_GT(nans(p.grad_k()), 0);
  }
  // Rows that the mask_mod hides from every key: zero dq, and no key gets anything from them.
  // (A document mask whose query 5 is in a document of no key: no new kernel to compile.)
  std::vector<std::int32_t> q_ids = ids;
  q_ids[5] = -1;
  const flex::document hide_row_5{q_ids, ids};
  BackwardProblem<float> r(s, 28);
  save_forward(r, flex::no_score_mod{}, hide_row_5, 0.25f);  // row 5: O = 0, LSE = -inf
  run_flex_backward(r, flex::no_score_mod{}, create_block_mask(hide_row_5, 1, 1, 127, 127, {16, 16}));
  for (index_t h = 0; h < 4; ++h)
    for (index_t c = 0; c < 16; ++c) EXPECT_EQ(r.dqv(0, 5, h, c), 0.0f);
  const auto want = reference::flex_attention_backward<float>(c(r.qv), c(r.kv), c(r.vv), c(r.dov), flex::no_score_mod{},
                                                              hide_row_5, 0.25);
  const GradError e = grad_error(r.grad_k(), want.dk, "dk");
  EXPECT_EQ(e.problem, "");
  EXPECT_LE(e.max_error, 2e-5 * e.magnitude);
}

}  // namespace
}  // namespace tileattn::test
