// tests/instantiations/extern_templates_test.cpp: forward and forward_varlen in float, bf16
// and fp16 from a TU that sees them as extern templates (TILEATTN_EXTERN_TEMPLATES, set by
// linking tileattn::instantiations): the calls link to the library's instantiations and
// agree with the double reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "reference/naive_attention.hpp"
#include "tileattn/tileattn.hpp"

#if !defined(TILEATTN_EXTERN_TEMPLATES)
#error "this test must be built against tileattn::instantiations"
#endif

namespace tileattn {
namespace {

template <class T>
class ExternTemplates : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, fp16>;
TYPED_TEST_SUITE(ExternTemplates, StorageTypes);

template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 2e-5;
  else if constexpr (std::is_same_v<T, bf16>) return 3e-2;
  else return 4e-3;
}

TYPED_TEST(ExternTemplates, ForwardAndVarlenMatchTheReference) {
  using T = TypeParam;
  const index_t n = 37, h = 2, d = 24;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> qf(n * h * d), kf(qf.size()), vf(qf.size());
  for (auto* x : {&qf, &kf, &vf})
    for (float& e : *x) e = to_float(from_float<T>(normal(rng)));
  std::vector<T> q(qf.size()), k(qf.size()), v(qf.size()), o(qf.size()), o_varlen(qf.size());
  for (std::size_t i = 0; i < qf.size(); ++i) {
    q[i] = from_float<T>(qf[i]);
    k[i] = from_float<T>(kf[i]);
    v[i] = from_float<T>(vf[i]);
  }
  ForwardOptions opts;
  opts.causal = true;
  forward(make_bshd(q.data(), 1, n, h, d), make_bshd(k.data(), 1, n, h, d), make_bshd(v.data(), 1, n, h, d),
          make_bshd(o.data(), 1, n, h, d), opts);
  const std::vector<std::int32_t> cu{0, 20, static_cast<std::int32_t>(n)};
  forward_varlen(make_thd(q.data(), n, h, d), make_thd(k.data(), n, h, d), make_thd(v.data(), n, h, d),
                 make_thd(o_varlen.data(), n, h, d), PackedLseView{}, VarlenSequences{cu, cu, 20, 20}, opts);

  reference::Options ref_opts;
  ref_opts.causal = true;
  const auto ref = reference::attention(TensorView<const float>(make_bshd(qf.data(), 1, n, h, d)),
                                        TensorView<const float>(make_bshd(kf.data(), 1, n, h, d)),
                                        TensorView<const float>(make_bshd(vf.data(), 1, n, h, d)), ref_opts);
  double worst = 0;
  for (index_t i = 0; i < n; ++i)
    for (index_t hh = 0; hh < h; ++hh)
      for (index_t c = 0; c < d; ++c)
        worst = std::max(worst, std::abs(to_float(o[(i * h + hh) * d + c]) - ref.out(0, i, hh, c)));
  EXPECT_LE(worst, tolerance<T>());
  // Varlen: the second sequence (rows 20..36) is its own causal problem; its first row sees one key.
  for (index_t hh = 0; hh < h; ++hh)
    for (index_t c = 0; c < d; ++c)
      EXPECT_EQ(to_float(o_varlen[(20 * h + hh) * d + c]), to_float(v[(20 * h + hh) * d + c]));
}

}  // namespace
}  // namespace tileattn
