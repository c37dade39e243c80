// tests/paged/kv_cache_test.cpp: the KV cache manager (kv_cache.hpp) against a model that keeps
// each sequence's tokens as a list: appended tokens read back bitwise through pages() and the
// pools, fork and share_prefix share pages and copy a partly filled one on write, truncate and
// free return pages (never leaking one), out_of_pages and every bad argument change nothing,
// and a long random run of every operation matches the model after each step.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tileattn/kv_cache.hpp"

namespace tileattn {
namespace {

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Element (h, d) of token `tag`'s K (kv 0) or V (kv 1) row in `layer`: a hash mapped to a
/// magnitude in [0.25, 2) with a random sign (never zero), rounded to T.
template <class T>
T token_value(std::int64_t tag, index_t layer, int kv, index_t h, index_t d) {
  std::uint64_t x = static_cast<std::uint64_t>(tag) * 0x9E3779B97F4A7C15ull ^
                    static_cast<std::uint64_t>((layer << 40) ^ (index_t{kv} << 39) ^ (h << 20) ^ d);
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finalizer
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float magnitude = 0.25f + 1.75f * static_cast<float>(x >> 40) * 0x1p-24f;
  return from_float<T>((x & 1) ? -magnitude : magnitude);
}

/// A KvCache and the model it must match: each sequence's tokens as tags (-1: a position
/// extend reserved and nothing wrote). Every operation goes to both.
template <class T>
struct Harness {
  KvCache<T> cache;
  std::map<SequenceId, std::vector<std::int64_t>> model;
  std::int64_t next_tag = 0;

  explicit Harness(const KvCacheConfig& config) : cache(config) {}

  index_t ps() const { return cache.page_size(); }
  index_t heads() const { return cache.config().heads_kv; }
  index_t dim(int kv) const { return kv == 0 ? cache.config().head_dim : cache.config().head_dim_v; }

  /// Rows [layers, n, heads_kv, dim(kv)] of these tags for layers [layer0, layer0 + layers); at
  /// least one element, so a view of it is never null.
  std::vector<T> rows(const std::vector<std::int64_t>& tags, int kv, index_t layer0, index_t layers) const {
    std::vector<T> out;
    for (index_t l = layer0; l < layer0 + layers; ++l)
      for (std::int64_t tag : tags)
        for (index_t h = 0; h < heads(); ++h)
          for (index_t d = 0; d < dim(kv); ++d) out.push_back(token_value<T>(tag, l, kv, h, d));
    if (out.empty()) out.resize(1);
    return out;
  }
  std::vector<std::int64_t> fresh_tags(index_t n) {
    std::vector<std::int64_t> tags(static_cast<std::size_t>(n));
    for (auto& t : tags) t = next_tag++;
    return tags;
  }

  SequenceId create() { return add(cache.create(), {}); }
  SequenceId fork(SequenceId parent) { return add(cache.fork(parent), model.at(parent)); }
  SequenceId share_prefix(SequenceId source, index_t tokens) {
    const auto& src = model.at(source);
    return add(cache.share_prefix(source, tokens), {src.begin(), src.begin() + tokens});
  }
  void append(SequenceId s, index_t n) {
    const auto tags = fresh_tags(n);
    const index_t L = cache.num_layers();
    const auto k = rows(tags, 0, 0, L), v = rows(tags, 1, 0, L);
    cache.append(s, make_bshd(k.data(), L, n, heads(), dim(0)), make_bshd(v.data(), L, n, heads(), dim(1)));
    model.at(s).insert(model.at(s).end(), tags.begin(), tags.end());
  }
  void extend(SequenceId s, index_t n) {
    cache.extend(s, n);
    model.at(s).resize(model.at(s).size() + static_cast<std::size_t>(n), -1);
  }
  /// Writes n new tokens at position0 in every layer.
  void write(SequenceId s, index_t position0, index_t n) {
    const auto tags = fresh_tags(n);
    for (index_t l = 0; l < cache.num_layers(); ++l) {
      const auto k = rows(tags, 0, l, 1), v = rows(tags, 1, l, 1);
      cache.write(l, s, position0, rows3(k.data(), n, 0), rows3(v.data(), n, 1));
    }
    std::copy(tags.begin(), tags.end(), model.at(s).begin() + position0);
  }
  StridedView<const T, 3> rows3(const T* data, index_t n, int kv) const {
    return {data, {n, heads(), dim(kv)}, {heads() * dim(kv), dim(kv), 1}};
  }
  void truncate(SequenceId s, index_t new_length) {
    cache.truncate(s, new_length);
    model.at(s).resize(static_cast<std::size_t>(new_length));
  }
  void free(SequenceId s) {
    cache.free(s);
    model.erase(s);
  }
  void free_all() {
    while (!model.empty()) free(model.begin()->first);
  }

