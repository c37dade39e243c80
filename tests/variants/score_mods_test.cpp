// tests/variants/score_mods_test.cpp: the score modifiers of ops/score_mods.hpp through the
// public forward(): softcap (with large scores), ALiBi (per head and per batch x head),
// attention sinks (dominating, -inf, on rows without keys), additive bias and boolean
// mask (every broadcast, strided and stride-0 layouts, whole rows masked), in
// FlashAttention's order softcap -> masks -> bias / ALiBi, against the reference.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr Shape base_shape{2, 4, 2, 53, 97, 64};

ForwardOptions small_tiles(index_t head_dim) {
  ForwardOptions opts;
  opts.sram_budget_bytes = rows_budget(16, head_dim);
  return opts;
}

// ---- Softcap ---------------------------------------------------------------------------------

struct SoftcapCase {
  float softcap;
  float input_scale;  // Q is multiplied by this: 10 makes scores ~10x larger than N(0, 1) inputs
  bool causal;
  index_t head_dim;
};

class SoftcapVsReference : public ::testing::TestWithParam<SoftcapCase> {};

TEST_P(SoftcapVsReference, MatchesWithinBoundAndStaysInsideTheCap) {
  const SoftcapCase& c = GetParam();
  Shape s = base_shape;
  s.head_dim = c.head_dim;
  Problem p(s, KvStorage::window, 41);
  for (float& x : p.q().buffer()) x *= c.input_scale;
  ForwardOptions opts = small_tiles(c.head_dim);
  opts.softcap = c.softcap;
  opts.causal = c.causal;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  // Every capped score lies in (-C, C), so a row that sees n keys has LSE in
  // [ln n - C, ln n + C]: checked on the last query row, which sees all Nk keys.
  const float ln_n = std::log(static_cast<float>(s.seqlen_k));
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.heads_q; ++h) {
      const float lse = p.lse().view()(b, h, s.seqlen_q - 1);
      EXPECT_LE(lse, ln_n + c.softcap + 1e-4f);
      EXPECT_GE(lse, ln_n - c.softcap - 1e-4f);
    }
}

INSTANTIATE_TEST_SUITE_P(Caps, SoftcapVsReference,
                         ::testing::Values(SoftcapCase{30.0f, 1.0f, false, 64},
                                           SoftcapCase{30.0f, 10.0f, true, 128},
                                           SoftcapCase{5.0f, 10.0f, false, 32},
                                           SoftcapCase{1.0f, 10.0f, true, 96},
                                           SoftcapCase{0.5f, 1.0f, false, 256}),
                         [](const auto& info) {
                           const SoftcapCase& c = info.param;
                           return "cap" + std::to_string(static_cast<int>(c.softcap * 10)) + "_x" +
                                  std::to_string(static_cast<int>(c.input_scale)) +
                                  (c.causal ? "_causal" : "_full") + "_d" + std::to_string(c.head_dim);
                         });

// ---- ALiBi -------------------------------------------------------------------------------------

/// The ALiBi paper's slopes for n heads: 2^(-8 (h + 1) / n).
std::vector<float> geometric_slopes(index_t heads) {
  std::vector<float> out(static_cast<std::size_t>(heads));
  for (index_t h = 0; h < heads; ++h)
    out[static_cast<std::size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads));
  return out;
}

struct AlibiCase {
  bool per_batch, causal;
  index_t left, right;
  MaskAlignment alignment;
  index_t seqlen_q, seqlen_k;
};

class AlibiVsReference : public ::testing::TestWithParam<AlibiCase> {};

TEST_P(AlibiVsReference, MatchesWithinBound) {
  const AlibiCase& c = GetParam();
  Shape s = base_shape;
  s.batch = 3;
  s.seqlen_q = c.seqlen_q;
  s.seqlen_k = c.seqlen_k;
  Problem p(s, KvStorage::interleaved, 43);
  // Per batch: random slopes, some 0 and one negative (the bias then grows with distance).
  std::vector<float> slopes = c.per_batch ? uniform_values(static_cast<std::size_t>(s.batch * s.heads_q), 0.0f, 1.0f, 5)
                                          : geometric_slopes(s.heads_q);
  if (c.per_batch) {
    slopes[1] = 0.0f;
    slopes[6] = -0.05f;
  }
  ForwardOptions opts = small_tiles(s.head_dim);
  opts.alibi_slopes = slopes;
  opts.causal = c.causal;
  opts.window_left = c.left;
  opts.window_right = c.right;
  opts.alignment = c.alignment;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
}

