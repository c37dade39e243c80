// tests/kernels/dropout_test.cpp: attention dropout (DropoutOptions), against
// reference/dropout_reference.hpp's Philox written independently of the kernels':
//   - Philox 4x32-10's published known answers (both generators);
//   - every compiled micro-kernel set's keep bits and their application, bit for bit;
//   - every kept / dropped decision of the forward (read off O with V = I), the keep rate
//     within its binomial bound, and the same decisions for every backend, thread count,
//     budget and storage type;
//   - forward and backward against the double reference (FlashAttention's rule in bf16),
//     and the gradients by finite differences of the reference with the mask fixed;
//   - varlen and flex, the NaN semantics (a dropped key is still seen), and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/dropout_reference.hpp"
#include "reference/naive_backward.hpp"
#include "support/backward_rule.hpp"
#include "support/backward_support.hpp"
#include "support/expect_throw_naming.hpp"
#include "support/naive_same_precision.hpp"
#include "support/test_support.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

using Words = std::array<std::uint32_t, 4>;

struct KnownAnswer {
  Words counter;
  std::array<std::uint32_t, 2> key;
  Words out;
};
// Random123's kat_vectors, philox4x32 10.
constexpr KnownAnswer known_answers[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, KnownAnswers) {
  for (const KnownAnswer& a : known_answers) {
    EXPECT_EQ(arch::philox4x32_10(a.counter, a.key[0], a.key[1]), a.out);
    EXPECT_EQ(reference::philox(a.counter, a.key), a.out);
  }
}

/// One micro-kernel set's dropout functions.
struct KeepBitsSet {
  const char* name;
  void (*keep_bits)(const arch::DropoutRow*, index_t, index_t, index_t, std::uint64_t*, index_t);
  void (*apply_floats)(float*, index_t, const std::uint64_t*, index_t, float);
  void (*apply_pairs)(bf16x2*, index_t, const std::uint64_t*, index_t);
};

/// Every set this binary compiles, by name (the scalar generic one, and the vector ones its
/// target flags enable), and arch::native (a dispatched build's choice).
std::vector<KeepBitsSet> keep_bits_sets() {
  std::vector<KeepBitsSet> sets{
      {"generic", &arch::generic::dropout_keep_bits, &arch::generic::apply_keep_bits, &arch::generic::apply_keep_bits}};
#if defined(__AVX2__) && defined(__FMA__)
  sets.push_back({"avx2", &arch::avx2::dropout_keep_bits, &arch::avx2::apply_keep_bits, &arch::avx2::apply_keep_bits});
#endif
#if defined(__AVX512F__)
  sets.push_back(
      {"avx512", &arch::avx512::dropout_keep_bits, &arch::avx512::apply_keep_bits, &arch::avx512::apply_keep_bits});
#endif
  sets.push_back({"native", &arch::native::dropout_keep_bits, &arch::native::apply_keep_bits,
                  &arch::native::apply_keep_bits});
  return sets;
}