  /// How many block tables list each page (the reference counts the cache must keep).
  std::vector<index_t> table_counts() const {
    std::vector<index_t> counts(static_cast<std::size_t>(cache.num_pages()), 0);
    for (const auto& [s, tokens] : model)
      for (std::int32_t p : cache.pages(s))
        if (p >= 0 && p < cache.num_pages()) ++counts[static_cast<std::size_t>(p)];
    return counts;
  }

  /// The cache against the model: sequences, lengths, block tables, reference counts, the
  /// page count invariant and every written token, bitwise, in every layer.
  ::testing::AssertionResult matches() const {
    const auto fail = [] { return ::testing::AssertionFailure(); };
    if (cache.num_sequences() != static_cast<index_t>(model.size()))
      return fail() << cache.num_sequences() << " sequences, model " << model.size();
    for (const auto& [s, tokens] : model) {
      const auto L = static_cast<index_t>(tokens.size());
      const auto pages = cache.pages(s);
      if (cache.length(s) != L)
        return fail() << "sequence " << s << " length " << cache.length(s) << ", model " << L;
      if (static_cast<index_t>(pages.size()) != (L + ps() - 1) / ps())
        return fail() << "sequence " << s << " holds " << pages.size() << " pages for " << L << " tokens";
      std::vector<std::int32_t> sorted(pages.begin(), pages.end());
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
          (!sorted.empty() && (sorted.front() < 0 || sorted.back() >= cache.num_pages())))
        return ::testing::AssertionFailure() << "sequence " << s << " lists a page twice or out of range";
    }
    const auto counts = table_counts();
    index_t in_use = 0;
    for (std::int32_t p = 0; p < cache.num_pages(); ++p) {
      const index_t listed = counts[static_cast<std::size_t>(p)];
      if (cache.ref_count(p) != listed)
        return fail() << "page " << p << " ref_count " << cache.ref_count(p) << ", listed by " << listed;
      in_use += listed > 0;
    }
    if (cache.free_pages() + in_use != cache.num_pages())
      return fail() << cache.free_pages() << " free + " << in_use << " in use != " << cache.num_pages();
    for (const auto& [s, tokens] : model)
      for (std::size_t t = 0; t < tokens.size(); ++t)
        if (tokens[t] >= 0)
          if (auto failure = token_matches(s, static_cast<index_t>(t), tokens[t]); !failure) return failure;
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult token_matches(SequenceId s, index_t t, std::int64_t tag) const {
    const index_t page = cache.pages(s)[static_cast<std::size_t>(t / ps())], row = t % ps();
    for (index_t l = 0; l < cache.num_layers(); ++l)
      for (int kv : {0, 1}) {
        const auto pool = kv == 0 ? cache.k_pages(l) : cache.v_pages(l);
        for (index_t h = 0; h < heads(); ++h)
          for (index_t d = 0; d < dim(kv); ++d)
            if (!same_bits(pool(page, row, h, d), token_value<T>(tag, l, kv, h, d)))
              return ::testing::AssertionFailure() << "sequence " << s << " token " << t << " layer " << l
                                                   << (kv ? " V" : " K") << " head " << h << " element " << d;
      }
    return ::testing::AssertionSuccess();
  }

 private:
  SequenceId add(SequenceId s, std::vector<std::int64_t> tokens) {
    model[s] = std::move(tokens);
    return s;
  }
};

/// Everything observable about a cache: the pools' bytes, block tables, lengths, counts.
template <class T>
struct Snapshot {
  std::vector<std::vector<T>> pools;
  std::map<SequenceId, std::pair<std::vector<std::int32_t>, index_t>> tables;
  std::vector<index_t> ref_counts;
  index_t free_pages = 0, num_sequences = 0;

