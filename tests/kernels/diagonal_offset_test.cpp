// ScoreOptions::diagonal_offset: query i aligned with key i + offset, whatever the lengths.
// Forward and backward against the double reference over offsets that make the mask full,
// partial, empty and far away (with causal, windows, ALiBi, softcap and sinks); a block of
// rows and keys cut from a longer sequence equals that sequence's own rows; the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/backward_support.hpp"

namespace tileattn::test {
namespace {

struct Case {
  index_t nq, nk, offset;
  const char* what;
  void (*set)(ForwardOptions&);
};

std::vector<Case> cases() {
  const auto causal = [](ForwardOptions& o) { o.causal = true; };
  const auto window = [](ForwardOptions& o) { o.window_left = 9, o.window_right = 4; };
  const auto left_only = [](ForwardOptions& o) { o.window_left = 30; };
  const auto alibi = [](ForwardOptions& o) {
    static const float slopes[3] = {0.5f, 0.125f, 0.03125f};
    o.alibi_slopes = slopes, o.causal = true;
  };
  const auto capped = [](ForwardOptions& o) {
    static const float sinks[3] = {0.25f, -1.0f, 2.0f};
    o.softcap = 5.0f, o.sinks = sinks, o.window_right = 2, o.window_left = 40;
  };
  return {{17, 127, 0, "causal, offset 0 (top-left)", causal},
          {17, 127, 60, "causal, offset inside", causal},
          {127, 17, 100, "causal, queries below all keys", causal},
          {127, 17, -3, "causal, some rows empty", causal},
          {127, 17, -200, "causal, every row empty", causal},
          {1, 1000, 999, "causal decode row", causal},
          {200, 200, -90, "window, partial band", window},
          {200, 33, 150, "window, band near the end", window},
          {64, 64, index_t{1} << 40, "window far right: every row empty", window},
          {100, 127, -40, "left window only", left_only},
          {100, 100, 55, "ALiBi + causal", alibi},
          {100, 100, -1000000, "ALiBi, far negative: every row empty", alibi},
          {33, 127, 70, "softcap + sinks + window", capped}};
}

ProblemShape shape_of(const Case& c) { return {2, c.nq, c.nk, 3, 3, 40, 24}; }

TEST(DiagonalOffset, ForwardMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    BackwardProblem<float> p(shape_of(c), 11 + static_cast<std::uint64_t>(c.nq));
    ForwardOptions opt;
    c.set(opt);
    opt.diagonal_offset = c.offset;
    p.forward(opt);
    const auto ref = reference::attention<float>(p.qv, p.kv, p.vv, reference::Options::from(opt));
    const Deviation dev = compare_to_reference(ref, p.ov, p.lse_view());
    EXPECT_TRUE(dev.problem.empty()) << dev.problem;
    EXPECT_LE(dev.o, forward_o_tolerance);
    EXPECT_LE(dev.lse, forward_lse_tolerance);
  }
}

TEST(DiagonalOffset, BackwardMatchesReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    BackwardProblem<float> p(shape_of(c), 23 + static_cast<std::uint64_t>(c.nk));
    BackwardOptions opt;
    c.set(opt);
    opt.diagonal_offset = c.offset;
    std::vector<float> dsinks(3, 0.0f);
    if (!opt.sinks.empty()) opt.dsinks = dsinks;
    p.forward(opt);
    p.backward(opt);
    const reference::BackwardResult ref = p.reference(reference::Options::from(opt));
    for (const auto& [name, got, want] : {std::tuple{"dq", p.grad_q(), ref.dq}, std::tuple{"dk", p.grad_k(), ref.dk},
                                          std::tuple{"dv", p.grad_v(), ref.dv}}) {
      const GradError e = grad_error(got, want, name);
      EXPECT_TRUE(e.problem.empty()) << e.problem;
      EXPECT_LE(e.max_error, 2e-5 * std::max(e.magnitude, 1e-3)) << name << ", magnitude " << e.magnitude;
    }
    if (!opt.sinks.empty()) {
      const GradError e = grad_error(dsinks, ref.dsinks, "dsinks");
      EXPECT_LE(e.max_error, 2e-5 * std::max(e.magnitude, 1e-3)) << "dsinks";
    }
  }
}

// Rows [a, a + nq) and keys [c, c + nk) of one causal, windowed, ALiBi sequence of 300
// tokens, computed alone with diagonal_offset = a - c, see what the whole sequence's rows
// see: the same visible keys and biases.
TEST(DiagonalOffset, BlockOfALongerSequence) {
  const index_t n = 300, a = 170, nq = 77;
  BackwardProblem<float> whole({1, n, n, 2, 1, 32, 32}, 5);
  static const float slopes[2] = {0.25f, 0.0625f};
  ForwardOptions opt;
  opt.causal = true;
  opt.window_left = 120;
  opt.alibi_slopes = slopes;
  whole.forward(opt);
  const auto rows = [&](const TensorView<float>& t, index_t start, index_t len) {
    TensorView<float> s = t;
    s.data += start * t.stride[1];
    s.shape[1] = len;
    return s;
  };
  // The keys the rows can see are [a - 120, a + nq) = [50, 247); the block runs on to key
  // 290, so bottom-right alignment would be wrong.
  const index_t c = 50, nk = 240;
  std::vector<float> o(static_cast<std::size_t>(nq * 2 * 32)), lse(static_cast<std::size_t>(2 * nq));
  ForwardOptions block = opt;
  block.diagonal_offset = a - c;
  forward(TensorView<const float>(rows(whole.qv, a, nq)), TensorView<const float>(rows(whole.kv, c, nk)),
          TensorView<const float>(rows(whole.vv, c, nk)), make_bshd(o.data(), 1, nq, 2, 32),
          make_lse(lse.data(), 1, 2, nq), block);
  double worst = 0.0;
  for (index_t i = 0; i < nq; ++i)
    for (index_t h = 0; h < 2; ++h) {
      worst = std::max(worst, static_cast<double>(std::abs(lse[static_cast<std::size_t>(h * nq + i)] -
                                                           whole.lse[static_cast<std::size_t>(h * n + a + i)])));
      for (index_t d = 0; d < 32; ++d)
        worst = std::max(worst, static_cast<double>(std::abs(o[static_cast<std::size_t>((i * 2 + h) * 32 + d)] -
                                                             whole.ov(0, a + i, h, d))));
    }
  EXPECT_LE(worst, 2e-6);
}

TEST(DiagonalOffset, BeyondTheBoundIsRejectedAndWritesNothing) {
  BackwardProblem<float> p({1, 5, 7, 1, 1, 8, 8}, 3);
  std::fill(p.o.begin(), p.o.end(), sentinel);
  ForwardOptions opt;
  opt.diagonal_offset = max_diagonal_offset + 1;
  try {
    p.forward(opt);
    ADD_FAILURE() << "no exception";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "diagonal_offset");
  }
  EXPECT_TRUE(std::all_of(p.o.begin(), p.o.end(), [](float x) { return x == sentinel; }));
  opt.diagonal_offset = -max_diagonal_offset;
  opt.causal = true;
  opt.window_left = 3;
  EXPECT_NO_THROW(p.forward(opt));  // every row empty: O = 0, LSE = -inf
  EXPECT_TRUE(std::all_of(p.lse.begin(), p.lse.end(), [](float x) { return std::isinf(x) && x < 0; }));
}

}  // namespace
}  // namespace tileattn::test