TEST(Dropout, KeepBitsOfEverySetAreTheReferencesDecisions) {
  for (const KeepBitsSet& set : keep_bits_sets()) {
    SCOPED_TRACE(set.name);
    std::mt19937_64 rng(7);
    for (int trial = 0; trial < 40; ++trial) {
      DropoutOptions d{std::uniform_real_distribution<float>(0.0f, 0.99f)(rng), rng(), rng() % (1ull << 32)};
      if (trial == 0) d.p = 0.5f / 256;  // a threshold that rounds half up
      if (trial == 2) d.p = 0.999f;    // the largest threshold, 255
      const auto query = static_cast<std::int64_t>(rng() % 100000), head = static_cast<std::int64_t>(rng() % 7);
      const auto sequence = static_cast<std::int64_t>(rng() % 5);
      const auto block = static_cast<index_t>(rng() % 1000), blocks = static_cast<index_t>(1 + rng() % 4);
      if (trial % 2) {  // a threshold equal to one of the numbers made: the boundary itself
        const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(blocks * 128));
        d.p = static_cast<float>(reference::dropout_number(d, sequence, 7, head, query, block * 128 + j)) / 256.0f;
      }
      const ops::Dropout dropout(d, sequence, 7);
      std::vector<std::uint64_t> bits(static_cast<std::size_t>(2 * blocks + 1), 0);
      const arch::DropoutRow stream = dropout.row(head, query);
      set.keep_bits(&stream, 1, block, blocks, bits.data(), 0);
      for (index_t j = 0; j < blocks * 128; ++j) {
        const bool kept = (bits[static_cast<std::size_t>(j / 64)] >> (j % 64)) & 1u;
        ASSERT_EQ(kept, reference::dropout_keeps(d, sequence, 7, head, query, block * 128 + j))
            << "trial " << trial << " key " << j;
      }
      // Several rows at once (the vector sets take two (row, block) items at a time).
      const index_t rows = 1 + static_cast<index_t>(trial % 3), ld = 2 * blocks + 3;
      std::vector<arch::DropoutRow> streams;
      for (index_t r = 0; r < rows; ++r) streams.push_back(dropout.row(head + r, query + 3 * r));
      std::vector<std::uint64_t> many(static_cast<std::size_t>(rows * ld), 0);
      set.keep_bits(streams.data(), rows, block, blocks, many.data(), ld);
      for (index_t r = 0; r < rows; ++r)
        for (index_t j = 0; j < blocks * 128; ++j)
          ASSERT_EQ((many[static_cast<std::size_t>(r * ld + j / 64)] >> (j % 64)) & 1u,
                    reference::dropout_keeps(d, sequence, 7, head + r, query + 3 * r, block * 128 + j))
              << "trial " << trial << " row " << r << " key " << j;
      // Applied to a row of floats and of bf16 pairs from an odd bit on.
      const index_t bit0 = static_cast<index_t>(rng() % 64), n = std::min<index_t>(blocks * 128 - bit0, 77);
      // Every 5th entry NaN and every 7th Inf: dropout multiplies, so a dropped one is NaN.
      const auto input = [](index_t j) {
        return j % 5 == 3 ? std::numeric_limits<float>::quiet_NaN() : j % 7 == 4 ? std::numeric_limits<float>::infinity() : 1.5f;
      };
      std::vector<float> x(static_cast<std::size_t>(n) + 3, 1.5f);
      std::vector<bf16x2> pairs(static_cast<std::size_t>(n + 1) / 2 + 2, bf16x2{from_float<bf16>(1.5f), from_float<bf16>(1.5f)});
      for (index_t j = 0; j < n; ++j) {
        x[static_cast<std::size_t>(j)] = input(j);
        bf16x2& pair = pairs[static_cast<std::size_t>(j / 2)];
        (j % 2 ? pair.hi : pair.lo) = from_float<bf16>(input(j));
      }
      set.apply_floats(x.data(), n, bits.data(), bit0, 2.0f);
      set.apply_pairs(pairs.data(), n, bits.data(), bit0);
      for (index_t j = 0; j < n; ++j) {
        const bool kept = reference::dropout_keeps(d, sequence, 7, head, query, block * 128 + bit0 + j);
        const float want = kept ? input(j) * 2.0f : input(j) * 0.0f;  // NaN stays NaN
        const float got = x[static_cast<std::size_t>(j)];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << j << " kept " << kept;
        } else {
          EXPECT_EQ(got, want) << j;
        }
        if (!std::isnan(got)) {
          EXPECT_FALSE(std::signbit(got)) << j;  // a dropped probability is +0
        }
        const bf16x2 pair = pairs[static_cast<std::size_t>(j / 2)];
        const float half = to_float(j % 2 ? pair.hi : pair.lo), half_want = kept ? input(j) : input(j) * 0.0f;
        if (std::isnan(half_want)) {
          EXPECT_TRUE(std::isnan(half)) << j << " kept " << kept;
        } else {
          EXPECT_EQ(half, half_want) << j;
        }
      }
      for (std::size_t j = static_cast<std::size_t>(n); j < x.size(); ++j) EXPECT_EQ(x[j], 1.5f) << "past n";
      if (n % 2) {
        EXPECT_EQ(to_float(pairs[static_cast<std::size_t>(n / 2)].hi), 1.5f) << "past n";
      }
    }
  }
}

