// tests/variants/head_dims_test.cpp: any head_dim in [1, max_head_dim] and a V/O head_dim of
// its own (DeepSeek's multi-head latent attention: 192 for Q/K, 128 for V), against the
// reference with GQA, masks, varlen and every backend; results bitwise identical across
// backends and thread counts at odd sizes too.
#include <gtest/gtest.h>

#include <sstream>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

struct DimsCase {
  index_t d, dv, heads_q, heads_kv, nq, nk;
  bool causal;
  std::size_t budget;
  Execution exec;
};

std::string case_name(const DimsCase& c) {
  std::ostringstream s;
  s << "d" << c.d << "_dv" << c.dv << "_h" << c.heads_q << "kv" << c.heads_kv << "_" << c.nq << "x" << c.nk
    << (c.causal ? "_causal" : "_full") << "_budget" << c.budget << "_" << to_string(c.exec.backend)
    << c.exec.num_threads;
  return s.str();
}

/// Q, K [B, N, H, d] and V, O [B, N, H, dv] in the test layouts, LSE, all seeded.
struct DimsProblem {
  HostTensor q, k, v, o;
  HostLse lse;
  DimsProblem(const DimsCase& c, index_t batch, std::uint64_t seed)
      : q({batch, c.nq, c.heads_q, c.d}, Layout::bhsd),
        k({batch, c.nk, c.heads_kv, c.d}, Layout::window),
        v({batch, c.nk, c.heads_kv, c.dv}, Layout::dim_major),
        o({batch, c.nq, c.heads_q, c.dv}, Layout::window),
        lse(batch, c.heads_q, c.nq, true) {
    q.fill_normal(seed);
    k.fill_normal(seed + 1);
    v.fill_normal(seed + 2);
    o.fill(sentinel);
    lse.fill(sentinel);
  }
  void run(const ForwardOptions& opts) { forward(q.cview(), k.cview(), v.cview(), o.view(), lse.view(), opts); }
};

std::vector<DimsCase> cases() {
  const std::pair<index_t, index_t> dims[] = {{192, 128}, {128, 192}, {40, 200}, {1, 7},   {7, 1},
                                              {111, 64},  {72, 72},   {59, 59},  {576, 512}, {3, 300}};
  const auto backends = compiled_backends();
  std::vector<DimsCase> out;
  int n = 0;
  for (auto [d, dv] : dims)
    for (bool causal : {false, true}) {
      const std::size_t budget = n % 3 == 0 ? 0 : n % 3 == 1 ? rows_budget(16, d, dv)
                                                             : rows_budget(3, d, dv);
      const index_t kv = n % 2 ? 1 : 2;
      out.push_back({d, dv, 4, kv, 17 + 10 * (n % 4), 29 + 23 * (n % 3), causal, budget,
                     {backends[static_cast<std::size_t>(n) % backends.size()], 1 + n % 3}});
      ++n;
    }
  return out;
}

class HeadDims : public ::testing::TestWithParam<DimsCase> {};

TEST_P(HeadDims, MatchesTheReference) {
  const DimsCase& c = GetParam();
  DimsProblem p(c, 2, 31);
  ForwardOptions opts;
  opts.causal = c.causal;
  opts.sram_budget_bytes = c.budget;
  opts.execution = c.exec;
  p.run(opts);
  reference::Options ro = reference::Options::from(opts);
  const auto ref = reference::attention<float>(p.q.cview(), p.k.cview(), p.v.cview(), ro);
  EXPECT_TRUE(within_bounds(compare_to_reference(ref, p.o.cview(), p.lse.view())));
  EXPECT_EQ(p.o.changed_outside_view(sentinel), 0u);
  EXPECT_EQ(p.lse.changed_outside_view(sentinel), 0u);
}

INSTANTIATE_TEST_SUITE_P(Pairs, HeadDims, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

// Odd head dims give the same bits on every backend and thread count.
TEST(HeadDims, BitwiseIdenticalAcrossBackendsAndThreads) {
  for (auto [d, dv] : {std::pair<index_t, index_t>{59, 59}, {192, 128}, {1, 3}}) {
    const DimsCase c{d, dv, 6, 2, 45, 77, true, rows_budget(16, d, dv), {}};
    DimsProblem base(c, 2, 5);
    ForwardOptions opts;
    opts.causal = true;
    opts.sram_budget_bytes = c.budget;
    opts.execution = {Backend::serial, 1};
    base.run(opts);
    for (Backend b : compiled_backends())
      for (int threads : {2, 3}) {
        DimsProblem p(c, 2, 5);
        opts.execution = {b, threads};
        p.run(opts);
        EXPECT_TRUE(bitwise_equal(p.o.buffer(), base.o.buffer())) << d << "/" << dv << " " << to_string(b) << threads;
        EXPECT_TRUE(bitwise_equal(p.lse.buffer(), base.lse.buffer())) << d << "/" << dv;
      }
  }
}

// Varlen with head_dim_v != head_dim: every sequence against its own reference.
TEST(HeadDims, VarlenWithAValueHeadDimOfItsOwn) {
  constexpr index_t d = 96, dv = 40, H = 4, Hkv = 2;
  const std::vector<std::int32_t> q_lens{5, 0, 33, 1}, k_lens{9, 4, 70, 0};
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    cu_q.push_back(cu_q.back() + q_lens[b]);
    cu_k.push_back(cu_k.back() + k_lens[b]);
  }
  std::vector<float> q(static_cast<std::size_t>(cu_q.back() * H * d)), k(static_cast<std::size_t>(cu_k.back() * Hkv * d)),
      v(static_cast<std::size_t>(cu_k.back() * Hkv * dv)), o(static_cast<std::size_t>(cu_q.back() * H * dv), sentinel),
      lse(static_cast<std::size_t>(H * cu_q.back()), sentinel);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  ForwardOptions opts;
  opts.causal = true;
  opts.sram_budget_bytes = rows_budget(8, d, dv);
  const auto qv = make_thd<const float>(q.data(), cu_q.back(), H, d);
  const auto kv = make_thd<const float>(k.data(), cu_k.back(), Hkv, d);
  const auto vv = make_thd<const float>(v.data(), cu_k.back(), Hkv, dv);
  forward_varlen(qv, kv, vv, make_thd(o.data(), cu_q.back(), H, dv), make_packed_lse(lse.data(), H, cu_q.back()),
                 {cu_q, cu_k, 33, 70}, opts);
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    const auto ref = reference::attention<float>(reference::sequence_view(qv, cu_q[b], q_lens[b]),
                                                 reference::sequence_view(kv, cu_k[b], k_lens[b]),
                                                 reference::sequence_view(vv, cu_k[b], k_lens[b]),
                                                 reference::Options::from(opts));
    const TensorView<const float> ob = reference::sequence_view(make_thd<const float>(o.data(), cu_q.back(), H, dv),
                                                                cu_q[b], q_lens[b]);
    const LseView lb{lse.data() + cu_q[b], {1, H, q_lens[b]}, {0, cu_q.back(), 1}};
    EXPECT_TRUE(within_bounds(compare_to_reference(ref, ob, lb))) << "sequence " << b;
  }
}

}  // namespace
}  // namespace tileattn::test
