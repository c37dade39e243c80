// tests/reference/naive_backward_test.cpp: checks the backward references of
// reference/naive_backward.hpp. attention_backward (double) is compared with central finite
// differences (with Richardson extrapolation) of L = sum(dout * O), O from the double forward
// reference, on tiny shapes for every option alone and in combinations: dq, dk, dv, and dbias
// and dsinks where present. Then rows that see no key, masked Inf / NaN that must not leak, NaN
// that must, the varlen helper, and attention_backward_naive in float, bf16 and fp16 against
// attention_backward on the same (rounded) inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "reference/naive_backward.hpp"
#include "tileattn/core/half_types.hpp"

namespace tileattn::reference {
namespace {

/// Finite-difference step: a power of two, so x +- step is exact for the float bias and sinks
/// (whose values lie on a grid of 2^-12).
constexpr double fd_step = 0x1p-10;
/// |analytic - numeric| <= fd_tolerance * max(1, max |numeric| of that gradient).
constexpr double fd_tolerance = 1e-8;

struct Shape {
  index_t batch, nq, nk, heads, heads_kv, d, dv;
};

/// One problem: contiguous [B, N, H, D] double Q, K, V, dout, and the options' buffers.
struct Problem {
  Shape s;
  Options base;  // the scalar options; options() adds the buffers below
  std::vector<double> q, k, v, dout;
  std::vector<float> bias;  // buffer of the bias view (bias_shape, bias_stride)
  std::array<index_t, 4> bias_shape{}, bias_stride{};
  std::unique_ptr<bool[]> mask;  // contiguous mask_shape
  std::array<index_t, 4> mask_shape{};
  std::vector<float> sinks, slopes;
  std::mt19937 rng;

  Problem(Shape shape, std::uint32_t seed) : s(shape), rng(seed) {
    q = normal(static_cast<std::size_t>(s.batch * s.nq * s.heads * s.d));
    k = normal(static_cast<std::size_t>(s.batch * s.nk * s.heads_kv * s.d));
    v = normal(static_cast<std::size_t>(s.batch * s.nk * s.heads_kv * s.dv));
    dout = normal(static_cast<std::size_t>(s.batch * s.nq * s.heads * s.dv));
  }

  std::vector<double> normal(std::size_t n) {
    std::normal_distribution<double> dist(0.0, 1.0);
    std::vector<double> x(n);
    for (double& e : x) e = dist(rng);
    return x;
  }

  float normal_float() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }
  /// x rounded to a multiple of 2^-12, so that x +- fd_step and x +- fd_step / 2 are exact
  /// floats even where they cross into a larger binade.
  static float on_grid(float x) { return std::round(x * 4096.0f) / 4096.0f; }

  /// A bias [bb, hb, nq + extra_q, nk + extra_k] of N(0, 1) floats; transposed: the last two
  /// dimensions swapped in memory.
  void add_bias(index_t bb, index_t hb, bool transposed = false, index_t extra_q = 0, index_t extra_k = 0) {
    const index_t rows = s.nq + extra_q, cols = s.nk + extra_k;
    bias_shape = {bb, hb, rows, cols};
    bias_stride = transposed ? std::array<index_t, 4>{hb * rows * cols, rows * cols, 1, rows}
                             : std::array<index_t, 4>{hb * rows * cols, rows * cols, cols, 1};
    bias.resize(static_cast<std::size_t>(bb * hb * rows * cols));
    for (float& e : bias) e = on_grid(normal_float());
  }
  /// A mask [bm, hm, nq, nk], true with probability 0.7, and row empty_row (if >= 0) all false.
  void add_mask(index_t bm, index_t hm, index_t empty_row) {
    mask_shape = {bm, hm, s.nq, s.nk};
    const auto n = static_cast<std::size_t>(bm * hm * s.nq * s.nk);
    mask = std::make_unique<bool[]>(n);
    std::bernoulli_distribution keep(0.7);
    for (std::size_t e = 0; e < n; ++e) mask[e] = keep(rng);
    if (empty_row >= 0)
      for (index_t b = 0; b < bm; ++b)
        for (index_t h = 0; h < hm; ++h)
          for (index_t j = 0; j < s.nk; ++j) mask[static_cast<std::size_t>(((b * hm + h) * s.nq + empty_row) * s.nk + j)] = false;
  }
  void add_sinks() {
    sinks.resize(static_cast<std::size_t>(s.heads));
    for (float& e : sinks) e = on_grid(normal_float());
  }
  void add_slopes(index_t count) {
    std::uniform_real_distribution<float> dist(0.1f, 0.9f);
    slopes.resize(static_cast<std::size_t>(count));
    for (float& e : slopes) e = dist(rng);
  }