/// A problem whose O shows dropout's decisions: V = I (seqlen_k = head_dim_v), so
/// O[i, h, j] = P[i, j] Z[i, j] / (1 - p) / sum, nonzero exactly where key j is kept and seen.
template <class T>
struct IdentityValues {
  index_t batch, nq, nk, heads, heads_kv;
  std::vector<T> q, k, v, o;
  IdentityValues(index_t b, index_t n_q, index_t n_k, index_t h, index_t h_kv, std::uint64_t seed)
      : batch(b), nq(n_q), nk(n_k), heads(h), heads_kv(h_kv) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const index_t d = 16;
    q.resize(static_cast<std::size_t>(b * n_q * h * d));
    k.resize(static_cast<std::size_t>(b * n_k * h_kv * d));
    for (T& x : q) x = from_float<T>(normal(rng));
    for (T& x : k) x = from_float<T>(normal(rng));
    v.assign(static_cast<std::size_t>(b * n_k * h_kv * n_k), from_float<T>(0.0f));
    for (index_t bb = 0; bb < b; ++bb)
      for (index_t j = 0; j < n_k; ++j)
        for (index_t g = 0; g < h_kv; ++g) v[static_cast<std::size_t>(((bb * n_k + j) * h_kv + g) * n_k + j)] = from_float<T>(1.0f);
    o.assign(static_cast<std::size_t>(b * n_q * h * n_k), from_float<T>(sentinel));
  }
  void run(const ForwardOptions& opts) {
    forward(make_bshd<const T>(q.data(), batch, nq, heads, 16), make_bshd<const T>(k.data(), batch, nk, heads_kv, 16),
            make_bshd<const T>(v.data(), batch, nk, heads_kv, nk), make_bshd(o.data(), batch, nq, heads, nk), opts);
  }
  float out(index_t b, index_t i, index_t h, index_t j) const {
    return to_float(o[static_cast<std::size_t>(((b * nq + i) * heads + h) * nk + j)]);
  }
};

/// Every decision of a forward over V = I equals the reference's, where the row sees the key.
template <class T>
void expect_decisions(const ForwardOptions& opts, std::uint64_t seed, std::int64_t* kept = nullptr,
                      std::int64_t* seen = nullptr) {
  IdentityValues<T> p(2, 127, 200, 4, 2, seed);
  p.run(opts);
  const index_t offset = p.nk - p.nq;
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads; ++h)
      for (index_t i = 0; i < p.nq; ++i)
        for (index_t j = 0; j < p.nk; ++j) {
          const float x = p.out(b, i, h, j);
          if (opts.causal && j > i + offset) {
            ASSERT_EQ(x, 0.0f);
            continue;
          }
          const bool keeps = reference::dropout_keeps(opts.dropout, b, p.heads, h, i, j);
          ASSERT_EQ(x != 0.0f, keeps) << "b " << b << " h " << h << " i " << i << " j " << j;
          if (kept) *kept += keeps;
          if (seen) ++*seen;
        }
}

TEST(Dropout, EveryDecisionOfTheForwardIsTheReferences) {
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(p);
    ForwardOptions opts;
    opts.dropout = {p, 0x123456789abcdefull, 3};
    opts.softmax_scale = 0.05f;  // P well above 0 everywhere
    expect_decisions<float>(opts, 1);
    expect_decisions<bf16>(opts, 1);
    opts.causal = true;
    expect_decisions<float>(opts, 2);
  }
}