INSTANTIATE_TEST_SUITE_P(
    Slopes, AlibiVsReference,
    ::testing::Values(AlibiCase{false, false, -1, -1, MaskAlignment::bottom_right, 53, 97},
                      AlibiCase{false, true, -1, -1, MaskAlignment::bottom_right, 97, 53},
                      AlibiCase{true, false, -1, -1, MaskAlignment::top_left, 53, 97},
                      AlibiCase{true, true, -1, -1, MaskAlignment::top_left, 97, 53},
                      AlibiCase{true, true, 20, -1, MaskAlignment::bottom_right, 53, 97},
                      AlibiCase{false, false, 10, 10, MaskAlignment::top_left, 60, 60}),
    [](const auto& info) {
      const AlibiCase& c = info.param;
      return std::string(c.per_batch ? "per_batch" : "per_head") + (c.causal ? "_causal" : "") +
             (c.left >= 0 ? "_window" : "") +
             (c.alignment == MaskAlignment::top_left ? "_topleft_" : "_bottomright_") +
             std::to_string(c.seqlen_q) + "x" + std::to_string(c.seqlen_k);
    });

// batch x heads slopes that repeat the per-head slopes give the per-head result bitwise.
TEST(Alibi, PerBatchSlopesThatRepeatEqualPerHeadSlopes) {
  Problem p(base_shape, KvStorage::window, 44);
  const std::vector<float> per_head = geometric_slopes(base_shape.heads_q);
  std::vector<float> repeated;
  for (index_t b = 0; b < base_shape.batch; ++b) repeated.insert(repeated.end(), per_head.begin(), per_head.end());
  ForwardOptions opts = small_tiles(base_shape.head_dim);
  opts.causal = true;
  opts.alibi_slopes = per_head;
  p.run(opts);
  const std::vector<float> want = p.outputs();
  opts.alibi_slopes = repeated;
  p.reset_outputs();
  p.run(opts);
  EXPECT_TRUE(bitwise_equal(p.outputs(), want));
}

// ---- Sinks -------------------------------------------------------------------------------------

TEST(Sinks, RandomSinksMatchReference) {
  Problem p(base_shape, KvStorage::window, 45);
  const std::vector<float> sinks = uniform_values(static_cast<std::size_t>(base_shape.heads_q), -2.0f, 4.0f, 7);
  ForwardOptions opts = small_tiles(base_shape.head_dim);
  opts.sinks = sinks;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  opts.causal = true;
  opts.softcap = 3.0f;
  p.reset_outputs();
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
}

// A sink far above every score takes almost all the probability mass: O shrinks towards 0
// (by e^(scores - sink)) and LSE ~ sink.
TEST(Sinks, DominatingSink) {
  Problem p(base_shape, KvStorage::contiguous, 46);
  const std::vector<float> sinks{40.0f, 0.5f, 25.0f, -1.0f};
  ForwardOptions opts = small_tiles(base_shape.head_dim);
  opts.sinks = sinks;
  opts.causal = true;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  for (index_t i = 0; i < base_shape.seqlen_q; ++i) {
    EXPECT_NEAR(p.lse().view()(1, 0, i), 40.0f, 1e-4f);
    EXPECT_LT(std::abs(p.o().cview()(1, i, 0, 3)), 1e-8f);
  }
}

// A -inf sink adds exp(-inf) = 0 to the denominator: the same result as no sink, bitwise.
TEST(Sinks, MinusInfinitySinkEqualsNoSink) {
  Problem p(base_shape, KvStorage::window, 47);
  ForwardOptions opts = small_tiles(base_shape.head_dim);
  opts.causal = true;
  opts.window_left = 30;
  p.run(opts);
  const std::vector<float> want = p.outputs();
  const std::vector<float> sinks(static_cast<std::size_t>(base_shape.heads_q), -inf);
  opts.sinks = sinks;
  p.reset_outputs();
  p.run(opts);
  EXPECT_TRUE(bitwise_equal(p.outputs(), want));
}