  TensorView<const double> qv() const { return make_bshd(q.data(), s.batch, s.nq, s.heads, s.d); }
  TensorView<const double> kv() const { return make_bshd(k.data(), s.batch, s.nk, s.heads_kv, s.d); }
  TensorView<const double> vv() const { return make_bshd(v.data(), s.batch, s.nk, s.heads_kv, s.dv); }
  TensorView<const double> doutv() const { return make_bshd(dout.data(), s.batch, s.nq, s.heads, s.dv); }

  Options options() const {
    Options o = base;
    if (!bias.empty()) o.bias = {bias.data(), bias_shape, bias_stride};
    if (mask) {
      const auto [bm, hm, rows, cols] = mask_shape;
      o.mask = {mask.get(), mask_shape, {hm * rows * cols, rows * cols, cols, 1}};
    }
    o.sinks = sinks;
    o.alibi_slopes = slopes;
    return o;
  }

  double loss() const {
    const AttentionResult f = attention<double>(qv(), kv(), vv(), options());
    double l = 0.0;
    for (std::size_t e = 0; e < dout.size(); ++e) l += dout[e] * f.o[e];
    return l;
  }
  BackwardResult grads() const { return attention_backward<double>(qv(), kv(), vv(), doutv(), options()); }
};

/// dL/dx by central differences at steps h and h/2, Richardson-extrapolated (O(h^4)).
template <class E>
double numeric_derivative(const std::function<double()>& loss, E& x) {
  const E x0 = x;
  const auto at = [&](double delta) {
    x = static_cast<E>(static_cast<double>(x0) + delta);
    return loss();
  };
  const auto central = [&](double h) { return (at(h) - at(-h)) / (2.0 * h); };
  const double coarse = central(fd_step), fine = central(fd_step / 2);
  x = x0;
  return (4.0 * fine - coarse) / 3.0;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

/// Every analytic gradient is finite and within fd_tolerance of the numeric one.
void expect_matches(const std::string& what, const std::vector<double>& analytic, const std::vector<double>& numeric) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  const double tol = fd_tolerance * std::max(1.0, max_abs(numeric));
  double worst = 0.0;
  std::size_t worst_at = 0;
  for (std::size_t e = 0; e < analytic.size(); ++e) {
    ASSERT_TRUE(std::isfinite(analytic[e])) << what << "[" << e << "] = " << analytic[e];
    const double err = std::abs(analytic[e] - numeric[e]);
    if (err > worst) worst = err, worst_at = e;
  }
  EXPECT_LE(worst, tol) << what << "[" << worst_at << "]: analytic " << analytic[worst_at] << ", numeric "
                        << numeric[worst_at];
}

/// Compares r (the gradients of `loss` over p's buffers) with finite differences.
void check_against_fd(Problem& p, const std::function<double()>& loss, const BackwardResult& r) {
  const auto numeric_all = [&](auto& buffer) {
    std::vector<double> g(buffer.size());
    for (std::size_t e = 0; e < buffer.size(); ++e) g[e] = numeric_derivative(loss, buffer[e]);
    return g;
  };
  expect_matches("dq", r.dq, numeric_all(p.q));  // p's buffers are contiguous: same layout
  expect_matches("dk", r.dk, numeric_all(p.k));
  expect_matches("dv", r.dv, numeric_all(p.v));
  if (p.s.nk > 1 || !p.sinks.empty()) {  // one key and no sink: P = 1, so dq = dk = 0
    EXPECT_GT(max_abs(r.dq), 1e-3);
    EXPECT_GT(max_abs(r.dk), 1e-3);
  }
  EXPECT_GT(max_abs(r.dv), 1e-3);
  if (p.sinks.empty()) {
    EXPECT_TRUE(r.dsinks.empty());
  } else {
    expect_matches("dsinks", r.dsinks, numeric_all(p.sinks));
    EXPECT_GT(max_abs(r.dsinks), 1e-4);
  }
  if (p.bias.empty()) {
    EXPECT_TRUE(r.dbias.empty());
    return;
  }
  ASSERT_EQ(r.bias_shape, p.bias_shape);
  ASSERT_EQ(r.dbias.size(), p.bias.size());
  std::vector<double> analytic, numeric;  // in dbias's (logical, contiguous) order
  const auto [bb, hb, rows, cols] = p.bias_shape;
  for (index_t b = 0; b < bb; ++b)
    for (index_t h = 0; h < hb; ++h)
      for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) {
          const auto at = static_cast<std::size_t>(b * p.bias_stride[0] + h * p.bias_stride[1] +
                                                   i * p.bias_stride[2] + j * p.bias_stride[3]);
          EXPECT_EQ(r.bias_index(b, h, i, j), analytic.size());
          analytic.push_back(r.grad_bias(b, h, i, j));
          numeric.push_back(numeric_derivative(loss, p.bias[at]));
        }
  expect_matches("dbias", analytic, numeric);
  EXPECT_GT(max_abs(r.dbias), 1e-4);
}