TEST(Dropout, KeepRateIsWithinItsBinomialBound) {
  for (const float p : {0.1f, 0.25f, 0.5f, 0.9f}) {
    std::int64_t kept = 0, seen = 0;
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      ForwardOptions opts;
      opts.dropout = {p, 1000 + seed, seed};
      opts.softmax_scale = 0.05f;
      expect_decisions<float>(opts, seed, &kept, &seen);
    }
    const double keep = 1.0 - std::round(p * 256.0) / 256.0;
    const double sigma = std::sqrt(keep * (1 - keep) / static_cast<double>(seen));
    const double rate = static_cast<double>(kept) / static_cast<double>(seen);
    EXPECT_LE(std::abs(rate - keep), 5 * sigma) << "p " << p << ": kept " << kept << " of " << seen;
  }
}

TEST(Dropout, DecisionsChangeWithSeedAndOffset) {
  ForwardOptions a;
  a.dropout = {0.5f, 1, 0};
  a.softmax_scale = 0.05f;
  IdentityValues<float> x(1, 17, 200, 2, 1, 3), y = x, z = x;
  x.run(a);
  ForwardOptions b = a;
  b.dropout.seed = 2;
  y.run(b);
  ForwardOptions c = a;
  c.dropout.offset = 1;
  z.run(c);
  const auto differing = [](const IdentityValues<float>& u, const IdentityValues<float>& w) {
    index_t n = 0;
    for (std::size_t e = 0; e < u.o.size(); ++e) n += (u.o[e] != 0.0f) != (w.o[e] != 0.0f);
    return n;
  };
  EXPECT_GT(differing(x, y), static_cast<index_t>(x.o.size() / 4));
  EXPECT_GT(differing(x, z), static_cast<index_t>(x.o.size() / 4));
}

/// The values of a view as floats in its [B, S, H, D] order, and a contiguous view of them.
struct Floats {
  std::vector<float> x;
  TensorView<const float> view;
  template <class T>
  explicit Floats(const TensorView<T>& v) {
    for_each_index(v.shape, [&](index_t b, index_t i, index_t h, index_t d) { x.push_back(to_float(v(b, i, h, d))); });
    view = make_bshd<const float>(x.data(), v.shape[0], v.shape[1], v.shape[2], v.shape[3]);
  }
};

template <class T>
void expect_forward_matches_reference(ProblemShape s, ForwardOptions opts, std::uint64_t seed) {
  BackwardProblem<T> prob(s, seed);
  prob.forward(opts);
  const reference::Options ro = reference::Options::from(opts);
  const Floats q(prob.qv), k(prob.kv), v(prob.vv);
  const reference::AttentionResult ref = reference::attention<float>(q.view, k.view, v.view, ro);
  double worst = 0.0;
  for_each_index(prob.ov.shape, [&](index_t b, index_t i, index_t h, index_t d) {
    worst = std::max(worst, std::abs(static_cast<double>(to_float(prob.ov(b, i, h, d))) - ref.out(b, i, h, d)));
  });
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.heads; ++h)
      for (index_t i = 0; i < s.seqlen_q; ++i) {  // the undropped softmax's (-inf: a row that sees no key)
        const double got = prob.lse[static_cast<std::size_t>((b * s.heads + h) * s.seqlen_q + i)];
        if (std::isinf(ref.log_sum_exp(b, h, i))) EXPECT_EQ(got, ref.log_sum_exp(b, h, i));
        else EXPECT_NEAR(got, ref.log_sum_exp(b, h, i), forward_lse_tolerance);
      }
  if constexpr (std::is_same_v<T, float>) {
    EXPECT_LE(worst, forward_o_tolerance) << "dropout " << opts.dropout.p;
  } else {  // FlashAttention's rule: at most 2x a naive same-precision implementation's error
    std::vector<float> on(prob.o.size()), ln(prob.lse.size());
    const TensorView<float> onv = make_bshd(on.data(), s.batch, s.seqlen_q, s.heads, s.head_dim_v);
    naive_same_precision<T>(q.view, k.view, v.view, ro, onv, make_lse(ln.data(), s.batch, s.heads, s.seqlen_q));
    double naive = 0.0;
    for_each_index(onv.shape, [&](index_t b, index_t i, index_t h, index_t d) {
      naive = std::max(naive, std::abs(static_cast<double>(onv(b, i, h, d)) - ref.out(b, i, h, d)));
    });
    EXPECT_LE(worst, 2 * naive + 1e-5) << "naive " << naive;
  }
}

