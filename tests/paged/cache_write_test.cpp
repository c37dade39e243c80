// tests/paged/cache_write_test.cpp: write_kv_slots (cache_write.hpp): every token lands in its
// slot bitwise and -1 skips it, for awkward page sizes and head dims, strided rows and
// interleaved pools; every bad argument throws invalid_argument naming it, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "tileattn/cache_write.hpp"

namespace tileattn {
namespace {

/// n values of magnitude in [0.25, 2) and random sign (never zero), rounded to T.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.25f, 2.0f);
  std::vector<T> out(n);
  for (T& x : out) x = from_float<T>((rng() & 1) ? magnitude(rng) : -magnitude(rng));
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Shape {
  index_t num_pages, page_size, heads_kv, head_dim, head_dim_v;
  index_t slots() const { return num_pages * page_size; }
};

/// Contiguous [n, heads, dim] rows over `data`.
template <class T>
StridedView<const T, 3> rows_view(const T* data, index_t n, index_t heads, index_t dim) {
  return {data, {n, heads, dim}, {heads * dim, dim, 1}};
}

/// `count` distinct slots in [0, shape.slots()), about a quarter of them replaced by -1.
std::vector<std::int64_t> random_slots(index_t count, index_t num_slots, std::uint64_t seed) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<std::size_t>(count));
  for (auto& s : all)
    if (rng() % 4 == 0) s = -1;
  return all;
}

/// What write_kv_slots should leave in `pool`: rows copied element by element.
template <class T>
void expected_write(const StridedView<const T, 3>& rows, const std::vector<std::int64_t>& slots,
                    const PagePoolView<T>& pool) {
  const index_t page_size = pool.shape[1];
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= 0)
      for (index_t h = 0; h < rows.shape[1]; ++h)
        for (index_t d = 0; d < rows.shape[2]; ++d)
          pool(slots[i] / page_size, slots[i] % page_size, h, d) = rows(static_cast<index_t>(i), h, d);
}

template <class T>
class CacheWriteTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, fp16>;
TYPED_TEST_SUITE(CacheWriteTest, StorageTypes);

TYPED_TEST(CacheWriteTest, WritesEveryTokenToItsSlot) {
  using T = TypeParam;
  std::uint64_t seed = 1;
  for (index_t page_size : {1, 3, 16, 17})
    for (index_t heads : {1, 2})
      for (index_t dim : {1, 7, 64}) {
        const Shape s{5, page_size, heads, dim, dim == 7 ? 3 : dim};
        SCOPED_TRACE("page_size " + std::to_string(page_size) + ", heads " + std::to_string(heads) +
                     ", head_dim " + std::to_string(dim));
        const index_t n = std::min<index_t>(s.slots(), 2 * page_size + 3);
        auto k_pool = random_values<T>(static_cast<std::size_t>(s.slots() * heads * dim), ++seed);
        auto v_pool = random_values<T>(static_cast<std::size_t>(s.slots() * heads * s.head_dim_v), ++seed);
        const auto k_rows = random_values<T>(static_cast<std::size_t>(n * heads * dim), ++seed);
        const auto v_rows = random_values<T>(static_cast<std::size_t>(n * heads * s.head_dim_v), ++seed);
        const auto slots = random_slots(n, s.slots(), ++seed);
        auto k_want = k_pool, v_want = v_pool;
        const auto k_new = rows_view(k_rows.data(), n, heads, dim);
        const auto v_new = rows_view(v_rows.data(), n, heads, s.head_dim_v);
        expected_write(k_new, slots, make_page_pool(k_want.data(), s.num_pages, page_size, heads, dim));
        expected_write(v_new, slots,
                       make_page_pool(v_want.data(), s.num_pages, page_size, heads, s.head_dim_v));

        write_kv_slots(k_new, v_new, make_page_pool(k_pool.data(), s.num_pages, page_size, heads, dim),
                       make_page_pool(v_pool.data(), s.num_pages, page_size, heads, s.head_dim_v), slots);
        EXPECT_TRUE(same_bits(k_pool, k_want));
        EXPECT_TRUE(same_bits(v_pool, v_want));
      }
}