void check_against_fd(Problem& p) {
  const BackwardResult r = p.grads();
  EXPECT_EQ(r.batch, p.s.batch);
  EXPECT_EQ(r.seqlen_q, p.s.nq);
  EXPECT_EQ(r.seqlen_k, p.s.nk);
  EXPECT_EQ(r.heads, p.s.heads);
  EXPECT_EQ(r.heads_kv, p.s.heads_kv);
  EXPECT_EQ(r.head_dim, p.s.d);
  EXPECT_EQ(r.head_dim_v, p.s.dv);
  check_against_fd(p, [&p] { return p.loss(); }, r);
}

// ---- Finite differences, option by option --------------------------------------------------

struct Case {
  std::string name;
  Shape shape;
  std::function<void(Problem&)> setup;
};

const Shape tall{2, 5, 3, 2, 2, 3, 3};    // Nq > Nk
const Shape wide{2, 3, 5, 2, 2, 3, 3};    // Nq < Nk
const Shape square{2, 4, 4, 2, 2, 4, 4};  // Nq == Nk
const Shape gqa{2, 3, 5, 2, 1, 3, 3};     // 2 query heads per KV head

std::vector<Case> cases() {
  const auto none = [](Problem&) {};
  return {
      {"plain", wide, none},
      {"plain_tall", tall, none},
      {"single_query_single_key", {2, 1, 1, 2, 2, 2, 2}, none},
      {"single_key_with_sink", {2, 2, 1, 2, 2, 2, 2}, [](Problem& p) { p.add_sinks(); }},
      {"head_dim_v_differs", {2, 3, 5, 2, 2, 2, 4}, none},
      {"scale", tall, [](Problem& p) { p.base.softmax_scale = 0.7; }},
      {"causal_bottom_right_wide", wide, [](Problem& p) { p.base.causal = true; }},
      {"causal_bottom_right_tall", tall, [](Problem& p) { p.base.causal = true; }},  // 2 empty rows
      {"causal_top_left_wide", wide,
       [](Problem& p) { p.base.causal = true, p.base.alignment = MaskAlignment::top_left; }},
      {"causal_top_left_tall", tall,
       [](Problem& p) { p.base.causal = true, p.base.alignment = MaskAlignment::top_left; }},
      {"window_left", square, [](Problem& p) { p.base.window_left = 1; }},
      {"window_right_top_left", tall,
       [](Problem& p) { p.base.window_right = 1, p.base.alignment = MaskAlignment::top_left; }},
      {"window_both", wide, [](Problem& p) { p.base.window_left = 1, p.base.window_right = 1; }},
      {"window_left_causal", wide, [](Problem& p) { p.base.window_left = 2, p.base.causal = true; }},
      {"softcap", wide, [](Problem& p) { p.base.softcap = 1.5f, p.base.softmax_scale = 1.3; }},
      {"alibi_per_head", wide, [](Problem& p) { p.add_slopes(p.s.heads); }},
      {"alibi_per_batch_top_left", tall,
       [](Problem& p) { p.add_slopes(p.s.batch * p.s.heads), p.base.alignment = MaskAlignment::top_left; }},
      {"sinks", wide, [](Problem& p) { p.add_sinks(); }},
      {"bias_full", wide, [](Problem& p) { p.add_bias(p.s.batch, p.s.heads); }},
      {"bias_transposed_strides", tall, [](Problem& p) { p.add_bias(p.s.batch, p.s.heads, true); }},
      {"bias_broadcast_batch", wide, [](Problem& p) { p.add_bias(1, p.s.heads); }},
      {"bias_broadcast_heads", wide, [](Problem& p) { p.add_bias(p.s.batch, 1); }},
      {"bias_broadcast_both", gqa, [](Problem& p) { p.add_bias(1, 1); }},
      {"mask_with_empty_row", wide, [](Problem& p) { p.add_mask(p.s.batch, p.s.heads, 1); }},
      {"mask_broadcast", square, [](Problem& p) { p.add_mask(1, 1, 2); }},
      {"gqa", gqa, none},
      {"gqa_4_to_2_dv", {2, 3, 4, 4, 2, 3, 2}, [](Problem& p) { p.base.causal = true; }},
      {"combo_causal_softcap_alibi_sinks_bias_gqa", {2, 4, 5, 2, 1, 3, 4},
       [](Problem& p) {
         p.base.causal = true;
         p.base.softcap = 2.0f;
         p.base.softmax_scale = 1.1;
         p.add_slopes(p.s.heads);
         p.add_sinks();
         p.add_bias(1, p.s.heads);
       }},
      {"combo_window_mask_bias_sinks_top_left", {2, 5, 4, 2, 2, 2, 3},
       [](Problem& p) {  // row 3 sees no key, only its sink
         p.base.alignment = MaskAlignment::top_left;
         p.base.window_left = 1;
         p.base.window_right = 2;
         p.add_mask(p.s.batch, 1, 3);
         p.add_bias(p.s.batch, p.s.heads, true);
         p.add_sinks();
       }},
      {"batch_index_per_batch_options", {1, 3, 4, 2, 1, 3, 3},
       [](Problem& p) {  // one sequence (index 1) of a batch of 2; the bias has max-seqlen extents
         p.base.batch_index = 1;
         p.base.causal = true;
         p.add_bias(2, p.s.heads, false, 2, 1);
         p.add_slopes(2 * p.s.heads);
       }},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class FiniteDifferences : public ::testing::TestWithParam<Case> {};

TEST_P(FiniteDifferences, AnalyticGradientsMatch) {
  const Case& c = GetParam();
  Problem p(c.shape, 1000u + static_cast<std::uint32_t>(std::hash<std::string>{}(c.name) % 1000u));
  c.setup(p);
  check_against_fd(p);
}

INSTANTIATE_TEST_SUITE_P(Options, FiniteDifferences, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- Rows that see no key, and non-finite values --------------------------------------------

TEST(ReferenceBackward, RowsThatSeeNoKeyGetExactlyZero) {
  Problem p(tall, 7);  // bottom-right causal, Nq = 5 > Nk = 3: rows 0 and 1 see no key
  p.base.causal = true;
  p.add_mask(1, 1, 3);  // and row 3 sees none either
  p.add_bias(p.s.batch, p.s.heads);
  const BackwardResult r = p.grads();
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t h = 0; h < p.s.heads; ++h)
      for (index_t i : {0, 1, 3}) {
        for (index_t c = 0; c < p.s.d; ++c) EXPECT_EQ(r.grad_q(b, i, h, c), 0.0) << b << " " << h << " " << i;
        for (index_t j = 0; j < p.s.nk; ++j) EXPECT_EQ(r.grad_bias(b, h, i, j), 0.0);
      }
  EXPECT_GT(max_abs(r.dq), 1e-3);
}

TEST(ReferenceBackward, SinkOnlyRowGetsZeroGradients) {
  Problem p(square, 8);
  p.add_mask(1, 1, 2);  // row 2 sees only the sink: P_sink = 1, O = 0, D = 0
  p.add_sinks();
  const BackwardResult with_row = p.grads();
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t h = 0; h < p.s.heads; ++h)
      for (index_t c = 0; c < p.s.d; ++c) EXPECT_EQ(with_row.grad_q(b, 2, h, c), 0.0);
  // Its dout does not matter: dsinks, dk and dv are the same with it changed.
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t h = 0; h < p.s.heads; ++h)
      for (index_t c = 0; c < p.s.dv; ++c) p.dout[static_cast<std::size_t>(((b * p.s.nq + 2) * p.s.heads + h) * p.s.dv + c)] += 3.0;
  const BackwardResult changed = p.grads();
  EXPECT_EQ(with_row.dsinks, changed.dsinks);
  EXPECT_EQ(with_row.dk, changed.dk);
  EXPECT_EQ(with_row.dv, changed.dv);
}