TEST(Dropout, ForwardMatchesTheReferenceOnAwkwardShapes) {
  const ProblemShape shapes[] = {{1, 1, 1, 1, 1, 32, 32},      {2, 17, 127, 4, 2, 64, 64},
                                 {1, 127, 17, 3, 1, 40, 24},   {1, 1000, 1000, 2, 1, 64, 64},
                                 {3, 64, 300, 2, 2, 128, 128}, {1, 200, 1, 2, 2, 16, 16}};
  std::uint64_t seed = 10;
  for (const ProblemShape& s : shapes)
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << s.seqlen_q << "x" << s.seqlen_k << " causal " << causal);
      ForwardOptions opts;
      opts.causal = causal;
      opts.dropout = {0.17f, 99 + seed, seed};
      expect_forward_matches_reference<float>(s, opts, ++seed);
      expect_forward_matches_reference<bf16>(s, opts, ++seed);
      opts.window_left = 30;
      opts.softcap = 5.0f;
      expect_forward_matches_reference<float>(s, opts, ++seed);
    }
}

template <class T>
void expect_backward_within_rule(ProblemShape s, BackwardOptions opts, std::uint64_t seed) {
  BackwardProblem<T> prob(s, seed);
  prob.forward(opts);
  prob.backward(opts);
  const reference::Options ro = reference::Options::from(opts);
  const reference::BackwardResult ref = prob.reference(ro);
  const reference::NaiveBackwardF naive = prob.naive(ro);
  expect_within_rule<T>(prob.grad_q(), ref.dq, naive.dq, "dq");
  expect_within_rule<T>(prob.grad_k(), ref.dk, naive.dk, "dk");
  expect_within_rule<T>(prob.grad_v(), ref.dv, naive.dv, "dv");
}

TEST(Dropout, BackwardMatchesTheReference) {
  const ProblemShape shapes[] = {{1, 1, 3, 1, 1, 32, 32}, {2, 17, 127, 4, 2, 64, 64}, {1, 127, 17, 3, 1, 40, 24},
                                 {1, 300, 300, 2, 1, 64, 32}};
  std::uint64_t seed = 40;
  for (const ProblemShape& s : shapes)
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << s.seqlen_q << "x" << s.seqlen_k << " causal " << causal);
      BackwardOptions opts;
      opts.causal = causal;
      opts.dropout = {0.3f, 5 + seed, seed};
      expect_backward_within_rule<float>(s, opts, ++seed);
      expect_backward_within_rule<bf16>(s, opts, ++seed);
      opts.softcap = 4.0f;
      expect_backward_within_rule<float>(s, opts, ++seed);
    }
}