  Snapshot(const Harness<T>& h) {
    const KvCache<T>& c = h.cache;
    for (index_t l = 0; l < c.num_layers(); ++l)
      for (const auto& pool : {c.k_pages(l), c.v_pages(l)})
        pools.emplace_back(pool.data, pool.data + pool.shape[0] * pool.stride[0]);
    for (const auto& [s, tokens] : h.model) tables[s] = {{c.pages(s).begin(), c.pages(s).end()}, c.length(s)};
    for (index_t p = 0; p < c.num_pages(); ++p) ref_counts.push_back(c.ref_count(static_cast<std::int32_t>(p)));
    free_pages = c.free_pages();
    num_sequences = c.num_sequences();
  }
  bool operator==(const Snapshot& o) const {
    if (pools.size() != o.pools.size()) return false;
    for (std::size_t i = 0; i < pools.size(); ++i)
      if (pools[i].size() != o.pools[i].size() ||
          std::memcmp(pools[i].data(), o.pools[i].data(), pools[i].size() * sizeof(T)) != 0)
        return false;
    return tables == o.tables && ref_counts == o.ref_counts && free_pages == o.free_pages &&
           num_sequences == o.num_sequences;
  }
};

/// The bytes of one sequence's pages, every layer (to see that they did not change).
template <class T>
std::vector<T> page_bytes(const KvCache<T>& c, SequenceId s) {
  std::vector<T> out;
  for (index_t l = 0; l < c.num_layers(); ++l)
    for (const auto& pool : {c.k_pages(l), c.v_pages(l)})
      for (std::int32_t p : c.pages(s))
        out.insert(out.end(), pool.data + p * pool.stride[0], pool.data + (p + 1) * pool.stride[0]);
  return out;
}

template <class T>
bool same_pages(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

KvCacheConfig config(index_t layers, index_t pages, index_t page_size, index_t heads, index_t dim,
                     index_t dim_v = 0) {
  KvCacheConfig c;
  c.num_layers = layers;
  c.num_pages = pages;
  c.page_size = page_size;
  c.heads_kv = heads;
  c.head_dim = dim;
  c.head_dim_v = dim_v;
  return c;
}

template <class T>
class KvCacheTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, fp16>;
TYPED_TEST_SUITE(KvCacheTest, StorageTypes);

TYPED_TEST(KvCacheTest, AppendThenReadBackEveryToken) {
  for (index_t page_size : {1, 3, 16, 17})
    for (index_t heads : {1, 2})
      for (index_t dim : {1, 7, 64}) {
        SCOPED_TRACE("page_size " + std::to_string(page_size) + ", heads " + std::to_string(heads) +
                     ", head_dim " + std::to_string(dim));
        Harness<TypeParam> h(config(dim == 64 ? 2 : 3, 64, page_size, heads, dim, dim == 7 ? 5 : 0));
        const SequenceId a = h.create(), b = h.create(), c = h.create();
        for (index_t chunk : {index_t{1}, page_size - 1, page_size, page_size + 2, index_t{5}})
          for (SequenceId s : {a, b, c}) {  // interleaved, so sequences' pages interleave
            h.append(s, chunk);
            ASSERT_TRUE(h.matches());
          }
        h.free_all();
        EXPECT_EQ(h.cache.free_pages(), h.cache.num_pages());
      }
}

TYPED_TEST(KvCacheTest, ForkSharesEveryPage) {
  Harness<TypeParam> h(config(2, 16, 3, 2, 7));
  const SequenceId parent = h.create();
  h.append(parent, 8);  // pages 0, 1, 2; the last holds 2 of 3 rows
  const SequenceId child = h.fork(parent);
  EXPECT_NE(child, parent);
  EXPECT_EQ(h.cache.length(child), 8);
  EXPECT_TRUE(std::ranges::equal(h.cache.pages(child), h.cache.pages(parent)));
  for (std::int32_t p : h.cache.pages(parent)) EXPECT_EQ(h.cache.ref_count(p), 2);
  EXPECT_EQ(h.cache.free_pages(), 13);
  EXPECT_TRUE(h.matches());  // the child reads the parent's tokens
  h.free_all();
  EXPECT_EQ(h.cache.free_pages(), 16);
}

/// After a fork of a sequence whose last page is partly filled, appending to one side
/// (`to_child`) copies that page for it; the other side's pages stay bitwise unchanged.
template <class T>
void append_after_fork(bool to_child, index_t page_size) {
  SCOPED_TRACE("page_size " + std::to_string(page_size) + (to_child ? ", to the child" : ", to the parent"));
  Harness<T> h(config(3, 20, page_size, 2, 7, 4));
  const SequenceId parent = h.create();
  h.append(parent, 2 * page_size + 1);
  const SequenceId child = h.fork(parent);
  const SequenceId writer = to_child ? child : parent, other = to_child ? parent : child;
  const std::vector<std::int32_t> shared(h.cache.pages(parent).begin(), h.cache.pages(parent).end());
  const auto other_before = page_bytes(h.cache, other);
  const index_t free_before = h.cache.free_pages();

  h.append(writer, 2);  // fits the copied last page
  ASSERT_TRUE(h.matches());
  const auto pages = h.cache.pages(writer);
  EXPECT_EQ(pages[0], shared[0]);
  EXPECT_EQ(pages[1], shared[1]);
  EXPECT_NE(pages[2], shared[2]);  // the copy
  EXPECT_TRUE(std::ranges::equal(h.cache.pages(other), shared));
  EXPECT_TRUE(same_pages(page_bytes(h.cache, other), other_before));
  EXPECT_EQ(h.cache.ref_count(shared[0]), 2);
  EXPECT_EQ(h.cache.ref_count(shared[1]), 2);
  EXPECT_EQ(h.cache.ref_count(shared[2]), 1);
  EXPECT_EQ(h.cache.ref_count(pages[2]), 1);
  EXPECT_EQ(h.cache.free_pages(), free_before - 1);

  h.append(other, page_size);  // its last page is its own now: no copy, one new page
  EXPECT_TRUE(std::ranges::equal(h.cache.pages(other).first(3), shared));
  EXPECT_EQ(h.cache.free_pages(), free_before - 2);
  EXPECT_TRUE(h.matches());
  h.free_all();
  EXPECT_EQ(h.cache.free_pages(), h.cache.num_pages());
}

TYPED_TEST(KvCacheTest, AppendToChildAfterForkCopiesThePartlyFilledPage) {
  for (index_t page_size : {3, 16, 17}) append_after_fork<TypeParam>(true, page_size);
}

TYPED_TEST(KvCacheTest, AppendToParentAfterForkLeavesTheChildUnchanged) {
  for (index_t page_size : {3, 16, 17}) append_after_fork<TypeParam>(false, page_size);
}

TYPED_TEST(KvCacheTest, ForkOfFullPagesCopiesNothing) {
  for (index_t page_size : {1, 3, 17}) {
    Harness<TypeParam> h(config(2, 10, page_size, 1, 7));
    const SequenceId parent = h.create();
    h.append(parent, 2 * page_size);
    const SequenceId child = h.fork(parent);
    h.append(child, 1);
    h.append(parent, 1);
    EXPECT_EQ(h.cache.free_pages(), 10 - 4);  // 2 shared, one new page each
    EXPECT_EQ(h.cache.ref_count(h.cache.pages(child)[0]), 2);
    EXPECT_EQ(h.cache.ref_count(h.cache.pages(child)[1]), 2);
    EXPECT_NE(h.cache.pages(child)[2], h.cache.pages(parent)[2]);
    EXPECT_TRUE(h.matches());
    h.free_all();
    EXPECT_EQ(h.cache.free_pages(), 10);
  }
}

TYPED_TEST(KvCacheTest, SharePrefixOfWholeAndPartPages) {
  for (index_t page_size : {1, 3, 16, 17}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    Harness<TypeParam> h(config(2, 24, page_size, 2, 7));
    const SequenceId source = h.create();
    h.append(source, 3 * page_size + 1);
    const std::vector<std::int32_t> source_pages(h.cache.pages(source).begin(), h.cache.pages(source).end());
    const auto source_before = page_bytes(h.cache, source);

    const SequenceId whole = h.share_prefix(source, 2 * page_size);  // two full pages, shared
    EXPECT_TRUE(std::ranges::equal(h.cache.pages(whole), std::span(source_pages).first(2)));
    const index_t free_before = h.cache.free_pages();
    h.append(whole, 1);  // a new page, no copy
    EXPECT_EQ(h.cache.free_pages(), free_before - 1);
    EXPECT_EQ(h.cache.ref_count(source_pages[1]), 2);

    const SequenceId part = h.share_prefix(source, page_size + 1);  // page 1 shared, partly used
    ASSERT_TRUE(h.matches());
    h.append(part, 2);  // copies page 1 (when page_size > 1) and writes into the copy
    EXPECT_EQ(h.cache.pages(part)[0], source_pages[0]);
    if (page_size > 1) {
      EXPECT_NE(h.cache.pages(part)[1], source_pages[1]);
    }
    EXPECT_TRUE(same_pages(page_bytes(h.cache, source), source_before));

    const SequenceId empty = h.share_prefix(source, 0), all = h.share_prefix(source, h.cache.length(source));
    EXPECT_TRUE(h.cache.pages(empty).empty());
    EXPECT_TRUE(std::ranges::equal(h.cache.pages(all), source_pages));
    EXPECT_TRUE(h.matches());
    h.free_all();
    EXPECT_EQ(h.cache.free_pages(), 24);
  }
}

TYPED_TEST(KvCacheTest, TruncateThenAppendAgain) {
  for (index_t page_size : {1, 3, 16, 17}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    Harness<TypeParam> h(config(2, 16, page_size, 2, 7, 3));
    const SequenceId s = h.create();
    h.append(s, 3 * page_size + 2);
    // mid-page, a page boundary, 0, and mid-page (or 0) again
    for (index_t new_length : {2 * page_size + 1, 2 * page_size, index_t{0}, page_size / 2}) {
      h.truncate(s, new_length);
      ASSERT_TRUE(h.matches());
      EXPECT_EQ(h.cache.free_pages(), 16 - (new_length + page_size - 1) / page_size);
      h.append(s, page_size + 1);
      ASSERT_TRUE(h.matches());
    }
    const SequenceId child = h.fork(s);  // truncating one side of shared pages keeps the other
    h.truncate(s, 0);
    EXPECT_TRUE(h.matches());
    for (std::int32_t p : h.cache.pages(child)) EXPECT_EQ(h.cache.ref_count(p), 1);
    h.append(s, 2);
    EXPECT_TRUE(h.matches());
    h.free_all();
    EXPECT_EQ(h.cache.free_pages(), 16);
  }
}

TYPED_TEST(KvCacheTest, FreeReturnsPagesAndInvalidatesTheId) {
  Harness<TypeParam> h(config(1, 8, 4, 1, 1));
  const SequenceId a = h.create(), b = h.create();
  h.append(a, 9);
  h.append(b, 4);
  const SequenceId c = h.fork(a);
  EXPECT_EQ(h.cache.free_pages(), 4);
  h.free(a);
  EXPECT_EQ(h.cache.free_pages(), 4);  // c still holds a's pages
  EXPECT_FALSE(h.cache.contains(a));
  EXPECT_THROW(h.cache.length(a), invalid_argument);
  h.free(c);
  EXPECT_EQ(h.cache.free_pages(), 7);
  EXPECT_TRUE(h.matches());
  const SequenceId d = h.create();
  EXPECT_NE(d, a);  // ids are never reused
  h.append(d, 1);
  EXPECT_EQ(h.cache.pages(d)[0], 0);  // the lowest free page first
  h.free_all();
  EXPECT_EQ(h.cache.free_pages(), 8);
  EXPECT_EQ(h.cache.num_sequences(), 0);
}

TYPED_TEST(KvCacheTest, BatchTablesArePaddedWithPageZero) {
  Harness<TypeParam> h(config(1, 12, 3, 1, 1));
  const SequenceId a = h.create(), b = h.create(), c = h.create();
  h.append(b, 2);
  h.append(a, 7);  // 3 pages
  const auto t = h.cache.batch(std::vector<SequenceId>{c, a, b, a});
  EXPECT_EQ(t.max_pages, 3);
  EXPECT_EQ(t.cache_seqlens, (std::vector<std::int32_t>{0, 7, 2, 7}));
  const auto pa = h.cache.pages(a);
  const std::int32_t pb = h.cache.pages(b)[0];
  const std::vector<std::int32_t> want{0, 0, 0, pa[0], pa[1], pa[2], pb, 0, 0, pa[0], pa[1], pa[2]};
  EXPECT_EQ(t.block_table, want);
  const auto view = t.block_table_view();
  EXPECT_EQ(view.shape, (std::array<index_t, 2>{4, 3}));
  EXPECT_EQ(view.stride, (std::array<index_t, 2>{3, 1}));
  EXPECT_EQ(view(3, 2), pa[2]);
  EXPECT_TRUE(std::ranges::equal(t.seqlens(), t.cache_seqlens));
  const auto empty = h.cache.batch(std::vector<SequenceId>{c});
  EXPECT_EQ(empty.max_pages, 1);  // never an empty view
  EXPECT_EQ(empty.block_table, std::vector<std::int32_t>{0});
}

TYPED_TEST(KvCacheTest, OutOfPagesChangesNothing) {
  Harness<TypeParam> h(config(2, 5, 4, 2, 3));
  const SequenceId a = h.create(), b = h.create();
  h.append(a, 10);  // 3 pages, the last half full
  h.append(b, 8);   // 2 pages: none free
  const SequenceId c = h.fork(a);
  const Snapshot<TypeParam> before(h);
  const auto expect_out_of_pages = [&](const std::function<void()>& call, index_t needed) {
    try {
      call();
      ADD_FAILURE() << "no out_of_pages";
    } catch (const out_of_pages& e) {
      EXPECT_EQ(e.needed(), needed);
      EXPECT_EQ(e.available(), 0);
    }
    EXPECT_TRUE(Snapshot<TypeParam>(h) == before);
    EXPECT_TRUE(h.matches());
  };
  expect_out_of_pages([&] { h.cache.extend(c, 1); }, 1);  // a copy of the shared last page
  expect_out_of_pages([&] { h.cache.extend(a, 3); }, 2);  // the copy and one new page
  expect_out_of_pages([&] { h.append(c, 2); }, 1);
  expect_out_of_pages([&] { h.append(b, 1); }, 1);
  constexpr index_t max_length = KvCache<TypeParam>::max_length;
  expect_out_of_pages([&] { h.cache.extend(b, max_length - 8); }, (max_length + 3) / 4 - 2);
  h.extend(c, 0);  // needs nothing
  static_assert(std::is_base_of_v<std::runtime_error, out_of_pages> &&
                !std::is_base_of_v<std::invalid_argument, out_of_pages>);

  h.truncate(b, 4);  // one page free: now the copy fits
  h.append(c, 2);
  EXPECT_EQ(h.cache.free_pages(), 0);
  EXPECT_EQ(h.cache.ref_count(h.cache.pages(a)[2]), 1);
  EXPECT_TRUE(h.matches());
  h.free_all();
  EXPECT_EQ(h.cache.free_pages(), 5);
}

TEST(KvCacheConfigChecks, EveryFieldIsChecked) {
  struct Case {
    const char* parameter;
    KvCacheConfig config;
  };
  const KvCacheConfig good = config(2, 4, 3, 2, 8);
  const auto with = [&](auto field, index_t value) {
    KvCacheConfig c = good;
    c.*field = value;
    return c;
  };
  const Case cases[] = {
      {"num_layers", with(&KvCacheConfig::num_layers, 0)},
      {"num_pages", with(&KvCacheConfig::num_pages, 0)},
      {"num_pages", with(&KvCacheConfig::num_pages, -3)},
      {"num_pages", with(&KvCacheConfig::num_pages, index_t{1} << 31)},  // block tables are int32
      {"page_size", with(&KvCacheConfig::page_size, 0)},
      {"heads_kv", with(&KvCacheConfig::heads_kv, 0)},
      {"head_dim", with(&KvCacheConfig::head_dim, 0)},
      {"head_dim_v", with(&KvCacheConfig::head_dim_v, -1)},
      {"num_pages", config(1, index_t{1} << 30, index_t{1} << 30, 1 << 10, 1)},  // 2^70 elements
      {"num_pages", config(1, 1 << 30, 1 << 30, 4, 1)},  // 2^62 floats: 2^64 bytes, past PTRDIFF_MAX
      // Issue 27, N5: at most max_allocation_bytes (2^47) in all, checked before allocating
      // (2^40 layers used to allocate until std::bad_alloc).
      {"num_pages", config(1, index_t{1} << 30, 1 << 10, 16, 16)},       // one layer: 2^51 bytes
      {"num_layers", config(index_t{1} << 40, 1, 1, 1, 1)},               // 2^40 small layers
      {"num_layers", config(index_t{1} << 20, 1 << 20, 16, 8, 128)},      // 2^20 layers of 2^37 bytes
      {"num_layers", config(std::numeric_limits<index_t>::max(), 1, 1, 1, 1)},
  };
  for (const Case& c : cases) {
    try {
      KvCache<float> cache(c.config);
      ADD_FAILURE() << c.parameter << ": no error";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), c.parameter) << e.what();
    }
  }
  EXPECT_EQ(KvCache<bf16>(good).config().head_dim_v, 8);  // 0: head_dim
}

TYPED_TEST(KvCacheTest, BadArgumentsAreNamedAndChangeNothing) {
  using T = TypeParam;
  Harness<T> h(config(2, 8, 3, 2, 4, 5));
  const SequenceId a = h.create(), b = h.create();
  h.append(a, 4);
  h.append(b, 2);
  h.fork(b);  // b's page is shared
  const SequenceId freed = h.create();
  h.free(freed);
  const SequenceId unknown = 99;
  const std::vector<T> k(64, from_float<T>(1.5f)), v(64, from_float<T>(-0.5f));
  const auto rows = [&](const std::vector<T>& data, index_t n, index_t heads, index_t dim) {
    return StridedView<const T, 3>{data.data(), {n, heads, dim}, {heads * dim, dim, 1}};
  };
  const auto k1 = rows(k, 1, 2, 4), v1 = rows(v, 1, 2, 5);
  const auto layers = [&](const std::vector<T>& data, index_t L, index_t n, index_t heads, index_t dim) {
    return make_bshd(data.data(), L, n, heads, dim);
  };
  auto& c = h.cache;
  const T* pool = c.k_pages(1).data;
  const index_t too_many = KvCache<T>::max_length;  // tokens: with a's 4, past int32
  struct Case {
    const char* parameter;
    std::function<void()> call;
  };
  const Case cases[] = {
      {"sequence", [&] { c.length(unknown); }},
      {"sequence", [&] { c.pages(freed); }},
      {"sequence", [&] { c.extend(unknown, 1); }},
      {"sequence", [&] { c.fork(freed); }},
      {"sequence", [&] { c.share_prefix(unknown, 0); }},
      {"sequence", [&] { c.truncate(unknown, 0); }},
      {"sequence", [&] { c.free(freed); }},
      {"sequence", [&] { c.write(0, unknown, 0, k1, v1); }},
      {"sequence", [&] { c.append(freed, layers(k, 2, 1, 2, 4), layers(v, 2, 1, 2, 5)); }},
      {"sequences[2]", [&] { c.batch(std::vector<SequenceId>{a, b, unknown}); }},
      {"n", [&] { c.extend(a, -1); }},
      {"n", [&] { c.extend(a, KvCache<T>::max_length - 3); }},  // length 2^31: past int32
      {"new_length", [&] { c.truncate(a, -1); }},
      {"new_length", [&] { c.truncate(a, 5); }},
      {"tokens", [&] { c.share_prefix(a, -1); }},
      {"tokens", [&] { c.share_prefix(a, 5); }},
      {"position0", [&] { c.write(0, b, 1, k1, v1); }},       // page shared with its fork
      {"position0", [&] { c.write(1, a, 4, k1, v1); }},       // past the length
      {"position0", [&] { c.write(1, a, 3, rows(k, 2, 2, 4), rows(v, 2, 2, 5)); }},
      {"position0", [&] { c.write(1, a, -1, k1, v1); }},
      {"position0", [&] { c.write(1, a, std::numeric_limits<index_t>::max(), k1, v1); }},  // issue 27, N4
      {"layer", [&] { c.write(2, a, 0, k1, v1); }},
      {"layer", [&] { c.write(-1, a, 0, k1, v1); }},
      {"layer", [&] { c.k_pages(2); }},
      {"page", [&] { c.ref_count(8); }},
      {"page", [&] { c.ref_count(-1); }},
      {"k_new.shape[1] (heads_kv)", [&] { c.write(0, a, 0, rows(k, 1, 1, 4), v1); }},
      {"k_new.shape[2] (head_dim)", [&] { c.write(0, a, 0, rows(k, 1, 2, 5), v1); }},
      {"v_new.shape[2] (head_dim_v)", [&] { c.write(0, a, 0, k1, rows(v, 1, 2, 4)); }},
      {"v_new.shape[0] (num_tokens)", [&] { c.write(0, a, 0, k1, rows(v, 2, 2, 5)); }},
      {"k_new", [&] { c.write(0, a, 0, {pool, k1.shape, k1.stride}, v1); }},  // inside the cache
      {"k_new.shape[0] (num_layers)", [&] { c.append(a, layers(k, 1, 1, 2, 4), layers(v, 1, 1, 2, 5)); }},
      {"v_new.shape[0] (num_layers)", [&] { c.append(a, layers(k, 2, 1, 2, 4), layers(v, 3, 1, 2, 5)); }},
      {"v_new.shape[1] (num_tokens)", [&] { c.append(a, layers(k, 2, 1, 2, 4), layers(v, 2, 2, 2, 5)); }},
      {"k_new.shape[3] (head_dim)", [&] { c.append(a, layers(k, 2, 1, 2, 5), layers(v, 2, 1, 2, 5)); }},
      {"v_new.shape[2] (heads_kv)", [&] { c.append(a, layers(k, 2, 1, 2, 4), layers(v, 2, 1, 1, 5)); }},
      {"v_new", [&] { c.append(a, layers(k, 2, 1, 2, 4), make_bshd(pool, 2, 1, 2, 5)); }},
      {"k_new", [&] { c.append(a, {nullptr, {2, 1, 2, 4}, {8, 8, 4, 1}}, layers(v, 2, 1, 2, 5)); }},
      {"n", [&] { c.append(a, {k.data(), {2, too_many, 2, 4}, {0, 0, 4, 1}},
                           {v.data(), {2, too_many, 2, 5}, {0, 0, 5, 1}}); }},
  };
  for (const Case& test : cases) {
    const Snapshot<T> before(h);
    try {
      test.call();
      ADD_FAILURE() << test.parameter << ": no error";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), test.parameter) << e.what();
    }
    EXPECT_TRUE(Snapshot<T>(h) == before) << test.parameter << ": the cache changed";
  }
  EXPECT_TRUE(h.matches());
  h.free_all();
  EXPECT_EQ(c.free_pages(), 8);
}