TEST(ReferenceBackward, MaskedInfAndNanNeverLeak) {
  // Top-left causal with Nq = 3 < Nk = 5: no row sees keys 3 and 4.
  Problem p(wide, 9);
  p.base.causal = true;
  p.base.alignment = MaskAlignment::top_left;
  const BackwardResult clean = p.grads();
  const double inf = std::numeric_limits<double>::infinity();
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t h = 0; h < p.s.heads_kv; ++h) {
      for (index_t c = 0; c < p.s.d; ++c) {
        p.k[static_cast<std::size_t>(((b * p.s.nk + 4) * p.s.heads_kv + h) * p.s.d + c)] = inf;
        p.k[static_cast<std::size_t>(((b * p.s.nk + 3) * p.s.heads_kv + h) * p.s.d + c)] = std::nan("");
      }
      for (index_t c = 0; c < p.s.dv; ++c) {
        p.v[static_cast<std::size_t>(((b * p.s.nk + 4) * p.s.heads_kv + h) * p.s.dv + c)] = -inf;
        p.v[static_cast<std::size_t>(((b * p.s.nk + 3) * p.s.heads_kv + h) * p.s.dv + c)] = std::nan("");
      }
    }
  const BackwardResult dirty = p.grads();
  EXPECT_EQ(clean.dq, dirty.dq);
  EXPECT_EQ(clean.dk, dirty.dk);
  EXPECT_EQ(clean.dv, dirty.dv);
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t h = 0; h < p.s.heads_kv; ++h)
      for (index_t j : {3, 4}) {
        for (index_t c = 0; c < p.s.d; ++c) EXPECT_EQ(dirty.grad_k(b, j, h, c), 0.0);
        for (index_t c = 0; c < p.s.dv; ++c) EXPECT_EQ(dirty.grad_v(b, j, h, c), 0.0);
      }
}