TEST(Dropout, GradientsAreTheFiniteDifferencesWithTheMaskFixed) {
  const ProblemShape s{1, 9, 13, 2, 1, 8, 8};
  BackwardProblem<float> prob(s, 77);
  BackwardOptions opts;
  opts.dropout = {0.4f, 1234, 5};
  prob.forward(opts);
  prob.backward(opts);
  reference::Options ro = reference::Options::from(opts);
  // L = sum(dO * O) through the double reference (its own generator, the same mask).
  const auto loss = [&] {
    const auto c = [](const TensorView<float>& v) { return TensorView<const float>(v); };
    const auto r = reference::attention<float>(c(prob.qv), c(prob.kv), c(prob.vv), ro);
    double l = 0.0;
    for_each_index(prob.dov.shape, [&](index_t b, index_t i, index_t h, index_t d) {
      l += static_cast<double>(prob.dov(b, i, h, d)) * r.out(b, i, h, d);
    });
    return l;
  };
  const auto check = [&](const TensorView<float>& x, const std::vector<float>& grad, const char* name) {
    std::vector<float> fd;
    for_each_index(x.shape, [&](index_t b, index_t i, index_t h, index_t d) {
      float& e = x(b, i, h, d);
      const float saved = e, step = 1e-2f;
      e = saved + step;
      const double up = loss();
      e = saved - step;
      const double down = loss();
      e = saved;
      fd.push_back(static_cast<float>((up - down) / (2.0 * static_cast<double>(step))));
    });
    ASSERT_EQ(fd.size(), grad.size());
    double worst = 0.0, magnitude = 0.0;
    for (std::size_t e = 0; e < fd.size(); ++e) {
      worst = std::max(worst, static_cast<double>(std::abs(fd[e] - grad[e])));
      magnitude = std::max(magnitude, static_cast<double>(std::abs(fd[e])));
    }
    EXPECT_LE(worst, 2e-3 * std::max(magnitude, 1.0)) << name << ", magnitude " << magnitude;
    EXPECT_GT(magnitude, 0.01) << name;
  };
  check(prob.qv, prob.grad_q(), "dq");
  check(prob.kv, prob.grad_k(), "dk");
  check(prob.vv, prob.grad_v(), "dv");
}

TEST(Dropout, SameBitsForEveryBackendThreadCountAndBudget) {
  const ProblemShape s{2, 150, 260, 4, 2, 64, 64};
  std::vector<float> o0, dq0, dk0, dv0;
  for (const Backend backend : compiled_backends())
    for (const int threads : {1, 2, 3})
      for (const std::size_t budget : {std::size_t{0}, rows_budget(16, 64), rows_budget(48, 64) + 4096}) {
        SCOPED_TRACE(testing::Message() << to_string(backend) << " threads " << threads << " budget " << budget);
        BackwardProblem<float> prob(s, 5);
        BackwardOptions opts;
        opts.causal = true;
        opts.dropout = {0.2f, 42, 7};
        opts.execution = {backend, threads};
        opts.sram_budget_bytes = budget;
        prob.forward(opts);
        prob.backward(opts);
        const auto o = BackwardProblem<float>::gather(prob.ov);
        if (o0.empty()) {
          o0 = o;
          dq0 = prob.grad_q();
          dk0 = prob.grad_k();
          dv0 = prob.grad_v();
          continue;
        }
        EXPECT_TRUE(bitwise_equal(o, o0));
        EXPECT_TRUE(bitwise_equal(prob.grad_q(), dq0));
        EXPECT_TRUE(bitwise_equal(prob.grad_k(), dk0));
        EXPECT_TRUE(bitwise_equal(prob.grad_v(), dv0));
      }
}

TEST(Dropout, VarlenSequencesDrawTheirOwnStreams) {
  const std::vector<std::int32_t> cu_q{0, 17, 17, 144}, cu_k{0, 40, 41, 241};
  const index_t heads = 2, d = 32, total_q = cu_q.back(), total_k = cu_k.back();
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(total_q * heads * d)), k(static_cast<std::size_t>(total_k * heads * d)),
      v(k.size()), o(q.size(), sentinel);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  ForwardOptions opts;
  opts.causal = true;
  opts.dropout = {0.3f, 8, 1};
  forward_varlen(make_thd<const float>(q.data(), total_q, heads, d), make_thd<const float>(k.data(), total_k, heads, d),
                 make_thd<const float>(v.data(), total_k, heads, d), make_thd(o.data(), total_q, heads, d),
                 PackedLseView{}, VarlenSequences{cu_q, cu_k, 127, 200}, opts);
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const index_t nq = cu_q[b + 1] - cu_q[b], nk = cu_k[b + 1] - cu_k[b];
    if (nq == 0) continue;
    reference::Options ro = reference::Options::from(opts);
    ro.batch_index = static_cast<index_t>(b);
    const auto at = [&](const std::vector<float>& x, index_t start, index_t n) {
      return TensorView<const float>{x.data() + start * heads * d, {1, n, heads, d}, {0, heads * d, d, 1}};
    };
    const auto ref = reference::attention<float>(at(q, cu_q[b], nq), at(k, cu_k[b], nk), at(v, cu_k[b], nk), ro);
    for (index_t i = 0; i < nq; ++i)
      for (index_t h = 0; h < heads; ++h)
        for (index_t c = 0; c < d; ++c)
          ASSERT_NEAR(o[static_cast<std::size_t>(((cu_q[b] + i) * heads + h) * d + c)], ref.out(0, i, h, c),
                      forward_o_tolerance)
              << "sequence " << b;
  }
}

