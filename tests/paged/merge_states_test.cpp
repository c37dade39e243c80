// tests/paged/merge_states_test.cpp: tileattn::merge_states (paged.hpp, kernels/merge.hpp,
// ops/merge_states.hpp). The keys of a random problem are cut into 2 and 5 disjoint
// contiguous parts, forward() runs on each, and the merge of the parts' (O, LSE) must be
// the one-shot forward over all keys (float: within 2e-6; bf16/fp16: within a few ulps of
// the type). Then the edge rows (a part a row sees nothing of, every part empty, a NaN LSE),
// in-place merging, order and determinism, and every bad argument.
#include <gtest/gtest.h>

#include <functional>

#include "support/test_support.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::test {
namespace {

constexpr float minus_inf = -std::numeric_limits<float>::infinity();
constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();

bool is_minus_inf(float x) { return std::isinf(x) && x < 0; }

/// The forwards that make the test data run serially: the test stays fast on a loaded machine.
constexpr Execution serial{Backend::serial, 1};

template <class V>
bool same_bits(const V& a, const V& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

/// A [batch, seqlen, heads, dim] tensor of T (contiguous) and its views.
template <class T>
struct Tensor {
  index_t batch, seqlen, heads, dim;
  std::vector<T> data;
  Tensor(index_t b, index_t s, index_t h, index_t d, float fill = sentinel)
      : batch(b), seqlen(s), heads(h), dim(d), data(static_cast<std::size_t>(b * s * h * d), T(fill)) {}
  TensorView<T> view() { return make_bshd(data.data(), batch, seqlen, heads, dim); }
  TensorView<const T> cview() const { return make_bshd(data.data(), batch, seqlen, heads, dim); }
  /// Rows [s0, s1) of the sequence dimension (the batch stride stays the full tensor's).
  TensorView<const T> rows(index_t s0, index_t s1) const {
    return {data.data() + s0 * heads * dim, {batch, s1 - s0, heads, dim}, {seqlen * heads * dim, heads * dim, dim, 1}};
  }
  void fill_normal(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (T& x : data) x = T(normal(rng));
  }
};

/// An LSE [batch, heads, seqlen].
struct Lse {
  index_t batch, heads, seqlen;
  std::vector<float> data;
  Lse(index_t b, index_t h, index_t s, float fill = sentinel)
      : batch(b), heads(h), seqlen(s), data(static_cast<std::size_t>(b * h * s), fill) {}
  LseView view() { return make_lse(data.data(), batch, heads, seqlen); }
  StridedView<const float, 3> cview() const { return {data.data(), {batch, heads, seqlen}, {heads * seqlen, seqlen, 1}}; }
  float& at(index_t b, index_t h, index_t i) { return data[static_cast<std::size_t>((b * heads + h) * seqlen + i)]; }
};

struct Problem {
  index_t batch = 2, seqlen_q = 17, seqlen_k = 100, heads = 3, head_dim = 17;
  bool causal = false;
};

/// A random problem, its one-shot forward and the forward of each of `parts` contiguous,
/// disjoint key ranges (as even as possible). A part with no keys (seqlen_k < parts) is a
/// state that saw nothing: LSE -inf and an O of NaNs, which must not be read. With causal,
/// the parts see the one-shot's bottom-right causal mask through a boolean mask.
template <class T>
struct SplitProblem {
  Problem p;
  Tensor<T> q, k, v, full_o;
  Lse full_lse;
  std::vector<Tensor<T>> part_o;
  std::vector<Lse> part_lse;
  std::vector<std::uint8_t> mask_storage;  // [seqlen_q, seqlen_k] bools

  SplitProblem(const Problem& pr, index_t parts, std::uint64_t seed)
      : p(pr),
        q(pr.batch, pr.seqlen_q, pr.heads, pr.head_dim),
        k(pr.batch, pr.seqlen_k, pr.heads, pr.head_dim),
        v(pr.batch, pr.seqlen_k, pr.heads, pr.head_dim),
        full_o(pr.batch, pr.seqlen_q, pr.heads, pr.head_dim),
        full_lse(pr.batch, pr.heads, pr.seqlen_q) {
    q.fill_normal(seed);
    k.fill_normal(seed + 1);
    v.fill_normal(seed + 2);
    ForwardOptions full_opt;
    full_opt.causal = p.causal;
    full_opt.execution = serial;
    forward(q.cview(), k.cview(), v.cview(), full_o.view(), full_lse.view(), full_opt);
    const index_t nq = p.seqlen_q, nk = p.seqlen_k;
    mask_storage.resize(static_cast<std::size_t>(nq * nk));
    for (index_t i = 0; i < nq; ++i)
      for (index_t j = 0; j < nk; ++j) mask_storage[static_cast<std::size_t>(i * nk + j)] = j <= i + nk - nq;
    const bool* mask = reinterpret_cast<const bool*>(mask_storage.data());
    for (index_t c = 0; c < parts; ++c) {
      const index_t k0 = c * nk / parts, k1 = (c + 1) * nk / parts;
      auto& o = part_o.emplace_back(p.batch, nq, p.heads, p.head_dim, quiet_nan);
      auto& lse = part_lse.emplace_back(p.batch, p.heads, nq, minus_inf);
      if (k0 == k1) continue;  // saw no key
      ForwardOptions opt;
      opt.execution = serial;
      if (p.causal) opt.mask = {mask + k0, {1, 1, nq, k1 - k0}, {0, 0, nk, 1}};
      forward(q.cview(), k.rows(k0, k1), v.rows(k0, k1), o.view(), lse.view(), opt);
    }
  }

  std::vector<TensorView<const T>> states() const {
    std::vector<TensorView<const T>> s;
    for (const auto& o : part_o) s.push_back(o.cview());
    return s;
  }
  std::vector<StridedView<const float, 3>> lses() const {
    std::vector<StridedView<const float, 3>> s;
    for (const auto& l : part_lse) s.push_back(l.cview());
    return s;
  }
};

/// Max |a - b| over O and over the LSE, with -inf == -inf and NaN == NaN counted equal
/// and any other mismatch of non-finite values counted as infinite.
template <class T>
std::pair<double, double> max_difference(const Tensor<T>& o, const Lse& lse, const Tensor<T>& o_ref, const Lse& lse_ref,
                                         bool relative_to_one = false) {
  const auto diff = [&](double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0.0 : INFINITY;
    if (std::isinf(a) || std::isinf(b)) return a == b ? 0.0 : INFINITY;
    return std::abs(a - b) / (relative_to_one ? std::max(std::abs(b), 1.0) : 1.0);
  };
  double d_o = 0.0, d_lse = 0.0;
  for (std::size_t i = 0; i < o.data.size(); ++i) d_o = std::max(d_o, diff(to_float(o.data[i]), to_float(o_ref.data[i])));
  for (std::size_t i = 0; i < lse.data.size(); ++i) d_lse = std::max(d_lse, diff(lse.data[i], lse_ref.data[i]));
  return {d_o, d_lse};
}

// ---- Against the one-shot forward ------------------------------------------------------------

struct OneShotCase {
  index_t seqlen_q, head_dim;
  bool causal;
};

void PrintTo(const OneShotCase& c, std::ostream* os) {
  *os << "seqlen_q " << c.seqlen_q << ", head_dim " << c.head_dim << (c.causal ? ", causal" : "");
}

class MergeMatchesOneShot : public ::testing::TestWithParam<OneShotCase> {};

TEST_P(MergeMatchesOneShot, Float) {
  const OneShotCase c = GetParam();
  for (index_t nk : {1, 2, 5, 17, 100, 1000}) {
    const Problem p{2, c.seqlen_q, nk, 3, c.head_dim, c.causal};
    for (index_t parts : {2, 5}) {
      SCOPED_TRACE("seqlen_k " + std::to_string(nk) + ", parts " + std::to_string(parts));
      const SplitProblem<float> sp(p, parts, 100 + static_cast<std::uint64_t>(nk));
      Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
      Lse lse(p.batch, p.heads, p.seqlen_q);
      merge_states<float>(sp.states(), sp.lses(), o.view(), lse.view());
      const auto [d_o, d_lse] = max_difference(o, lse, sp.full_o, sp.full_lse);
      EXPECT_LE(d_o, 2e-6);
      EXPECT_LE(d_lse, 2e-6);
      if (parts == 2) {  // the two-state overload gives the same bits
        Tensor<float> o2(p.batch, p.seqlen_q, p.heads, p.head_dim);
        Lse lse2(p.batch, p.heads, p.seqlen_q);
        merge_states(sp.part_o[0].cview(), sp.part_lse[0].cview(), sp.part_o[1].cview(), sp.part_lse[1].cview(),
                     o2.view(), lse2.view());
        EXPECT_TRUE(same_bits(o.data, o2.data));
        EXPECT_TRUE(same_bits(lse.data, lse2.data));
      }
      // Without an LSE output, O is the same.
      Tensor<float> o3(p.batch, p.seqlen_q, p.heads, p.head_dim);
      merge_states<float>(sp.states(), sp.lses(), o3.view(), LseView{});
      EXPECT_TRUE(same_bits(o.data, o3.data));
    }
  }
}

template <class T>
void half_case(const OneShotCase& c) {
  const double eps = std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10;  // T's machine epsilon
  for (index_t nk : {1, 5, 100, 1000}) {
    const Problem p{2, c.seqlen_q, nk, 3, c.head_dim, c.causal};
    for (index_t parts : {2, 5}) {
      SCOPED_TRACE("seqlen_k " + std::to_string(nk) + ", parts " + std::to_string(parts));
      const SplitProblem<T> sp(p, parts, 200 + static_cast<std::uint64_t>(nk));
      Tensor<T> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
      Lse lse(p.batch, p.heads, p.seqlen_q);
      merge_states<T>(sp.states(), sp.lses(), o.view(), lse.view());
      // Each part's O is rounded to T, then the merge once more: a few ulps of T.
      const auto [d_o, d_lse] = max_difference(o, lse, sp.full_o, sp.full_lse, true);
      EXPECT_LE(d_o, 3 * eps);
      EXPECT_LE(d_lse, 4e-6);  // float, from scores of T inputs (measured: 1.6e-6)
    }
  }
}

TEST_P(MergeMatchesOneShot, Bf16) { half_case<bf16>(GetParam()); }
TEST_P(MergeMatchesOneShot, Fp16) { half_case<fp16>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, MergeMatchesOneShot,
                         ::testing::Values(OneShotCase{1, 1, false}, OneShotCase{1, 64, false},
                                           OneShotCase{17, 1, false}, OneShotCase{17, 17, false},
                                           OneShotCase{17, 64, false}, OneShotCase{17, 17, true},
                                           OneShotCase{17, 64, true}, OneShotCase{130, 17, true}),
                         [](const ::testing::TestParamInfo<OneShotCase>& info) {
                           return "q" + std::to_string(info.param.seqlen_q) + "_d" + std::to_string(info.param.head_dim) +
                                  (info.param.causal ? "_causal" : "");
                         });

// ---- Edge rows ---------------------------------------------------------------------------

TEST(MergeStates, APartARowSeesNothingOfAddsNothing) {
  // Causal, 17 queries, 40 keys in 5 parts: query i sees keys j <= i + 23, so row i sees
  // nothing of the parts that start past i + 23. Their O rows are poisoned with NaN: they
  // must not be read.
  const Problem p{2, 17, 40, 3, 17, true};
  SplitProblem<float> sp(p, 5, 7);
  index_t empty_rows = 0;
  for (std::size_t c = 0; c < sp.part_o.size(); ++c)
    for (index_t b = 0; b < p.batch; ++b)
      for (index_t h = 0; h < p.heads; ++h)
        for (index_t i = 0; i < p.seqlen_q; ++i) {
          if (!is_minus_inf(sp.part_lse[c].at(b, h, i))) continue;
          ++empty_rows;
          const auto o = sp.part_o[c].view();
          for (index_t d = 0; d < p.head_dim; ++d) {
            EXPECT_EQ(o(b, i, h, d), 0.0f) << "forward's O of a row with no key";
            o(b, i, h, d) = quiet_nan;
          }
        }
  EXPECT_GT(empty_rows, 0);
  Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse lse(p.batch, p.heads, p.seqlen_q);
  merge_states<float>(sp.states(), sp.lses(), o.view(), lse.view());
  const auto [d_o, d_lse] = max_difference(o, lse, sp.full_o, sp.full_lse);
  EXPECT_LE(d_o, 2e-6);
  EXPECT_LE(d_lse, 2e-6);
}

TEST(MergeStates, EveryPartEmptyGivesZeroAndMinusInfinity) {
  for (index_t count : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(count) + " states");
    std::vector<Tensor<float>> os;
    std::vector<Lse> ls;
    for (index_t c = 0; c < count; ++c) {
      os.emplace_back(2, 5, 3, 8, c % 2 ? quiet_nan : 7.0f);  // garbage that must not be read
      ls.emplace_back(2, 3, 5, minus_inf);
    }
    std::vector<TensorView<const float>> states;
    std::vector<StridedView<const float, 3>> lses;
    for (index_t c = 0; c < count; ++c) states.push_back(os[c].cview()), lses.push_back(ls[c].cview());
    Tensor<float> o(2, 5, 3, 8);
    Lse lse(2, 3, 5);
    merge_states<float>(states, lses, o.view(), lse.view());
    EXPECT_TRUE(std::all_of(o.data.begin(), o.data.end(), [](float x) { return x == 0.0f; }));
    EXPECT_TRUE(std::all_of(lse.data.begin(), lse.data.end(), is_minus_inf));
  }
  // Rows that see no key in the one-shot forward (more queries than keys, causal) stay so.
  const Problem p{1, 9, 4, 3, 8, true};
  const SplitProblem<float> sp(p, 2, 3);
  Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse lse(p.batch, p.heads, p.seqlen_q);
  merge_states<float>(sp.states(), sp.lses(), o.view(), lse.view());
  const auto [d_o, d_lse] = max_difference(o, lse, sp.full_o, sp.full_lse);
  EXPECT_LE(d_o, 2e-6);
  EXPECT_LE(d_lse, 2e-6);
  for (index_t h = 0; h < p.heads; ++h)
    for (index_t i = 0; i < 5; ++i) EXPECT_TRUE(is_minus_inf(lse.at(0, h, i))) << "head " << h << " query " << i;
}

TEST(MergeStates, ANanLseMakesOnlyItsRowNan) {
  const Problem p{2, 17, 50, 3, 16, false};
  const SplitProblem<float> sp(p, 3, 11);
  Tensor<float> clean(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse clean_lse(p.batch, p.heads, p.seqlen_q);
  merge_states<float>(sp.states(), sp.lses(), clean.view(), clean_lse.view());
  const index_t nb = 1, nh = 2, ni = 6;  // the poisoned row
  for (std::size_t poisoned : {0u, 1u, 2u}) {
    SCOPED_TRACE("NaN in state " + std::to_string(poisoned));
    auto lse_states = sp.part_lse;
    lse_states[poisoned].at(nb, nh, ni) = quiet_nan;
    std::vector<StridedView<const float, 3>> lses;
    for (const auto& l : lse_states) lses.push_back(l.cview());
    Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
    Lse lse(p.batch, p.heads, p.seqlen_q);
    merge_states<float>(sp.states(), lses, o.view(), lse.view());
    const auto ov = o.view();
    const auto cv = clean.view();
    std::size_t wrong = 0;
    for (index_t b = 0; b < p.batch; ++b)
      for (index_t h = 0; h < p.heads; ++h)
        for (index_t i = 0; i < p.seqlen_q; ++i) {
          const bool poisoned_row = b == nb && h == nh && i == ni;
          const float l = lse.at(b, h, i), want_l = clean_lse.at(b, h, i);
          wrong += poisoned_row ? !std::isnan(l) : std::memcmp(&l, &want_l, sizeof(float)) != 0;
          for (index_t d = 0; d < p.head_dim; ++d) {
            const float x = ov(b, i, h, d), want = cv(b, i, h, d);
            wrong += poisoned_row ? !std::isnan(x) : std::memcmp(&x, &want, sizeof(float)) != 0;
          }
        }
    EXPECT_EQ(wrong, 0u);
  }
}

// ---- In place ------------------------------------------------------------------------------

TEST(MergeStates, InPlaceIntoTheFirstStateGivesTheSameBits) {
  const Problem p{2, 130, 300, 3, 64, true};
  SplitProblem<float> sp(p, 3, 13);
  Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse lse(p.batch, p.heads, p.seqlen_q);
  merge_states<float>(sp.states(), sp.lses(), o.view(), lse.view());
  // O into states[0] itself, LSE separate.
  {
    SplitProblem<float> in_place = sp;
    Lse lse2(p.batch, p.heads, p.seqlen_q);
    merge_states<float>(in_place.states(), in_place.lses(), in_place.part_o[0].view(), lse2.view());
    EXPECT_TRUE(same_bits(in_place.part_o[0].data, o.data));
    EXPECT_TRUE(same_bits(lse2.data, lse.data));
  }
  // O and LSE into states[0] and lse_states[0]; then into the last state.
  for (std::size_t target : {0u, 2u}) {
    SplitProblem<float> in_place = sp;
    merge_states<float>(in_place.states(), in_place.lses(), in_place.part_o[target].view(),
                        in_place.part_lse[target].view());
    EXPECT_TRUE(same_bits(in_place.part_o[target].data, o.data)) << "state " << target;
    EXPECT_TRUE(same_bits(in_place.part_lse[target].data, lse.data)) << "state " << target;
  }
  // The two-state form in place.
  {
    const SplitProblem<float> two(p, 2, 14);
    Tensor<float> o2(p.batch, p.seqlen_q, p.heads, p.head_dim);
    Lse lse2(p.batch, p.heads, p.seqlen_q);
    merge_states<float>(two.states(), two.lses(), o2.view(), lse2.view());
    SplitProblem<float> in_place = two;
    merge_states(in_place.part_o[0].cview(), in_place.part_lse[0].cview(), in_place.part_o[1].cview(),
                 in_place.part_lse[1].cview(), in_place.part_o[1].view(), in_place.part_lse[1].view());
    EXPECT_TRUE(same_bits(in_place.part_o[1].data, o2.data));
    EXPECT_TRUE(same_bits(in_place.part_lse[1].data, lse2.data));
  }
}

// ---- Order and determinism -----------------------------------------------------------------

/// Distance in units in the last place between two finite floats.
std::int64_t ulp_distance(float a, float b) {
  const auto key = [](float x) {
    std::int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? static_cast<std::int64_t>(INT32_MIN) - i : static_cast<std::int64_t>(i);
  };
  return std::abs(key(a) - key(b));
}

TEST(MergeStates, OrderChangesOnlyRounding) {
  const Problem p{2, 17, 200, 3, 64, false};
  const SplitProblem<float> sp(p, 2, 17);
  Tensor<float> ab(p.batch, p.seqlen_q, p.heads, p.head_dim), ba(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse lab(p.batch, p.heads, p.seqlen_q), lba(p.batch, p.heads, p.seqlen_q);
  merge_states(sp.part_o[0].cview(), sp.part_lse[0].cview(), sp.part_o[1].cview(), sp.part_lse[1].cview(), ab.view(),
               lab.view());
  merge_states(sp.part_o[1].cview(), sp.part_lse[1].cview(), sp.part_o[0].cview(), sp.part_lse[0].cview(), ba.view(),
               lba.view());
  // O: a few ulps of the row's scale (an element near 0 has tiny ulps of its own).
  double worst_o = 0.0;
  for (std::size_t i = 0; i < ab.data.size(); ++i)
    worst_o = std::max(worst_o, std::abs(static_cast<double>(ab.data[i]) - ba.data[i]) /
                                    (std::numeric_limits<float>::epsilon() * std::max(1.0f, std::abs(ab.data[i]))));
  EXPECT_LE(worst_o, 2.0);
  std::int64_t worst_lse = 0;
  for (std::size_t i = 0; i < lab.data.size(); ++i) worst_lse = std::max(worst_lse, ulp_distance(lab.data[i], lba.data[i]));
  EXPECT_LE(worst_lse, 2);
}

TEST(MergeStates, BitwiseIdenticalRepeatedAndAcrossBackendsAndThreadCounts) {
  const Problem p{4, 130, 64, 3, 64, true};  // 12 (batch, head) items, 3 row blocks each
  const SplitProblem<float> sp(p, 5, 19);
  Tensor<float> first(p.batch, p.seqlen_q, p.heads, p.head_dim);
  Lse first_lse(p.batch, p.heads, p.seqlen_q);
  merge_states<float>(sp.states(), sp.lses(), first.view(), first_lse.view());
  for (Backend backend : compiled_backends())
    for (int threads : {1, 2, 3, 7}) {
      Tensor<float> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
      Lse lse(p.batch, p.heads, p.seqlen_q);
      merge_states<float>(sp.states(), sp.lses(), o.view(), lse.view(), Execution{backend, threads});
      EXPECT_TRUE(same_bits(o.data, first.data) && same_bits(lse.data, first_lse.data))
          << to_string(backend) << " x " << threads;
    }
  // bf16 states as well.
  const SplitProblem<bf16> half(p, 5, 19);
  Tensor<bf16> half_first(p.batch, p.seqlen_q, p.heads, p.head_dim);
  merge_states<bf16>(half.states(), half.lses(), half_first.view(), LseView{});
  for (Backend backend : compiled_backends()) {
    Tensor<bf16> o(p.batch, p.seqlen_q, p.heads, p.head_dim);
    merge_states<bf16>(half.states(), half.lses(), o.view(), LseView{}, Execution{backend, 3});
    EXPECT_TRUE(same_bits(o.data, half_first.data)) << to_string(backend);
  }
}

// ---- Bad arguments -------------------------------------------------------------------------

/// A valid merge of 3 states [2, 5, 3, 8] whose arguments a test then breaks. The outputs
/// sit at the start of buffers twice their size, so that a state or an LSE can be pointed
/// at them (an aliasing case) without a missed check reading or writing past them.
struct MergeCall {
  static constexpr index_t B = 2, S = 5, H = 3, D = 8;
  std::vector<Tensor<float>> os;
  std::vector<Lse> ls;
  std::vector<float> o_buffer, lse_buffer;
  std::vector<TensorView<const float>> states;
  std::vector<StridedView<const float, 3>> lses;
  TensorView<float> o;
  LseView lse;
  Execution exec{};

  MergeCall() : o_buffer(static_cast<std::size_t>(2 * B * S * H * D), sentinel), lse_buffer(static_cast<std::size_t>(2 * B * H * S), sentinel) {
    for (int c = 0; c < 3; ++c) {
      os.emplace_back(B, S, H, D).fill_normal(static_cast<std::uint64_t>(c));
      auto& l = ls.emplace_back(B, H, S);
      std::mt19937_64 rng(static_cast<std::uint64_t>(10 + c));
      std::normal_distribution<float> normal(0.0f, 3.0f);
      for (float& x : l.data) x = normal(rng);
    }
    for (int c = 0; c < 3; ++c) states.push_back(os[c].cview()), lses.push_back(ls[c].cview());
    o = make_bshd(o_buffer.data(), B, S, H, D);
    lse = make_lse(lse_buffer.data(), B, H, S);
  }

  void run() { merge_states<float>(states, lses, o, lse, exec); }
};

void expect_rejected(MergeCall& c, const std::string& parameter) {
  std::vector<std::vector<float>> os_before, ls_before;
  for (const auto& t : c.os) os_before.push_back(t.data);
  for (const auto& l : c.ls) ls_before.push_back(l.data);
  const auto o_before = c.o_buffer, lse_before = c.lse_buffer;
  try {
    c.run();
    ADD_FAILURE() << "merge_states accepted the call; expected an error naming \"" << parameter << "\"";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("tileattn: " + e.parameter() + ": ", 0), 0u) << e.what();
  }
  EXPECT_TRUE(same_bits(o_before, c.o_buffer)) << "O was written before the error";
  EXPECT_TRUE(same_bits(lse_before, c.lse_buffer)) << "LSE was written before the error";
  for (std::size_t i = 0; i < c.os.size(); ++i) {
    EXPECT_TRUE(same_bits(os_before[i], c.os[i].data)) << "states[" << i << "] changed";
    EXPECT_TRUE(same_bits(ls_before[i], c.ls[i].data)) << "lse_states[" << i << "] changed";
  }
}

struct MergeBadCase {
  std::string name;
  std::function<void(MergeCall&)> mutate;
  std::string parameter;
};

std::vector<MergeBadCase> merge_bad_cases() {
  return {
      // counts
      {"no_states", [](MergeCall& c) { c.states.clear(); c.lses.clear(); }, "states"},
      {"fewer_lses", [](MergeCall& c) { c.lses.pop_back(); }, "lse_states"},
      {"more_lses", [](MergeCall& c) { c.lses.push_back(c.lses[0]); }, "lse_states"},
      // state shapes against o
      {"state_batch", [](MergeCall& c) { c.states[1].shape[0] = 1; }, "states[1].shape[0] (batch)"},
      {"state_seqlen", [](MergeCall& c) { c.states[1].shape[1] = 4; }, "states[1].shape[1] (seqlen)"},
      {"state_heads", [](MergeCall& c) { c.states[2].shape[2] = 2; }, "states[2].shape[2] (heads)"},
      {"state_head_dim", [](MergeCall& c) { c.states[0].shape[3] = 7; }, "states[0].shape[3] (head_dim)"},
      {"state_seqlen_0", [](MergeCall& c) { c.states[1].shape[1] = 0; }, "states[1].shape[1] (seqlen)"},
      // LSE state shapes
      {"lse_state_batch", [](MergeCall& c) { c.lses[1].shape[0] = 1; }, "lse_states[1].shape[0] (batch)"},
      {"lse_state_heads", [](MergeCall& c) { c.lses[2].shape[1] = 4; }, "lse_states[2].shape[1] (heads)"},
      {"lse_state_seqlen", [](MergeCall& c) { c.lses[0].shape[2] = 4; }, "lse_states[0].shape[2] (seqlen_q)"},
      // output shapes
      {"o_head_dim_above_max", [](MergeCall& c) { c.o.shape[3] = max_head_dim + 1; }, "head_dim_v"},
      {"o_heads_0", [](MergeCall& c) { c.o.shape[2] = 0; }, "o.shape[2] (heads)"},
      {"lse_heads", [](MergeCall& c) { c.lse.shape[1] = 2; }, "lse.shape[1] (heads)"},
      {"lse_seqlen", [](MergeCall& c) { c.lse.shape[2] = 6; }, "lse.shape[2] (seqlen_q)"},
      // null data
      {"null_state", [](MergeCall& c) { c.states[2].data = nullptr; }, "states[2]"},
      {"null_lse_state", [](MergeCall& c) { c.lses[1].data = nullptr; }, "lse_states[1]"},
      {"null_o", [](MergeCall& c) { c.o.data = nullptr; }, "o"},
      // negative strides
      {"negative_state_stride", [](MergeCall& c) { c.states[1].stride[3] = -1; }, "states[1].stride[3] (head_dim)"},
      {"negative_lse_state_stride", [](MergeCall& c) { c.lses[0].stride[2] = -1; }, "lse_states[0].stride[2] (seqlen_q)"},
      {"negative_o_stride", [](MergeCall& c) { c.o.stride[1] = -c.o.stride[1]; }, "o.stride[1] (seqlen)"},
      {"negative_lse_stride", [](MergeCall& c) { c.lse.stride[0] = -c.lse.stride[0]; }, "lse.stride[0] (batch)"},
      // aliasing
      {"o_self_overlapping", [](MergeCall& c) { c.o.stride[2] = 0; }, "o.stride"},
      {"o_shifted_over_state_0", [](MergeCall& c) { c.o.data = c.os[0].data.data() + 1; }, "o"},
      {"o_state_0_with_other_strides",  // the same first element, another layout: not in place
       [](MergeCall& c) { c.o = c.os[0].view(); c.o.stride = {c.o.stride[0], c.o.stride[1], 1, 3}; }, "o"},
      {"o_over_lse_state", [](MergeCall& c) { c.lses[2].data = c.o_buffer.data() + 1; }, "o"},
      {"lse_over_o", [](MergeCall& c) { c.lse.data = c.o_buffer.data() + 3; }, "lse"},
      {"lse_over_a_state", [](MergeCall& c) { c.lse.data = c.os[1].data.data() + 2; }, "lse"},
      {"lse_shifted_over_lse_state", [](MergeCall& c) { c.lse.data = c.ls[0].data.data() + 1; }, "lse"},
      // execution
      {"threads_negative", [](MergeCall& c) { c.exec.num_threads = -1; }, "num_threads"},
      {"threads_above_max", [](MergeCall& c) { c.exec.num_threads = max_threads + 1; }, "num_threads"},
  };
}

void PrintTo(const MergeBadCase& c, std::ostream* os) { *os << c.name; }

class MergeRejects : public ::testing::TestWithParam<MergeBadCase> {};

TEST_P(MergeRejects, NamesTheParameterAndWritesNothing) {
  MergeCall c;
  GetParam().mutate(c);
  expect_rejected(c, GetParam().parameter);
}

INSTANTIATE_TEST_SUITE_P(BadArguments, MergeRejects, ::testing::ValuesIn(merge_bad_cases()),
                         [](const ::testing::TestParamInfo<MergeBadCase>& info) { return info.param.name; });

TEST(MergeStates, TheUnbrokenCallRuns) {
  MergeCall c;
  c.run();
  EXPECT_NE(c.o_buffer[0], sentinel);
  EXPECT_TRUE(std::all_of(c.o_buffer.begin() + MergeCall::B * MergeCall::S * MergeCall::H * MergeCall::D,
                          c.o_buffer.end(), [](float x) { return x == sentinel; }));
}

/// Found by this suite: the in-place exemption skips more than the O-vs-state check.
TEST(MergeStates, InPlaceOutputMustNotOverlapTheSameStatesLse) {
  // o is states[0] exactly (in place, allowed), but lse_states[0] lies inside states[0]'s
  // buffer: O is written while other (batch, head) items still read that LSE.
  MergeCall c;
  c.o = c.os[0].view();
  c.lses[0].data = c.os[0].data.data() + 4;
  expect_rejected(c, "o");
}

TEST(MergeStates, LseOutputMustNotOverlapItself) {
  // forward() rejects an LSE output that maps two rows to one element ("lse.stride").
  MergeCall c;
  c.lse.stride[2] = 0;
  expect_rejected(c, "lse.stride");
}

}  // namespace
}  // namespace tileattn::test