TEST(ReferenceBackward, NanScoreReachesWhatItsRowSees) {
  // Bottom-right causal, Nq = 3, Nk = 5, GQA 2/1: row 1 of head 0 sees keys 0..3.
  Problem p(gqa, 10);
  p.base.causal = true;
  p.add_sinks();
  p.q[static_cast<std::size_t>(((0 * p.s.nq + 1) * p.s.heads + 0) * p.s.d + 0)] = std::nan("");
  const BackwardResult r = p.grads();
  for (index_t c = 0; c < p.s.d; ++c) EXPECT_TRUE(std::isnan(r.grad_q(0, 1, 0, c)));
  for (index_t j = 0; j <= 3; ++j) {
    for (index_t c = 0; c < p.s.d; ++c) EXPECT_TRUE(std::isnan(r.grad_k(0, j, 0, c))) << j;
    for (index_t c = 0; c < p.s.dv; ++c) EXPECT_TRUE(std::isnan(r.grad_v(0, j, 0, c))) << j;
  }
  EXPECT_TRUE(std::isnan(r.grad_sink(0)));
  // Key 4 is seen only by row 2; every other query row and batch 1 stay finite.
  for (index_t c = 0; c < p.s.d; ++c) EXPECT_TRUE(std::isfinite(r.grad_k(0, 4, 0, c)));
  for (index_t c = 0; c < p.s.dv; ++c) EXPECT_TRUE(std::isfinite(r.grad_v(0, 4, 0, c)));
  for (index_t b = 0; b < p.s.batch; ++b)
    for (index_t i = 0; i < p.s.nq; ++i)
      for (index_t h = 0; h < p.s.heads; ++h)
        if (b != 0 || i != 1 || h != 0) {
          for (index_t c = 0; c < p.s.d; ++c) EXPECT_TRUE(std::isfinite(r.grad_q(b, i, h, c))) << b << i << h;
        }
  for (std::size_t e = r.k_index(1, 0, 0, 0); e < r.dk.size(); ++e) EXPECT_TRUE(std::isfinite(r.dk[e]));
  EXPECT_TRUE(std::isfinite(r.grad_sink(1)));
}