TYPED_TEST(CacheWriteTest, StridedRowsIntoInterleavedPools) {
  // k_new dimension-major [heads, dim, n], v_new rows padded by 3; K and V pages interleaved
  // in one buffer [num_pages, 2, page_size, heads, dim] (FlashInfer's layout).
  using T = TypeParam;
  const index_t P = 4, S = 3, H = 2, D = 7, n = 9;
  auto pool = random_values<T>(static_cast<std::size_t>(P * 2 * S * H * D), 11);
  const auto k_rows = random_values<T>(static_cast<std::size_t>(H * D * n), 12);
  const auto v_rows = random_values<T>(static_cast<std::size_t>(n * H * (D + 3)), 13);
  const StridedView<const T, 3> k_new{k_rows.data(), {n, H, D}, {1, D * n, n}};
  const StridedView<const T, 3> v_new{v_rows.data(), {n, H, D}, {H * (D + 3), D + 3, 1}};
  const auto pool_at = [&](std::vector<T>& buffer, index_t kv) {
    return PagePoolView<T>{buffer.data() + kv * S * H * D, {P, S, H, D}, {2 * S * H * D, H * D, D, 1}};
  };
  const auto slots = random_slots(n, P * S, 14);
  auto want = pool;
  expected_write(k_new, slots, pool_at(want, 0));
  expected_write(v_new, slots, pool_at(want, 1));

  write_kv_slots(k_new, v_new, pool_at(pool, 0), pool_at(pool, 1), slots);
  EXPECT_TRUE(same_bits(pool, want));
  // V's pages one row after K's share K's rows 1 to S - 1 (issue 27, N2): rejected.
  PagePoolView<T> shifted = pool_at(pool, 0);
  shifted.data += H * D;
  EXPECT_THROW(write_kv_slots(k_new, v_new, pool_at(pool, 0), shifted, slots), invalid_argument);
  EXPECT_TRUE(same_bits(pool, want));
}

TYPED_TEST(CacheWriteTest, SkippedAndEmptyBatchesWriteNothing) {
  using T = TypeParam;
  auto k_pool = random_values<T>(2 * 3 * 2 * 4, 21), v_pool = random_values<T>(2 * 3 * 2 * 4, 22);
  const auto k_before = k_pool, v_before = v_pool;
  const auto rows = random_values<T>(5 * 2 * 4, 23);
  const auto k_cache = make_page_pool(k_pool.data(), 2, 3, 2, 4);
  const auto v_cache = make_page_pool(v_pool.data(), 2, 3, 2, 4);
  const std::vector<std::int64_t> skip_all(5, -1), none;
  write_kv_slots(rows_view(rows.data(), 5, 2, 4), rows_view(rows.data(), 5, 2, 4), k_cache, v_cache, skip_all);
  write_kv_slots(rows_view(rows.data(), 0, 2, 4), rows_view(rows.data(), 0, 2, 4), k_cache, v_cache, none);
  EXPECT_TRUE(same_bits(k_pool, k_before));
  EXPECT_TRUE(same_bits(v_pool, v_before));
}

/// A valid call (4 pages of 3 rows, 2 heads, head_dim 5, head_dim_v 4, 4 tokens) that a test
/// then breaks; rejected() runs it and reports what it threw and whether the pools changed.
struct Call {
  static constexpr index_t P = 4, S = 3, H = 2, D = 5, Dv = 4, n = 4;
  std::vector<float> k_pool = random_values<float>(P * S * H * D, 31);
  std::vector<float> v_pool = random_values<float>(P * S * H * Dv, 32);
  std::vector<float> k_rows = random_values<float>(2 * n * H * D, 33);  // twice the rows a call reads
  std::vector<float> v_rows = random_values<float>(2 * n * H * Dv, 34);
  StridedView<const float, 3> k_new = rows_view<float>(k_rows.data(), n, H, D);
  StridedView<const float, 3> v_new = rows_view<float>(v_rows.data(), n, H, Dv);
  PagePoolView<float> k_cache = make_page_pool(k_pool.data(), P, S, H, D);
  PagePoolView<float> v_cache = make_page_pool(v_pool.data(), P, S, H, Dv);
  std::vector<std::int64_t> slots{0, 7, -1, 11};
  const std::int64_t* slots_at = nullptr;  // when set, the call reads slots.size() entries from here

  /// Copies the slots to float `at` of `buffer` (a pool) and has the call read them there.
  void move_slots_into(std::vector<float>& buffer, std::size_t at) {
    std::memcpy(buffer.data() + at, slots.data(), slots.size() * sizeof(std::int64_t));
    slots_at = reinterpret_cast<const std::int64_t*>(buffer.data() + at);
  }

  /// The parameter() of the invalid_argument the call throws ("" when it does not throw); when
  /// it throws, the pools must be bitwise unchanged.
  std::string rejected(std::string* what = nullptr) {
    const auto k_before = k_pool, v_before = v_pool;
    std::string parameter;
    try {
      const std::span<const std::int64_t> mapping = slots_at ? std::span(slots_at, slots.size()) : std::span(slots);
      write_kv_slots(k_new, v_new, k_cache, v_cache, mapping);
    } catch (const invalid_argument& e) {
      parameter = e.parameter();
      if (what) *what = e.what();
      EXPECT_TRUE(same_bits(k_pool, k_before) && same_bits(v_pool, v_before)) << "the pools changed";
    }
    return parameter;
  }
};