/// One random operation on a random sequence, checked against the model's prediction: which
/// calls must throw (out_of_pages, a write into a shared page) and how many pages a call takes.
template <class T>
void random_step(Harness<T>& h, std::mt19937_64& rng) {
  const auto pick = [&](index_t n) { return static_cast<index_t>(rng() % static_cast<std::uint64_t>(n)); };
  if (h.model.empty() || (h.model.size() < 6 && pick(8) == 0)) {
    h.create();
    return;
  }
  auto it = h.model.begin();
  std::advance(it, pick(static_cast<index_t>(h.model.size())));
  const SequenceId s = it->first;
  const index_t L = static_cast<index_t>(it->second.size()), ps = h.ps();
  const auto counts = h.table_counts();
  const auto shared = [&](index_t position) {
    return counts[static_cast<std::size_t>(h.cache.pages(s)[static_cast<std::size_t>(position / ps)])] > 1;
  };
  const auto pages_needed = [&](index_t n) {
    if (n == 0) return index_t{0};
    return (L + n + ps - 1) / ps - (L + ps - 1) / ps + (L % ps != 0 && shared(L - 1));
  };
  const auto in_use = std::count_if(counts.begin(), counts.end(), [](index_t c) { return c > 0; });
  const index_t free_pages = h.cache.num_pages() - static_cast<index_t>(in_use);
  const Snapshot<T> before(h);
  switch (pick(8)) {
    case 0:
      if (h.model.size() < 8) h.fork(s);
      break;
    case 1:
      if (h.model.size() < 8) h.share_prefix(s, pick(L + 1));
      break;
    case 2:
    case 3:
    case 4: {
      const index_t n = pick(2 * ps + 2), needed = pages_needed(n);
      const bool fits = needed <= free_pages;
      const bool append = pick(3) != 0;
      try {
        append ? h.append(s, n) : h.extend(s, n);
        EXPECT_TRUE(fits) << "no out_of_pages";
      } catch (const out_of_pages&) {
        EXPECT_FALSE(fits) << "out_of_pages with enough free pages";
        EXPECT_TRUE(Snapshot<T>(h) == before);
      }
      if (fits) {
        EXPECT_EQ(h.cache.free_pages(), free_pages - needed);
      }
      break;
    }
    case 5: {
      if (L == 0) break;
      const index_t position0 = pick(L), n = 1 + pick(L - position0);
      bool touches_shared = false;
      for (index_t p = position0; p < position0 + n; ++p) touches_shared |= shared(p);
      try {
        h.write(s, position0, n);
        EXPECT_FALSE(touches_shared) << "wrote into a shared page";
      } catch (const invalid_argument& e) {
        EXPECT_TRUE(touches_shared) << e.what();
        EXPECT_EQ(e.parameter(), "position0");
        EXPECT_TRUE(Snapshot<T>(h) == before);
      }
      break;
    }
    case 6:
      h.truncate(s, pick(L + 1));
      break;
    case 7:
      h.free(s);
      break;
  }
}

TYPED_TEST(KvCacheTest, RandomOperationsMatchTheModel) {
  KvCacheConfig head_major = config(2, 20, 3, 2, 7, 5);
  head_major.layout = PageLayout::head_major;
  const KvCacheConfig configs[] = {config(1, 12, 1, 1, 1), config(2, 20, 3, 2, 7, 5), config(2, 14, 17, 1, 3),
                                   config(3, 16, 16, 2, 1, 2), head_major};
  std::uint64_t seed = 7;
  for (const KvCacheConfig& c : configs) {
    SCOPED_TRACE("page_size " + std::to_string(c.page_size) + ", " + to_string(c.layout));
    Harness<TypeParam> h(c);
    std::mt19937_64 rng(++seed);
    for (int step = 0; step < 1500; ++step) {
      random_step(h, rng);
      ASSERT_TRUE(h.matches()) << "after step " << step;
    }
    h.free_all();
    EXPECT_EQ(h.cache.free_pages(), c.num_pages);
  }
}

}  // namespace
}  // namespace tileattn