// ---- Varlen ---------------------------------------------------------------------------------

TEST(ReferenceBackward, VarlenMatchesFiniteDifferences) {
  // Packed sequences of (2 x 4) and (3 x 3) rows; the per-sequence options (bias with
  // max-seqlen extents, ALiBi per sequence) are indexed by the sequence.
  const std::vector<std::int32_t> cu_q{0, 2, 5}, cu_k{0, 4, 7};
  Problem p({1, 5, 7, 2, 1, 3, 2}, 11);  // the packed [total, heads, dim] buffers
  p.base.causal = true;
  p.add_sinks();
  p.add_slopes(2 * p.s.heads);
  const index_t max_q = 3, max_k = 4;
  {
    Problem shape_only({1, max_q, max_k, p.s.heads, 1, 1, 1}, 12);
    shape_only.add_bias(2, p.s.heads);
    p.bias = shape_only.bias, p.bias_shape = shape_only.bias_shape, p.bias_stride = shape_only.bias_stride;
  }
  const auto packed = [](const std::vector<double>& x, index_t rows, index_t heads, index_t dim) {
    return StridedView<const double, 3>{x.data(), {rows, heads, dim}, {heads * dim, dim, 1}};
  };
  const auto views = [&] {
    return std::array{packed(p.q, 5, p.s.heads, p.s.d), packed(p.k, 7, p.s.heads_kv, p.s.d),
                      packed(p.v, 7, p.s.heads_kv, p.s.dv), packed(p.dout, 5, p.s.heads, p.s.dv)};
  };
  const auto loss = [&] {
    const auto [q, k, v, dout] = views();
    double l = 0.0;
    for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
      Options o = p.options();
      o.batch_index = static_cast<index_t>(s);
      const index_t q0 = cu_q[s], nq = cu_q[s + 1] - q0, k0 = cu_k[s], nk = cu_k[s + 1] - k0;
      const AttentionResult f = attention<double>(sequence_view(q, q0, nq), sequence_view(k, k0, nk),
                                                  sequence_view(v, k0, nk), o);
      const auto dv = sequence_view(dout, q0, nq);
      for (index_t i = 0; i < nq; ++i)
        for (index_t h = 0; h < p.s.heads; ++h)
          for (index_t c = 0; c < p.s.dv; ++c) l += dv(0, i, h, c) * f.out(0, i, h, c);
    }
    return l;
  };
  const auto [q, k, v, dout] = views();
  const BackwardResult r = attention_backward_varlen<double>(q, k, v, dout, cu_q, cu_k, p.options());
  EXPECT_EQ(r.batch, 1);
  EXPECT_EQ(r.seqlen_q, 5);
  EXPECT_EQ(r.seqlen_k, 7);
  check_against_fd(p, loss, r);
}

// ---- The naive same-precision backward ------------------------------------------------------

struct RelativeErrors {
  double dq, dk, dv, dbias, dsinks;
};

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    EXPECT_TRUE(std::isfinite(got[e])) << e;
    err = std::max(err, std::abs(static_cast<double>(got[e]) - want[e]));
  }
  return err / std::max(max_abs(want), 1e-300);
}

