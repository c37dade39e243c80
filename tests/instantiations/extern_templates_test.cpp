// tests/instantiations/extern_templates_test.cpp: forward and forward_varlen in float, bf16
// and fp16, and forward_paged (float over float and fp8 pools, bf16 over bf16), from a TU
// that sees them as extern templates (TILEATTN_EXTERN_TEMPLATES, set by linking
// tileattn::instantiations): the calls link to the library's instantiations and agree with
// the double reference (the paged ones with the contiguous forward).
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

/// forward_paged over one sequence in shuffled pages (Q in T, pools in KV) against the
/// contiguous forward of the same rows in T (an 8-bit value converts to float exactly): both
/// the library's instantiations, so this TU compiles no kernel.
template <class T, class KV>
void paged_matches_contiguous(double tol) {
  const index_t n = 45, page = 8, pages = 6, h = 2, d = 16, q_len = 3;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<T> q(q_len * h * d), o(q.size()), o_paged(q.size()), k(n * h * d), v(k.size());
  std::vector<KV> k_pool(pages * page * h * d), v_pool(k_pool.size());
  for (T& x : q) x = T(normal(rng));
  const std::vector<std::int32_t> table{4, 1, 5, 0, 3, 2}, seqlens{static_cast<std::int32_t>(n)};
  for (index_t r = 0; r < n; ++r)
    for (index_t c = 0; c < h * d; ++c) {
      const auto at = static_cast<std::size_t>((table[static_cast<std::size_t>(r / page)] * page + r % page) * h * d + c);
      const auto row = static_cast<std::size_t>(r * h * d + c);
      k_pool[at] = KV(normal(rng));
      v_pool[at] = KV(normal(rng));
      k[row] = T(static_cast<float>(k_pool[at]));
      v[row] = T(static_cast<float>(v_pool[at]));
    }
  PagedOptions opts;
  opts.causal = true;
  opts.num_splits = 2;
  forward(make_bshd<const T>(q.data(), 1, q_len, h, d), make_bshd<const T>(k.data(), 1, n, h, d),
          make_bshd<const T>(v.data(), 1, n, h, d), make_bshd(o.data(), 1, q_len, h, d), opts);
  forward_paged(make_bshd<const T>(q.data(), 1, q_len, h, d), make_bshd<const KV>(k_pool.data(), pages, page, h, d),
                make_bshd<const KV>(v_pool.data(), pages, page, h, d), make_block_table(table.data(), 1, pages),
                seqlens, make_bshd(o_paged.data(), 1, q_len, h, d), opts);
  double worst = 0;
  for (std::size_t i = 0; i < o.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(to_float(o[i]) - to_float(o_paged[i]))));
  EXPECT_LE(worst, tol);
}

TEST(ExternTemplatesPaged, MatchesTheContiguousForward) {
  paged_matches_contiguous<float, float>(1e-5);
  paged_matches_contiguous<float, fp8_e4m3>(1e-5);
  paged_matches_contiguous<bf16, bf16>(1e-2);
}

}  // namespace
}  // namespace tileattn
