// tests/kernels/backward_test.cpp: tileattn::backward against the analytic gradients of the
// double-precision reference (tests/reference/naive_backward.hpp) on odd sizes, every option
// alone and combined, GQA ratios, strided layouts and the three storage types, under
// FlashAttention's rule: max error <= 3 x a naive same-precision backward's + 2e-4, both
// relative to the gradient's magnitude (fp32 also under a tighter bound, 2e-5, that the
// kernel meets with a margin, to catch small algorithmic slips; 16-bit types never below
// one rounding of the gradient).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

/// Option storage a case points its options at (spans and views must outlive the calls).
struct Extras {
  std::vector<float> alibi, sinks, bias, dbias, dsinks;
  std::vector<char> mask;  // bool-sized
};

struct Case {
  std::string name;
  BackwardShape shape;
  std::function<void(BackwardOptions&, Extras&, const BackwardShape&)> setup;
};

void none(BackwardOptions&, Extras&, const BackwardShape&) {}

std::vector<float> normal_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

/// A bias of shape [bb, hb, Nq, Nk] and its gradient buffer.
void add_bias(BackwardOptions& o, Extras& x, const BackwardShape& s, index_t bb, index_t hb) {
  const index_t n = bb * hb * s.seqlen_q * s.seqlen_k;
  x.bias = normal_values(static_cast<std::size_t>(n), 91, 0.5f);
  x.dbias.assign(static_cast<std::size_t>(n), sentinel);
  const std::array<index_t, 4> shape{bb, hb, s.seqlen_q, s.seqlen_k};
  const std::array<index_t, 4> stride{hb * s.seqlen_q * s.seqlen_k, s.seqlen_q * s.seqlen_k, s.seqlen_k, 1};
  o.bias = {x.bias.data(), shape, stride};
  o.dbias = {x.dbias.data(), shape, stride};
}

void add_sinks(BackwardOptions& o, Extras& x, const BackwardShape& s) {
  x.sinks = normal_values(static_cast<std::size_t>(s.heads), 92);
  x.dsinks.assign(static_cast<std::size_t>(s.heads), sentinel);
  o.sinks = x.sinks;
  o.dsinks = x.dsinks;
}

void add_alibi(BackwardOptions& o, Extras& x, const BackwardShape& s, bool per_batch) {
  const index_t n = (per_batch ? s.batch : 1) * s.heads;
  for (index_t i = 0; i < n; ++i) x.alibi.push_back(0.05f + 0.03f * static_cast<float>(i % 7));
  o.alibi_slopes = x.alibi;
}

/// A random mask with about 20% masked, and query row 0 fully masked.
void add_mask(BackwardOptions& o, Extras& x, const BackwardShape& s) {
  const index_t n = s.batch * s.heads * s.seqlen_q * s.seqlen_k;
  std::mt19937 rng(93);
  x.mask.resize(static_cast<std::size_t>(n));
  for (index_t e = 0; e < n; ++e) x.mask[static_cast<std::size_t>(e)] = (e % (s.seqlen_q * s.seqlen_k)) >= s.seqlen_k && rng() % 5 != 0;
  o.mask = {reinterpret_cast<const bool*>(x.mask.data()),
            {s.batch, s.heads, s.seqlen_q, s.seqlen_k},
            {s.heads * s.seqlen_q * s.seqlen_k, s.seqlen_q * s.seqlen_k, s.seqlen_k, 1}};
}

/// Half the distance between 1 and the next value of T.
template <class T>
double unit_roundoff() {
  return std::is_same_v<T, bf16> ? 1.0 / 256 : std::is_same_v<T, fp16> ? 1.0 / 2048 : 0x1p-24;
}