// Rows that see no key, with sinks. A finite sink is then the only term of the denominator:
// O = 0 and LSE = sink. A -inf sink leaves the row empty: O = 0 and LSE = -inf, never NaN
// (a NaN here comes from 2^(max - new_max) with both maxima -inf when the sink is folded in).
void expect_rows_without_keys(const std::vector<float>& sinks) {
  const Shape s{1, 4, 2, 40, 25, 32};  // causal, bottom-right: the first 15 rows see no key
  Problem p(s, KvStorage::window, 48);
  ForwardOptions opts = small_tiles(s.head_dim);
  opts.causal = true;
  opts.sinks = sinks;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  index_t wrong_o = 0, wrong_lse = 0;
  for (index_t h = 0; h < s.heads_q; ++h)
    for (index_t i = 0; i < 15; ++i) {
      for (index_t c = 0; c < s.head_dim; ++c) wrong_o += p.o().cview()(0, i, h, c) != 0.0f;
      const float lse = p.lse().view()(0, h, i), sink = sinks[static_cast<std::size_t>(h)];
      wrong_lse += std::isinf(sink) ? lse != -inf : !(std::abs(lse - sink) <= 1e-6f);
    }
  EXPECT_EQ(wrong_o, 0) << "O elements of rows without keys that are not 0";
  EXPECT_EQ(wrong_lse, 0) << "LSE of rows without keys that is not the sink (-inf for a -inf sink)";
}

TEST(Sinks, RowsWithoutKeysAndFiniteSinks) { expect_rows_without_keys({1.5f, -3.0f, 0.0f, 20.0f}); }

TEST(Sinks, RowsWithoutKeysAndMinusInfinitySinks) { expect_rows_without_keys({1.5f, -inf, 0.0f, -inf}); }

// ---- Bias and mask -----------------------------------------------------------------------------

struct ScoreCase {
  bool bias, mask;
  index_t batch_extent, head_extent;  // 1 broadcasts
  ScoreLayout layout;
};

std::string case_name(const ScoreCase& c) {
  const char* layouts[] = {"contiguous", "transposed", "expanded"};
  std::ostringstream o;
  o << (c.bias ? "bias" : "") << (c.bias && c.mask ? "_" : "") << (c.mask ? "mask" : "") << "_"
    << c.batch_extent << "x" << c.head_extent << "_" << layouts[static_cast<int>(c.layout)];
  return o.str();
}

std::vector<ScoreCase> score_cases() {
  std::vector<ScoreCase> out;
  int n = 0;
  for (auto [bias, mask] : {std::pair{true, false}, {false, true}, {true, true}})
    for (auto [be, he] : {std::pair<index_t, index_t>{2, 4}, {1, 4}, {2, 1}, {1, 1}})
      out.push_back({bias, mask, be, he, n++ % 2 ? ScoreLayout::transposed : ScoreLayout::contiguous});
  out.push_back({true, true, 2, 4, ScoreLayout::expanded});
  return out;
}

class BiasMaskVsReference : public ::testing::TestWithParam<ScoreCase> {};

