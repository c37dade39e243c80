// tests/variants/nonfinite_storage_test.cpp: the NaN and Inf semantics of docs/options.md in
// bf16 and fp16 storage, where tiles differ (bf16 pairs: K and Q paired along head_dim, V
// along keys, P rounded to bf16): a NaN score a row sees makes its O and LSE NaN; a NaN or
// Inf V row reaches exactly the rows that see its key; on every tile size, backend and
// thread count, with odd head dims and odd key counts (pair padding).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

constexpr float nan = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

template <class T>
class NonFiniteStorage : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(NonFiniteStorage, HalfTypes);

template <class T>
double o_tolerance() {
  return std::is_same_v<T, bf16> ? 2e-2 : 3e-3;  // a few ulps of O in the type
}

/// One problem: float copies of the rounded inputs (for the reference) and the T tensors.
template <class T>
struct HalfProblem {
  index_t nq, nk, heads, d;
  std::vector<float> q, k, v;  // [1, n, heads, d], values representable in T

  HalfProblem(index_t nq_, index_t nk_, index_t heads_, index_t d_, unsigned seed)
      : nq(nq_), nk(nk_), heads(heads_), d(d_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    q.resize(static_cast<std::size_t>(nq * heads * d));
    k.resize(static_cast<std::size_t>(nk * heads * d));
    v.resize(k.size());
    for (auto* x : {&q, &k, &v})
      for (float& e : *x) e = to_float(from_float<T>(normal(rng)));
  }
  float& at(std::vector<float>& t, index_t row, index_t h, index_t c) {
    return t[static_cast<std::size_t>((row * heads + h) * d + c)];
  }

  /// Runs the forward in T under every budget and execution and compares each run with the
  /// reference: NaN and Inf where it has them (exactly), finite elsewhere within tolerance;
  /// the same bits on every backend and thread count of a budget, and the same NaN pattern
  /// under every budget (tile sizes change the rounding, never which rows are NaN).
  void expect_reference_everywhere(ForwardOptions opts) {
    const auto to_t = [](const std::vector<float>& x) {
      std::vector<T> out(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_float<T>(x[i]);
      return out;
    };
    const std::vector<T> qt = to_t(q), kt = to_t(k), vt = to_t(v);
    reference::Options ref_opts = reference::Options::from(opts);
    const auto ref = reference::attention(TensorView<const float>(make_bshd(q.data(), 1, nq, heads, d)),
                                          TensorView<const float>(make_bshd(k.data(), 1, nk, heads, d)),
                                          TensorView<const float>(make_bshd(v.data(), 1, nk, heads, d)), ref_opts);
    std::vector<bool> first_nan;
    for (std::size_t budget : {std::size_t{0}, rows_budget_for<T>(16, d), rows_budget_for<T>(3, d)}) {
      std::vector<T> first;
      for (Backend b : compiled_backends())
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE("budget " + std::to_string(budget) + ", " + to_string(b) + " x " + std::to_string(threads));
          opts.sram_budget_bytes = budget;
          opts.execution = {b, threads};
          std::vector<T> o(q.size(), from_float<T>(sentinel));
          std::vector<float> lse(static_cast<std::size_t>(heads * nq), sentinel);
          forward(make_bshd(qt.data(), 1, nq, heads, d), make_bshd(kt.data(), 1, nk, heads, d),
                  make_bshd(vt.data(), 1, nk, heads, d), make_bshd(o.data(), 1, nq, heads, d),
                  make_lse(lse.data(), 1, heads, nq), opts);
          std::vector<float> of(o.size());
          for (std::size_t i = 0; i < o.size(); ++i) of[i] = to_float(o[i]);
          const Deviation dev = compare_to_reference(ref, TensorView<const float>(make_bshd(of.data(), 1, nq, heads, d)),
                                                     make_lse(lse.data(), 1, heads, nq));
          EXPECT_EQ(dev.problem, "");
          EXPECT_LE(dev.o, o_tolerance<T>());
          EXPECT_LE(dev.lse, 1e-4);
          if (first.empty()) first = o;
          for (std::size_t i = 0; i < o.size(); ++i)
            ASSERT_EQ(o[i].bits, first[i].bits) << "element " << i << " depends on the backend or the threads";
          std::vector<bool> nan_pattern(o.size());
          for (std::size_t i = 0; i < o.size(); ++i) nan_pattern[i] = std::isnan(of[i]);
          if (first_nan.empty()) first_nan = nan_pattern;
          EXPECT_TRUE(nan_pattern == first_nan) << "the NaN pattern depends on the tiling";
        }
    }
  }
};

// A NaN in K for the first keys: every row sees them, every row is NaN (odd d: the NaN is
// in the last, half-padded pair).
TYPED_TEST(NonFiniteStorage, NaNKeysMakeEveryRowNaN) {
  HalfProblem<TypeParam> p(37, 75, 2, 17, 1);
  for (index_t j = 0; j < 20; ++j) p.at(p.k, j, 0, 16) = nan;
  p.expect_reference_everywhere({});
}

// Causal: a NaN key j reaches only the rows that see it (bottom-right: i >= j - (nk - nq)).
TYPED_TEST(NonFiniteStorage, NaNKeyReachesOnlyRowsThatSeeIt) {
  HalfProblem<TypeParam> p(61, 61, 2, 40, 2);
  p.at(p.k, 30, 1, 5) = nan;
  ForwardOptions opts;
  opts.causal = true;
  p.expect_reference_everywhere(opts);
}

// Inf and NaN V rows under a causal mask: rows before the key stay finite and exact to
// rounding; rows that see it get Inf or NaN as the reference does (odd key counts: V pairs
// padded).
TYPED_TEST(NonFiniteStorage, NonFiniteValuesReachOnlyRowsThatSeeThem) {
  for (float bad : {inf, -inf, nan}) {
    HalfProblem<TypeParam> p(53, 53, 1, 33, 3);
    p.at(p.v, 40, 0, 7) = bad;
    p.at(p.v, 17, 0, 32) = bad;
    ForwardOptions opts;
    opts.causal = true;
    p.expect_reference_everywhere(opts);
  }
}

// A NaN in one query row makes that row alone NaN.
TYPED_TEST(NonFiniteStorage, NaNQueryRowIsTheOnlyNaNRow) {
  HalfProblem<TypeParam> p(29, 129, 2, 64, 4);
  p.at(p.q, 11, 1, 0) = nan;
  p.expect_reference_everywhere({});
}

}  // namespace
}  // namespace tileattn::test