TEST(Dropout, FlexTakesItAsTheBuiltinMasksDo) {
  const ProblemShape s{2, 100, 140, 2, 1, 32, 32};
  BackwardProblem<float> a(s, 21), b(s, 21);
  BackwardOptions opts;
  opts.dropout = {0.25f, 77, 2};
  const auto c = [](const TensorView<float>& v) { return TensorView<const float>(v); };
  forward_flex(c(b.qv), c(b.kv), c(b.vv), b.ov, b.lse_view(), flex::no_score_mod{}, flex::causal{}, opts);
  opts.causal = true;
  opts.alignment = MaskAlignment::top_left;  // flex::causal: q_idx >= kv_idx
  a.forward(opts);
  EXPECT_TRUE(bitwise_equal(BackwardProblem<float>::gather(a.ov), BackwardProblem<float>::gather(b.ov)));
  a.backward(opts);
  opts.causal = false;
  backward_flex(c(b.qv), c(b.kv), c(b.vv), c(b.ov), b.lse_view(), c(b.dov), b.dqv, b.dkv, b.dvv, flex::no_score_mod{},
                flex::causal{}, opts);
  EXPECT_TRUE(bitwise_equal(a.grad_q(), b.grad_q()));
  EXPECT_TRUE(bitwise_equal(a.grad_k(), b.grad_k()));
  EXPECT_TRUE(bitwise_equal(a.grad_v(), b.grad_v()));
}

TEST(Dropout, ADroppedKeysInfiniteValueStillReachesTheRowsThatSeeIt) {
  const ProblemShape s{1, 20, 30, 1, 1, 16, 16};
  BackwardProblem<float> prob(s, 31);
  ForwardOptions opts;
  opts.causal = true;
  opts.alignment = MaskAlignment::top_left;
  opts.dropout = {0.5f, 3, 0};
  const index_t key = 12;
  prob.vv(0, key, 0, 5) = std::numeric_limits<float>::infinity();
  prob.forward(opts);
  bool some_dropped = false;
  for (index_t i = 0; i < s.seqlen_q; ++i) {
    const bool sees = i >= key;
    some_dropped = some_dropped || (sees && !reference::dropout_keeps(opts.dropout, 0, 1, 0, i, key));
    const float x = prob.ov(0, i, 0, 5);  // Inf where kept, 0 * Inf = NaN where dropped
    if (!sees) EXPECT_TRUE(std::isfinite(x)) << "row " << i;
    else if (reference::dropout_keeps(opts.dropout, 0, 1, 0, i, key)) EXPECT_TRUE(std::isinf(x)) << "row " << i;
    else EXPECT_TRUE(std::isnan(x)) << "row " << i;
  }
  EXPECT_TRUE(some_dropped);  // the case the test is about occurs
}

/// dV of a backward with dropout `opts` whose query `row` of head 1 holds a NaN.
template <class T>
std::vector<float> dv_with_a_nan_query(const ProblemShape& s, const BackwardOptions& opts, index_t row) {
  BackwardProblem<T> prob(s, 41);
  prob.qv(0, row, 1, 3) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  prob.forward(opts);
  prob.backward(opts);
  return prob.grad_v();
}

