// tests/paged/page_layout_test.cpp: KvCacheConfig::layout (cache_write.hpp's PageLayout).
// A head-major cache holds the same values as a token-major one after the same appends,
// fork (copy-on-write of a partly filled page) and truncation, in memory laid out as its
// strides say, and forward_paged over it (decode, a verify step, a chunked prefill) gives
// the same bits as over the token-major cache, in every storage type; make_page_pool's
// head-major view puts one head's rows of a page in one run; automatic resolves per type
// (head-major for 16- and 32-bit types, token-major for 8-bit); a bad layout is named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "tileattn/kv_cache.hpp"
#include "tileattn/paged.hpp"

namespace tileattn {
namespace {

using test::sentinel;

constexpr index_t heads_kv = 2, heads_q = 6, dim = 24, dim_v = 16, layers = 2;

template <class T>
using QueryType = std::conditional_t<quantized_type<T>, float, T>;  // 8-bit caches: float queries

/// Caches of both layouts, filled by the same calls.
template <class T>
struct TwoCaches {
  KvCache<T> token, head;
  std::vector<SequenceId> ids;

  static KvCacheConfig config(index_t page_size, PageLayout layout) {
    KvCacheConfig c{.num_layers = layers, .num_pages = 40, .page_size = page_size, .heads_kv = heads_kv,
                    .head_dim = dim, .head_dim_v = dim_v};
    if constexpr (quantized_type<T> && !adaptive_scale<T>) c.k_scale = {0.5f, 0.25f}, c.v_scale = {0.125f};
    c.layout = layout;
    return c;
  }
  explicit TwoCaches(index_t page_size)
      : token(config(page_size, PageLayout::token_major)), head(config(page_size, PageLayout::head_major)) {}

