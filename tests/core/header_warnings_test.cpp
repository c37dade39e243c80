// tests/core/header_warnings_test.cpp: the public headers compile without a warning under
// -Wall -Wextra -Wsign-conversion -Werror (issue 28): this file includes tileattn/tileattn.hpp
// and flex.hpp and instantiates the forward, backward, paged, MLA and flex entry points and the
// KV cache (K/V and latent) for float and bf16 (tests/core/CMakeLists.txt builds it with those flags and without
// tileattn::instantiations, so the kernels are compiled here). The calls run once on a tiny
// shape, so the test also checks they work.
#include <gtest/gtest.h>

#include <tileattn/flex.hpp>
#include <tileattn/tileattn.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace tileattn::test {
namespace {

constexpr index_t seqlen = 4, head_dim = 16, elements = seqlen * head_dim;

template <class T>
bool all_finite(const std::vector<T>& x) {
  for (const T& e : x)
    if (!std::isfinite(static_cast<float>(e))) return false;
  return true;
}

template <class T>
void run_every_entry_point() {
  std::vector<T> x(elements), o(elements), dq(elements), dk(elements), dv(elements);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(static_cast<float>(i % 7) * 0.125f);
  std::vector<float> lse(seqlen);
  const TensorView<const T> in = make_bhsd<const T>(x.data(), 1, 1, seqlen, head_dim);
  const TensorView<T> out = make_bhsd(o.data(), 1, 1, seqlen, head_dim);
  const auto grad = [](std::vector<T>& g) { return make_bhsd(g.data(), 1, 1, seqlen, head_dim); };
  const StridedView<const float, 3> saved_lse = make_lse(lse.data(), 1, 1, seqlen);

  forward(in, in, in, out, make_lse(lse.data(), 1, 1, seqlen));
  backward(in, in, in, TensorView<const T>(out), saved_lse, in, grad(dq), grad(dk), grad(dv));
  forward_flex(in, in, in, out, flex::no_score_mod{}, flex::no_mask{});
  backward_flex(in, in, in, TensorView<const T>(out), saved_lse, in, grad(dq), grad(dk), grad(dv),
                flex::no_score_mod{}, flex::no_mask{});
  EXPECT_TRUE(all_finite(o) && all_finite(dq) && all_finite(dk) && all_finite(dv));

  KvCacheConfig config;
  config.num_pages = 4;
  config.page_size = 2;
  config.heads_kv = 1;
  config.head_dim = head_dim;
  KvCache<T> cache(config);
  const SequenceId ids[] = {cache.create()};
  cache.extend(ids[0], seqlen);
  const StridedView<const T, 3> rows{x.data(), {seqlen, 1, head_dim}, {head_dim, head_dim, 1}};
  cache.write(0, ids[0], rows, rows);
  const auto tables = cache.batch(ids);
  forward_paged(in, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(), tables.seqlens(), out);
  EXPECT_TRUE(all_finite(o));

  // Rotary embedding: the rotating write, the rotated Q load, and the unfused pass.
  const std::vector<float> table(static_cast<std::size_t>(seqlen * head_dim / 2), 0.5f);
  const StridedView<const float, 2> half_table{table.data(), {seqlen, head_dim / 2}, {head_dim / 2, 1}};
  PagedOptions options;
  options.rotary = {half_table, half_table, true};
  cache.write(0, ids[0], rows, rows, options.rotary);
  forward_paged(in, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(), tables.seqlens(), out, options);
  std::vector<T> y = x;
  const std::vector<std::int64_t> positions{0, 1, 2, 3};
  apply_rotary(StridedView<T, 3>{y.data(), {seqlen, 1, head_dim}, {head_dim, head_dim, 1}}, positions, options.rotary);
  EXPECT_TRUE(all_finite(o) && all_finite(y));

  // MLA (mla.hpp): a latent cache, its append, and the absorbed call (V: the rows' first half).
  config.latent = true;
  config.head_dim_v = head_dim / 2;
  KvCache<T> latent(config);
  const SequenceId latent_ids[] = {latent.create()};
  latent.append_latent(latent_ids[0], TensorView<const T>{x.data(), {1, seqlen, 1, head_dim}, {elements, head_dim, head_dim, 1}});
  const auto latent_tables = latent.batch(latent_ids);
  std::vector<T> half(elements / 2);
  forward_paged_mla(in, latent.k_pages(0), latent_tables.block_table_view(), latent_tables.seqlens(),
                    make_bhsd(half.data(), 1, 1, seqlen, head_dim / 2));
  EXPECT_TRUE(all_finite(half));
}

TEST(HeaderWarnings, FloatEntryPointsCompileCleanAndRun) { run_every_entry_point<float>(); }
TEST(HeaderWarnings, Bf16EntryPointsCompileCleanAndRun) { run_every_entry_point<bf16>(); }

}  // namespace
}  // namespace tileattn::test