// A row that sees a NaN makes the dV of every key it sees NaN, dropped there or not:
// dropout multiplies P by 0 (as PyTorch's does), it does not mask (a CI fuzzer finding:
// dV was 0 where the row's NaN P was dropped).
TEST(Dropout, ARowThatSeesANaNMakesTheDVOfEveryKeyItSeesNaNDroppedOrNot) {
  const ProblemShape s{1, 20, 30, 2, 1, 16, 8};
  for (const bool half : {false, true}) {
    SCOPED_TRACE(half ? "bf16" : "float");
    BackwardOptions opts;
    opts.causal = true;
    opts.alignment = MaskAlignment::top_left;
    opts.dropout = {0.5f, 3, 0};
    const index_t row = 9;  // sees keys 0..9 (head 1)
    bool some_dropped = false;
    for (index_t j = 0; j <= row; ++j) some_dropped = some_dropped || !reference::dropout_keeps(opts.dropout, 0, 2, 1, row, j);
    ASSERT_TRUE(some_dropped);  // the case the test is about occurs
    const auto check = [&](const std::vector<float>& dv) {
      for (index_t j = 0; j < s.seqlen_k; ++j)
        for (index_t c = 0; c < s.head_dim_v; ++c) {
          const float x = dv[static_cast<std::size_t>(j * s.head_dim_v + c)];
          if (j <= row) {
            EXPECT_TRUE(std::isnan(x)) << "key " << j << " dropped " << !reference::dropout_keeps(opts.dropout, 0, 2, 1, row, j);
          } else {
            EXPECT_TRUE(std::isfinite(x)) << "key " << j;
          }
        }
    };
    check(half ? dv_with_a_nan_query<bf16>(s, opts, row) : dv_with_a_nan_query<float>(s, opts, row));
  }
}

TEST(Dropout, BadOptionsThrowNamingThemAndWriteNothing) {
  const ProblemShape s{1, 8, 8, 2, 1, 16, 16};
  for (const auto& [d, name] : {std::pair{DropoutOptions{-0.1f}, "dropout.p"}, std::pair{DropoutOptions{1.0f}, "dropout.p"},
                                std::pair{DropoutOptions{std::nanf("")}, "dropout.p"},
                                std::pair{DropoutOptions{0.1f, 0, std::uint64_t{1} << 32}, "dropout.offset"}}) {
    BackwardProblem<float> prob(s, 1);
    std::fill(prob.o.begin(), prob.o.end(), sentinel);
    ForwardOptions opts;
    opts.dropout = d;
    EXPECT_THROW_NAMING(prob.forward(opts), name);
    EXPECT_TRUE(all_equal(prob.o, sentinel));
    BackwardOptions bopts(opts);
    std::fill(prob.dq.begin(), prob.dq.end(), sentinel);
    EXPECT_THROW_NAMING(prob.backward(bopts), name);
    EXPECT_TRUE(all_equal(prob.dq, sentinel));
  }
}

TEST(Dropout, ThePagedCallsRefuseIt) {
  std::vector<float> pool(static_cast<std::size_t>(2 * 16 * 16), 0.5f), q(16, 0.25f), o(16, sentinel);
  const std::vector<std::int32_t> table{0, 1}, seqlens{20};
  const auto pages = make_bshd<const float>(pool.data(), 2, 16, 1, 16);
  PagedOptions opts;
  opts.dropout.p = 0.1f;
  EXPECT_THROW_NAMING(forward_paged(make_bshd<const float>(q.data(), 1, 1, 1, 16), pages, pages,
                                    BlockTableView{table.data(), {1, 2}, {2, 1}}, seqlens,
                                    make_bshd(o.data(), 1, 1, 1, 16), opts),
                      "dropout.p");
  EXPECT_TRUE(all_equal(o, sentinel));
}

}  // namespace
}  // namespace tileattn::test