TEST_P(BiasMaskVsReference, MatchesWithinBound) {
  const ScoreCase& c = GetParam();
  const Shape s = base_shape;
  Problem p(s, KvStorage::window, 49);
  const std::array<index_t, 4> shape{c.batch_extent, c.head_extent, s.seqlen_q, s.seqlen_k};
  const auto bias = random_bias(shape, c.layout, 50, 2.0f);
  auto mask = random_mask(shape, c.layout, 51, 0.6);
  // One whole row false: query 7 (of head 0 of batch 0, or of every broadcast batch / head).
  for (index_t j = 0; j < s.seqlen_k; ++j) mask.mutable_view()(0, 0, 7, j) = false;
  ForwardOptions opts = small_tiles(s.head_dim);
  if (c.bias) opts.bias = bias.view();
  if (c.mask) opts.mask = mask.view();
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  if (c.mask) {
    const index_t want = (c.batch_extent == 1 ? s.batch : 1) * (c.head_extent == 1 ? s.heads_q : 1);
    EXPECT_GE(rows_without_keys(p.reference(opts)), want);
    EXPECT_EQ(p.lse().view()(0, 0, 7), -inf);
    EXPECT_EQ(p.o().cview()(0, 7, 0, 0), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Broadcasts, BiasMaskVsReference, ::testing::ValuesIn(score_cases()),
                         [](const auto& info) { return case_name(info.param); });

// Masks and biases combine with everything else, in FlashAttention's order: softcap caps the
// raw scores only (a large bias after the cap is not capped), masks win over biases.
TEST(BiasMask, OrderSoftcapThenMasksThenBiases) {
  Shape s = base_shape;
  s.seqlen_q = 97;
  s.seqlen_k = 53;
  Problem p(s, KvStorage::interleaved, 52);
  const auto bias = random_bias({s.batch, 1, s.seqlen_q, s.seqlen_k}, ScoreLayout::transposed, 53, 10.0f);
  const auto mask = random_mask({1, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous, 54, 0.8);
  const std::vector<float> slopes = uniform_values(static_cast<std::size_t>(s.heads_q), 0.0f, 0.3f, 55);
  const std::vector<float> sinks = uniform_values(static_cast<std::size_t>(s.heads_q), -1.0f, 1.0f, 56);
  ForwardOptions opts = small_tiles(s.head_dim);
  opts.softcap = 2.0f;
  opts.bias = bias.view();
  opts.mask = mask.view();
  opts.alibi_slopes = slopes;
  opts.sinks = sinks;
  opts.causal = true;
  opts.window_left = 25;
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
}

// A [B, H, Nq, Nk] view with batch and head strides 0 is the same bias as a [1, 1, Nq, Nk]
// broadcast one: bitwise identical outputs. Likewise for masks.
TEST(BiasMask, ExpandedStrideZeroEqualsBroadcast) {
  const Shape s = base_shape;
  Problem p(s, KvStorage::window, 57);
  const auto bias = random_bias({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::expanded, 58);
  const auto mask = random_mask({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::expanded, 59);
  ForwardOptions opts = small_tiles(s.head_dim);
  opts.bias = bias.view();
  opts.mask = mask.view();
  p.run(opts);
  const std::vector<float> want = p.outputs();
  auto shrink = [](auto v) {
    v.shape[0] = v.shape[1] = 1;
    return v;
  };
  opts.bias = shrink(bias.view());
  opts.mask = shrink(mask.view());
  p.reset_outputs();
  p.run(opts);
  EXPECT_TRUE(bitwise_equal(p.outputs(), want));
}

// An all-true mask changes nothing; a -inf bias entry masks like a false mask entry (as
// PyTorch SDPA's float attn_mask), a whole -inf row included.
TEST(BiasMask, AllTrueMaskAndMinusInfinityBias) {
  const Shape s = base_shape;
  Problem p(s, KvStorage::window, 60);
  ForwardOptions opts = small_tiles(s.head_dim);
  opts.causal = true;
  p.run(opts);
  const std::vector<float> plain = p.outputs();
  const ScoreBuffer<bool> all_true({1, 1, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous,
                                   [](index_t, index_t, index_t, index_t) { return true; });
  opts.mask = all_true.view();
  p.reset_outputs();
  p.run(opts);
  EXPECT_TRUE(bitwise_equal(p.outputs(), plain));

  auto mask = random_mask({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous, 61);
  for (index_t j = 0; j < s.seqlen_k; ++j) mask.mutable_view()(1, 3, 50, j) = false;
  const auto finite = random_bias({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous, 62);
  ScoreBuffer<float> with_inf({s.batch, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous,
                              [&](index_t b, index_t h, index_t i, index_t j) {
                                return mask.view()(b, h, i, j) ? finite.view()(b, h, i, j) : -inf;
                              });
  opts.mask = mask.view();
  opts.bias = finite.view();
  p.reset_outputs();
  p.run(opts);
  const std::vector<float> masked = p.outputs();
  opts.mask = {};
  opts.bias = with_inf.view();
  p.reset_outputs();
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  EXPECT_TRUE(bitwise_equal(p.outputs(), masked));
  EXPECT_EQ(p.lse().view()(1, 3, 50), -inf);
}

}  // namespace
}  // namespace tileattn::test

namespace tileattn::test {
namespace {

// ---- Extreme but valid option values (every accepted value gives the reference's answer) ----

/// Runs p with opts and checks O against the reference (absolute bound) and the LSE with a
/// bound relative to its size (an LSE of 1e38 is only known to float's 7 digits).
void expect_reference_answer(Problem& p, const ForwardOptions& opts, const std::string& what) {
  p.reset_outputs();
  p.run(opts);
  const auto ref = p.reference(opts);
  const Deviation dev = compare_to_reference(ref, p.o().cview(), LseView{});
  EXPECT_EQ(dev.problem, "") << what;
  EXPECT_LE(dev.o, forward_o_tolerance) << what;
  const LseView lse = p.lse().view();
  for (index_t b = 0; b < ref.batch; ++b)
    for (index_t h = 0; h < ref.heads; ++h)
      for (index_t i = 0; i < ref.seqlen_q; ++i) {
        const double want = ref.log_sum_exp(b, h, i), got = lse(b, h, i);
        ASSERT_NEAR(got, want, forward_lse_tolerance + 1e-6 * std::abs(want)) << what << " at " << b << " " << h << " " << i;
      }
}

// The review's values: a subnormal softcap (1 / softcap overflowed; 0 * inf gave NaN), and
// the largest accepted one; both at Nq = Nk = 16, d = 64. Above max_natural_log_magnitude
// (about 2.35e38: softcap * log2(e) is no longer a float, and a score at the cap could not
// be represented) softcap is rejected by name (kernels/forward_validation_test.cpp).
TEST(ExtremeOptions, SoftcapFromSubnormalToTheLimit) {
  Problem p({1, 2, 2, 16, 16, 64}, KvStorage::contiguous, 3);
  for (float cap : {max_natural_log_magnitude, 2e38f, 1e30f, 1e-30f, 1e-40f,
                    std::numeric_limits<float>::denorm_min()}) {
    ForwardOptions opts;
    opts.softcap = cap;
    expect_reference_answer(p, opts, "softcap " + std::to_string(cap));
    if (cap < 1e-20f) {  // every score capped to ~0: a uniform average, LSE = ln 16
      EXPECT_NEAR(p.lse().view()(0, 1, 3), std::log(16.0), 1e-5) << cap;
    }
  }
}

// softmax_scale from the smallest subnormal up to 1e30 (where scores stay below float's
// range in log2 units): the reference's answer. Above 2.35e38 it is rejected by name
// (kernels/forward_validation_test.cpp).
TEST(ExtremeOptions, SoftmaxScaleFromSubnormalToLarge) {
  Problem p({1, 2, 1, 16, 24, 32}, KvStorage::window, 5);
  for (float scale : {std::numeric_limits<float>::denorm_min(), 1e-40f, 1e-20f, 1e10f, 1e30f}) {
    for (bool causal : {false, true}) {
      ForwardOptions opts;
      opts.softmax_scale = scale;
      opts.causal = causal;
      expect_reference_answer(p, opts, "scale " + std::to_string(scale));
    }
  }
}

// Sinks as large as the limit allows (|sink| * log2(e) finite) dominate or vanish exactly
// as the reference says.
TEST(ExtremeOptions, SinksNearTheLimit) {
  Problem p({1, 2, 2, 16, 16, 64}, KvStorage::contiguous, 7);
  const float big = 0.99f * max_natural_log_magnitude;
  const std::vector<float> sinks{big, -big};
  ForwardOptions opts;
  opts.sinks = sinks;
  opts.causal = true;
  expect_reference_answer(p, opts, "sinks +-" + std::to_string(big));
  EXPECT_NEAR(p.lse().view()(0, 0, 5), big, 1e-6 * big);
}

// ALiBi slopes up to the limit (|slope| * (Nq + Nk) below max_natural_log_magnitude / 4):
// a huge slope leaves only the nearest visible key, as in the reference.
TEST(ExtremeOptions, AlibiSlopesNearTheLimit) {
  Problem p({1, 3, 1, 16, 16, 32}, KvStorage::contiguous, 9);
  const float limit = max_natural_log_magnitude / 4 / 32;
  const std::vector<float> slopes{0.99f * limit, 1e-30f, 1e20f};
  for (bool causal : {false, true}) {
    ForwardOptions opts;
    opts.alibi_slopes = slopes;
    opts.causal = causal;
    expect_reference_answer(p, opts, causal ? "causal" : "full");
  }
}

}  // namespace
}  // namespace tileattn::test
