// tests/support/backward_rule.hpp: FlashAttention's accuracy rule for one gradient, as the
// backward suites check it (kernels, flex, ring), and the large-score inputs that test the
// backward's exact path (P from the forward's row statistics, not from a coarse float LSE).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backward_support.hpp"

namespace tileattn::test {

/// Half the distance between 1 and the next value of T.
template <class T>
double unit_roundoff() {
  return std::is_same_v<T, bf16> ? 1.0 / 256 : std::is_same_v<T, fp16> ? 1.0 / 2048 : 0x1p-24;
}

/// One gradient under FlashAttention's rule: error <= 3 x the naive same-precision
/// backward's + 2e-4, relative to the gradient's magnitude; in fp32 also under 2e-5 where
/// `tight`. A naive error below one rounding to T (a tiny gradient such as a one-row dsinks
/// can round luckily) is taken as one rounding: no implementation that stores O in T does better.
template <class T, class Want>
void expect_within_rule(const std::vector<float>& got, const std::vector<Want>& want,
                        const std::vector<float>& naive_got, const std::string& name, bool tight = true) {
  const GradError e = grad_error(got, want, name);
  const GradError n = grad_error(naive_got, want, name + " (naive)");
  EXPECT_EQ(e.problem, "");
  const double rounding = std::is_same_v<T, float> ? 0.0 : unit_roundoff<T>() * e.magnitude;
  const double bound = 3.0 * std::max(n.max_error, rounding) + 2e-4 * e.magnitude;
  EXPECT_LE(e.max_error, bound) << name << ": naive " << n.max_error << ", magnitude " << e.magnitude;
  if (std::is_same_v<T, float> && tight) {
    EXPECT_LE(e.max_error, 2e-5 * std::max(e.magnitude, 1e-3)) << name << ", magnitude " << e.magnitude;
  }
  EXPECT_GT(e.magnitude, 0.0) << name << " is all zeros: the check cannot fail";
}

/// expect_within_rule (tight = false) for a gradient that cancels: each element within the
/// rule's bound plus the floor 8 u' terms[i] (u' = 2^-24, or T's unit roundoff: O, from
/// which D is summed, is stored in T).
template <class T>
void expect_within_rule_and_floor(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::vector<float>& naive_got, const std::vector<double>& terms,
                                  const std::string& name) {
  const GradError e = grad_error(got, want, name);
  const GradError n = grad_error(naive_got, want, name + " (naive)");
  EXPECT_EQ(e.problem, "");
  ASSERT_EQ(terms.size(), got.size()) << name;
  const double rounding = std::is_same_v<T, float> ? 0.0 : unit_roundoff<T>() * e.magnitude;
  const double base = 3.0 * std::max(n.max_error, rounding) + 2e-4 * e.magnitude;
  const double floor_unit = std::is_same_v<T, float> ? 0x1p-24 : unit_roundoff<T>();
  std::size_t worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    const double bound = base + 8.0 * floor_unit * terms[i];
    const double ratio = std::abs(static_cast<double>(got[i]) - want[i]) / bound;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT_LE(worst_ratio, 1.0) << name << "[" << worst << "] = " << got[worst] << ", reference " << want[worst]
                              << ": naive " << n.max_error << ", magnitude " << e.magnitude << ", terms " << terms[worst];
  EXPECT_GT(e.magnitude, 0.0) << name << " is all zeros: the check cannot fail";
}

/// Q and K of p made integers in [-16, 16] (exact in every type), and the softmax scale
/// that takes the largest |q . k| to `magnitude`: near one-hot rows whose LSE is about
/// `magnitude`, where a float LSE's rounding (|LSE| 2^-24) breaks the rule if P is
/// recomputed from it.
template <class T>
float large_score_inputs(BackwardProblem<T>& p, double magnitude, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(-16, 16);
  for (auto* x : {&p.q, &p.k})
    for (T& e : *x) e = from_float<T>(static_cast<float>(pick(rng)));
  const ProblemShape& s = p.s;
  const index_t group = s.heads / s.heads_kv;
  double max_dot = 0.0;
  for_each_index(p.qv.shape, [&](index_t b, index_t i, index_t h, index_t) {
    for (index_t j = 0; j < s.seqlen_k; ++j) {
      double dot = 0.0;
      for (index_t c = 0; c < s.head_dim; ++c)
        dot += double(to_float(p.qv(b, i, h, c))) * to_float(p.kv(b, j, h / group, c));
      max_dot = std::max(max_dot, std::abs(dot));
    }
  });
  return static_cast<float>(magnitude / max_dot);
}

}  // namespace tileattn::test