template <class T>
void check_case(const Case& c, Layout layout, std::uint64_t seed) {
  SCOPED_TRACE(c.name + " in " + std::string(type_name<T>()) + ", " + to_string(layout));
  BackwardProblem<T> p(c.shape, seed, layout);
  BackwardOptions opts;
  Extras extras;
  c.setup(opts, extras, c.shape);
  p.forward(opts);
  p.backward(opts);
  const reference::Options ref_opts = reference::Options::from(opts);
  const reference::BackwardResult ref = p.reference(ref_opts);
  const reference::NaiveBackwardF naive = p.naive(ref_opts);
  const auto check = [&](const std::vector<float>& got, const auto& want, const std::vector<float>& naive_got,
                         const std::string& name) {
    const GradError e = grad_error(got, want, name);
    const GradError n = grad_error(naive_got, want, name + " (naive)");
    EXPECT_EQ(e.problem, "");
    // A naive error below one rounding to T (a tiny gradient such as a one-row dsinks can
    // round luckily) is taken as one rounding: no implementation that stores O in T does better.
    const double rounding = std::is_same_v<T, float> ? 0.0 : unit_roundoff<T>() * e.magnitude;
    const double bound = 3.0 * std::max(n.max_error, rounding) + 2e-4 * e.magnitude;
    EXPECT_LE(e.max_error, bound) << name << ": naive " << n.max_error << ", magnitude " << e.magnitude;
    if constexpr (std::is_same_v<T, float>)
      EXPECT_LE(e.max_error, 2e-5 * std::max(e.magnitude, 1e-3)) << name << ", magnitude " << e.magnitude;
    EXPECT_GT(e.magnitude, 0.0) << name << " is all zeros: the check cannot fail";
  };
  check(p.grad_q(), ref.dq, naive.dq, "dq");
  check(p.grad_k(), ref.dk, naive.dk, "dk");
  check(p.grad_v(), ref.dv, naive.dv, "dv");
  if (!extras.dsinks.empty()) check(extras.dsinks, ref.dsinks, naive.dsinks, "dsinks");
  if (!extras.dbias.empty()) check(extras.dbias, ref.dbias, naive.dbias, "dbias");
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"plain 113x203", {1, 113, 203, 2, 2, 64, 64}, none},
      {"plain 203x113", {2, 203, 113, 2, 1, 40, 24}, none},
      {"one by one with a sink", {1, 1, 1, 1, 1, 8, 8}, [](auto& o, auto& x, auto& s) { add_sinks(o, x, s); }},
      {"one query", {1, 1, 17, 2, 1, 8, 8}, none},
      {"scale", {1, 67, 91, 2, 2, 32, 32}, [](auto& o, auto&, auto&) { o.softmax_scale = 0.31f; }},
      {"causal bottom-right", {1, 150, 200, 2, 2, 32, 32}, [](auto& o, auto&, auto&) { o.causal = true; }},
      {"causal bottom-right, more queries", {1, 200, 130, 2, 1, 32, 32}, [](auto& o, auto&, auto&) { o.causal = true; }},
      {"causal top-left", {1, 200, 130, 2, 2, 32, 32},
       [](auto& o, auto&, auto&) { o.causal = true; o.alignment = MaskAlignment::top_left; }},
      {"window", {1, 177, 177, 2, 2, 32, 32}, [](auto& o, auto&, auto&) { o.window_left = 17; o.window_right = 5; }},
      {"window left only", {1, 177, 300, 2, 2, 32, 32}, [](auto& o, auto&, auto&) { o.window_left = 40; }},
      {"softcap", {1, 97, 131, 2, 2, 32, 32}, [](auto& o, auto&, auto&) { o.softcap = 2.5f; o.softmax_scale = 0.7f; }},
      {"alibi per head", {1, 97, 131, 4, 2, 32, 32}, [](auto& o, auto& x, auto& s) { add_alibi(o, x, s, false); }},
      {"alibi per sequence", {2, 57, 61, 2, 2, 16, 16}, [](auto& o, auto& x, auto& s) { add_alibi(o, x, s, true); }},
      {"sinks", {2, 97, 131, 3, 1, 32, 32}, [](auto& o, auto& x, auto& s) { add_sinks(o, x, s); }},
      {"bias", {2, 77, 99, 2, 2, 32, 32}, [](auto& o, auto& x, auto& s) { add_bias(o, x, s, 2, 2); }},
      {"bias broadcast over batch", {3, 77, 99, 2, 2, 32, 32}, [](auto& o, auto& x, auto& s) { add_bias(o, x, s, 1, 2); }},
      {"bias broadcast over heads", {2, 77, 99, 4, 2, 32, 32}, [](auto& o, auto& x, auto& s) { add_bias(o, x, s, 2, 1); }},
      {"bias broadcast over both", {2, 77, 99, 4, 2, 32, 32}, [](auto& o, auto& x, auto& s) { add_bias(o, x, s, 1, 1); }},
      {"mask", {2, 77, 99, 2, 1, 32, 32}, [](auto& o, auto& x, auto& s) { add_mask(o, x, s); }},
      {"gqa 27/1", {1, 45, 70, 27, 1, 16, 16}, [](auto& o, auto&, auto&) { o.causal = true; }},
      {"gqa 65/5", {1, 33, 40, 65, 5, 8, 8}, none},
      {"head dims differ", {1, 90, 110, 2, 1, 72, 40}, [](auto& o, auto&, auto&) { o.causal = true; }},
      {"everything", {2, 130, 170, 6, 2, 48, 48}, [](auto& o, auto& x, auto& s) {
         o.causal = true;
         o.window_left = 60;
         o.softcap = 5.0f;
         add_alibi(o, x, s, false);
         add_sinks(o, x, s);
         add_bias(o, x, s, 1, 6);
       }},
  };
  return all;
}

class BackwardAccuracy : public ::testing::TestWithParam<std::size_t> {};

TEST_P(BackwardAccuracy, Float) { check_case<float>(cases()[GetParam()], Layout::bshd, 100 + GetParam()); }
TEST_P(BackwardAccuracy, Bf16) { check_case<bf16>(cases()[GetParam()], Layout::bshd, 200 + GetParam()); }
TEST_P(BackwardAccuracy, Fp16) { check_case<fp16>(cases()[GetParam()], Layout::bshd, 300 + GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, BackwardAccuracy, ::testing::Range<std::size_t>(0, cases().size()),
                         [](const auto& info) {
                           std::string n = cases()[info.param].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(BackwardLayouts, StridedViewsGiveTheSameGradients) {
  const Case c{"causal gqa", {2, 75, 90, 4, 2, 24, 24}, [](auto& o, auto&, auto&) { o.causal = true; }};
  for (Layout layout : all_layouts) check_case<float>(c, layout, 7);
}

TEST(BackwardLarge, Size1023x1024) {
  check_case<float>({"1023x1024", {1, 1023, 1024, 1, 1, 64, 64}, none}, Layout::bshd, 11);
  check_case<float>({"1023x1024 causal", {1, 1023, 1024, 1, 1, 64, 64},
                     [](auto& o, auto&, auto&) { o.causal = true; }},
                    Layout::bshd, 12);
}

TEST(BackwardSmallBudget, ManyTilesGiveTheSameAccuracy) {
  check_case<float>({"small budget", {1, 130, 170, 2, 1, 32, 32},
                     [](auto& o, auto&, auto&) { o.causal = true; o.sram_budget_bytes = 40000; }},
                    Layout::bshd, 13);
}

}  // namespace
}  // namespace tileattn::test