TEST(CacheWriteChecks, TheValidCallRuns) {
  Call c;
  EXPECT_EQ(c.rejected(), "");
  Call fresh;
  EXPECT_FALSE(same_bits(c.k_pool, fresh.k_pool));
}

TEST(CacheWriteChecks, SlotOutOfRangeNamesIndexAndValue) {
  for (std::int64_t bad : {Call::P * Call::S, std::int64_t{-2}, std::int64_t{1} << 40}) {
    Call c;
    c.slots[2] = bad;
    std::string what;
    EXPECT_EQ(c.rejected(&what), "slot_mapping");
    EXPECT_NE(what.find("slot_mapping[2] = " + std::to_string(bad)), std::string::npos) << what;
  }
}

TEST(CacheWriteChecks, DuplicateSlotNamesBothIndices) {
  Call c;
  c.slots = {5, 7, -1, 5};
  std::string what;
  EXPECT_EQ(c.rejected(&what), "slot_mapping");
  EXPECT_NE(what.find("duplicate: slot_mapping[0] and slot_mapping[3] are both slot 5"), std::string::npos)
      << what;
  Call minus_ones;
  minus_ones.slots = {-1, 2, -1, -1};  // -1 may repeat
  EXPECT_EQ(minus_ones.rejected(), "");
}

TEST(CacheWriteChecks, EveryBadArgumentIsNamed) {
  struct Case {
    const char* parameter;
    std::function<void(Call&)> breaks;
  };
  const Case cases[] = {
      {"slot_mapping", [](Call& c) { c.slots.pop_back(); }},
      {"v_new.shape[0] (num_tokens)", [](Call& c) { c.v_new.shape[0] = 3; }},
      {"k_new.shape[1] (heads_kv)", [](Call& c) { c.k_new = rows_view<float>(c.k_rows.data(), 4, 1, 5); }},
      {"k_new.shape[2] (head_dim)", [](Call& c) { c.k_new = rows_view<float>(c.k_rows.data(), 4, 2, 4); }},
      {"v_new.shape[2] (head_dim_v)", [](Call& c) { c.v_new = rows_view<float>(c.v_rows.data(), 4, 2, 5); }},
      {"v_cache.shape[0] (num_pages)", [](Call& c) { c.v_cache.shape[0] = 3; }},
      {"v_cache.shape[1] (page_size)", [](Call& c) { c.v_cache.shape[1] = 2; }},
      {"k_cache.shape[1] (page_size)", [](Call& c) { c.k_cache.shape[1] = c.v_cache.shape[1] = 0; }},
      {"k_cache.shape[2] (heads_kv)", [](Call& c) { c.k_cache.shape[2] = -1; }},
      {"k_new", [](Call& c) { c.k_new.data = nullptr; }},
      {"v_cache", [](Call& c) { c.v_cache.data = nullptr; }},
      {"k_new.stride[0] (num_tokens)", [](Call& c) { c.k_new.stride[0] = -1; }},
      {"k_cache.stride", [](Call& c) { c.k_cache.stride[0] = 0; }},  // two pages on one
      {"k_cache", [](Call& c) { c.k_new.data = c.k_pool.data() + 7; }},
      {"k_cache", [](Call& c) { c.v_new = rows_view<const float>(c.k_pool.data() + 3, 4, 2, 4); }},
      {"v_cache", [](Call& c) { c.v_new = rows_view<const float>(c.v_pool.data() + 1, 4, 2, 4); }},
      // Issue 27, N2: both pools are written, V's rows over K's when they overlap.
      {"v_cache", [](Call& c) { c.v_cache = make_page_pool(c.k_pool.data() + 10, Call::P, Call::S, Call::H, Call::Dv); }},
      {"v_cache", [](Call& c) { c.v_cache = c.k_cache; c.v_cache.shape[3] = Call::Dv; }},
      // Issue 27, N1: slot_mapping is read while the pools are written.
      {"k_cache", [](Call& c) { c.move_slots_into(c.k_pool, 40); }},
      {"v_cache", [](Call& c) { c.move_slots_into(c.v_pool, 0); }},
  };
  for (const Case& test : cases) {
    Call c;
    test.breaks(c);
    EXPECT_EQ(c.rejected(), test.parameter);
  }
}

}  // namespace
}  // namespace tileattn