/// The naive backward in T on p's inputs rounded to T, against attention_backward on the
/// same rounded inputs: max error of each gradient over that gradient's max magnitude.
template <class T>
RelativeErrors naive_errors(const Problem& p) {
  const auto rounded = [](const std::vector<double>& x) {
    std::vector<T> out(x.size());
    for (std::size_t e = 0; e < x.size(); ++e) out[e] = from_float<T>(static_cast<float>(x[e]));
    return out;
  };
  const std::vector<T> q = rounded(p.q), k = rounded(p.k), v = rounded(p.v), dout = rounded(p.dout);
  const Shape& s = p.s;
  const auto view = [](const std::vector<T>& x, index_t b, index_t n, index_t h, index_t d) {
    return make_bshd(x.data(), b, n, h, d);
  };
  const TensorView<const T> qv = view(q, s.batch, s.nq, s.heads, s.d), kv = view(k, s.batch, s.nk, s.heads_kv, s.d),
                            vv = view(v, s.batch, s.nk, s.heads_kv, s.dv),
                            dov = view(dout, s.batch, s.nq, s.heads, s.dv);
  const Options opt = p.options();
  const NaiveBackwardF naive = attention_backward_naive<T>(qv, kv, vv, dov, opt);
  const BackwardResult exact = attention_backward<T>(qv, kv, vv, dov, opt);
  EXPECT_EQ(naive.bias_shape, exact.bias_shape);
  EXPECT_EQ(naive.dsinks.size(), exact.dsinks.size());
  return {relative_error(naive.dq, exact.dq), relative_error(naive.dk, exact.dk),
          relative_error(naive.dv, exact.dv), exact.dbias.empty() ? 0.0 : relative_error(naive.dbias, exact.dbias),
          exact.dsinks.empty() ? 0.0 : relative_error(naive.dsinks, exact.dsinks)};
}

Problem naive_problem(bool all_options) {
  Problem p({2, 17, 23, 4, 2, 16, 8}, all_options ? 21 : 22);
  if (all_options) {
    p.base.causal = true;
    p.base.window_left = 9;
    p.base.softcap = 4.0f;
    p.add_slopes(p.s.heads);
    p.add_sinks();
    p.add_bias(1, p.s.heads);
    p.add_mask(p.s.batch, 1, 5);
  }
  return p;
}

void print(const char* what, const RelativeErrors& e) {
  std::printf("%s: dq %.2e  dk %.2e  dv %.2e  dbias %.2e  dsinks %.2e\n", what, e.dq, e.dk, e.dv, e.dbias, e.dsinks);
}

TEST(NaiveBackward, FloatIsCloseToTheReference) {
  for (bool all : {false, true}) {
    const RelativeErrors e = naive_errors<float>(naive_problem(all));
    print(all ? "fp32 all options" : "fp32 plain", e);
    for (double x : {e.dq, e.dk, e.dv, e.dbias, e.dsinks}) EXPECT_LT(x, 1e-5);  // measured <= 4e-7
    EXPECT_GT(e.dq, 0.0);  // float arithmetic, not double
  }
}

TEST(NaiveBackward, Bf16ErrsMoreButBounded) {
  for (bool all : {false, true}) {
    const RelativeErrors e = naive_errors<bf16>(naive_problem(all));
    print(all ? "bf16 all options" : "bf16 plain", e);
    for (double x : {e.dq, e.dk, e.dv, e.dbias, e.dsinks}) EXPECT_LT(x, 0.03);  // measured <= 6.4e-3
    for (double x : {e.dq, e.dk, e.dv}) EXPECT_GT(x, 1e-3);  // the intermediates are rounded
  }
}

TEST(NaiveBackward, Fp16ErrsBetweenFloatAndBf16) {
  for (bool all : {false, true}) {
    const RelativeErrors e = naive_errors<fp16>(naive_problem(all));
    print(all ? "fp16 all options" : "fp16 plain", e);
    for (double x : {e.dq, e.dk, e.dv, e.dbias, e.dsinks}) EXPECT_LT(x, 5e-3);  // measured <= 1.1e-3
    for (double x : {e.dq, e.dk, e.dv}) EXPECT_GT(x, 1e-4);
  }
}

}  // namespace
}  // namespace tileattn::reference