  template <class F>
  void both(F&& f) {
    f(token);
    f(head);
  }
  void append(std::size_t seq, index_t n, std::mt19937_64& rng) {
    using Row = QueryType<T>;
    std::normal_distribution<float> normal;
    std::vector<Row> k(static_cast<std::size_t>(layers * n * heads_kv * dim)),
        v(static_cast<std::size_t>(layers * n * heads_kv * dim_v));
    for (auto& x : k) x = from_float<Row>(normal(rng));
    for (auto& x : v) x = from_float<Row>(normal(rng));
    both([&](KvCache<T>& c) {
      c.append(ids[seq], make_bshd<const Row>(k.data(), layers, n, heads_kv, dim),
               make_bshd<const Row>(v.data(), layers, n, heads_kv, dim_v));
    });
  }
};

/// forward_paged over `cache` in `layer` for `q_len` new tokens per sequence (causal).
template <class T>
std::pair<std::vector<QueryType<T>>, std::vector<float>> attend(const KvCache<T>& cache, const std::vector<SequenceId>& ids,
                                                                index_t layer, index_t q_len, std::uint64_t seed) {
  using Q = QueryType<T>;
  const auto tables = cache.batch(ids);
  const auto b = static_cast<index_t>(ids.size());
  std::vector<Q> q(static_cast<std::size_t>(b * q_len * heads_q * dim)),
      o(static_cast<std::size_t>(b * q_len * heads_q * dim_v), from_float<Q>(sentinel));
  std::vector<float> lse(static_cast<std::size_t>(b * heads_q * q_len), sentinel);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& x : q) x = from_float<Q>(normal(rng));
  PagedOptions opt;
  opt.causal = true;
  if constexpr (quantized_type<T>) {
    opt.k_scale = cache.k_scales(layer);
    opt.v_scale = cache.v_scales(layer);
  }
  forward_paged(make_bshd<const Q>(q.data(), b, q_len, heads_q, dim), cache.k_pages(layer), cache.v_pages(layer),
                tables.block_table_view(), tables.seqlens(), make_bshd(o.data(), b, q_len, heads_q, dim_v),
                make_lse(lse.data(), b, heads_q, q_len), opt);
  return {o, lse};
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
class PageLayoutTest : public ::testing::Test {};
using CacheTypes = ::testing::Types<float, bf16, std::int8_t, fp8_e4m3>;
TYPED_TEST_SUITE(PageLayoutTest, CacheTypes);

TYPED_TEST(PageLayoutTest, HeadMajorCacheHoldsTheSameValuesAndAttendsToTheSameBits) {
  using T = TypeParam;
  for (index_t page_size : {index_t{3}, index_t{16}}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    TwoCaches<T> c(page_size);
    std::mt19937_64 rng(5);
    const SequenceId parent = c.token.create();
    ASSERT_EQ(c.head.create(), parent);  // the same calls give the same ids
    c.ids = {parent};
    c.append(0, 23, rng);
    const SequenceId child = c.token.fork(parent);
    ASSERT_EQ(c.head.fork(parent), child);
    c.ids.push_back(child);
    c.append(1, 4, rng);  // copies the parent's partly filled last page
    c.both([&](KvCache<T>& cache) { cache.truncate(c.ids[0], 20); });
    c.append(0, 5, rng);
    for (index_t l = 0; l < layers; ++l)
      for (int kv : {0, 1}) {
        const auto a = kv == 0 ? c.token.k_pages(l) : c.token.v_pages(l);
        const auto b = kv == 0 ? c.head.k_pages(l) : c.head.v_pages(l);
        EXPECT_EQ(b.stride[1], b.shape[3]) << "head-major: a head's rows of a page are adjacent";
        EXPECT_EQ(b.stride[2], page_size * b.shape[3]);
        EXPECT_EQ(a.stride[2], a.shape[3]);
        for (SequenceId id : c.ids)
          for (index_t t = 0; t < c.token.length(id); ++t) {
            const std::int32_t page = c.token.pages(id)[static_cast<std::size_t>(t / page_size)];
            ASSERT_EQ(page, c.head.pages(id)[static_cast<std::size_t>(t / page_size)]);
            for (index_t h = 0; h < heads_kv; ++h)
              for (index_t e = 0; e < a.shape[3]; ++e)
                ASSERT_EQ(std::memcmp(&a(page, t % page_size, h, e), &b(page, t % page_size, h, e), sizeof(T)), 0)
                    << "layer " << l << (kv ? " V" : " K") << " sequence " << id << " token " << t;
          }
      }
    // Decode, a verify step and a chunked prefill (the tile path) over each layer.
    for (index_t l = 0; l < layers; ++l)
      for (index_t q_len : {index_t{1}, index_t{5}, index_t{19}}) {
        SCOPED_TRACE("layer " + std::to_string(l) + ", " + std::to_string(q_len) + " new tokens");
        const auto [o_token, lse_token] = attend(c.token, c.ids, l, q_len, 100 + static_cast<std::uint64_t>(q_len));
        const auto [o_head, lse_head] = attend(c.head, c.ids, l, q_len, 100 + static_cast<std::uint64_t>(q_len));
        EXPECT_TRUE(same_bytes(o_token, o_head));
        EXPECT_TRUE(same_bytes(lse_token, lse_head));
        for (float x : lse_head) ASSERT_TRUE(std::isfinite(x));  // every row attended
      }
  }
}

TEST(PageLayout, HeadMajorPoolViewPutsAHeadsPageInOneRun) {
  std::vector<float> pool(2 * 3 * 4 * 5);
  const auto v = make_page_pool(pool.data(), 2, 3, 4, 5, PageLayout::head_major);
  EXPECT_EQ(&v(1, 0, 2, 0), pool.data() + 1 * 60 + 2 * 15);
  EXPECT_EQ(&v(1, 2, 2, 4), &v(1, 0, 2, 0) + 14);  // page 1, head 2: 15 elements in a row
  const auto t = make_page_pool(pool.data(), 2, 3, 4, 5);
  EXPECT_EQ(&t(1, 2, 2, 4), pool.data() + 60 + 2 * 20 + 2 * 5 + 4);
  EXPECT_STREQ(to_string(PageLayout::head_major), "head_major");
}

TEST(PageLayout, AutomaticIsHeadMajorForWideTypesAndTokenMajorForEightBit) {
  const KvCacheConfig c{.num_layers = 1, .num_pages = 4, .page_size = 2, .heads_kv = 3, .head_dim = 8};
  EXPECT_EQ(c.layout, PageLayout::automatic);
  EXPECT_EQ(KvCache<float>(c).config().layout, PageLayout::head_major);
  EXPECT_EQ(KvCache<bf16>(c).config().layout, PageLayout::head_major);
  EXPECT_EQ(KvCache<fp16>(c).config().layout, PageLayout::head_major);
  EXPECT_EQ(KvCache<std::int8_t>(c).config().layout, PageLayout::token_major);
  EXPECT_EQ(KvCache<fp8_e5m2>(c).config().layout, PageLayout::token_major);
  const KvCache<float> wide(c);
  const KvCache<std::int8_t> narrow(c);
  EXPECT_EQ(wide.k_pages(0).stride[1], 8);  // head-major: a head's tokens adjacent
  EXPECT_EQ(narrow.k_pages(0).stride[1], 3 * 8);
  float x = 0;
  EXPECT_EQ(make_page_pool(&x, 1, 1, 1, 1, PageLayout::automatic).stride[0], 1);
  EXPECT_STREQ(to_string(PageLayout::automatic), "automatic");
}

TEST(PageLayout, ABadLayoutIsNamed) {
  KvCacheConfig c{.num_layers = 1, .num_pages = 4, .page_size = 2, .heads_kv = 1, .head_dim = 8};
  c.layout = static_cast<PageLayout>(7);
  try {
    KvCache<float> cache(c);
    ADD_FAILURE() << "no error";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "layout") << e.what();
  }
}

}  // namespace
}  // namespace tileattn
