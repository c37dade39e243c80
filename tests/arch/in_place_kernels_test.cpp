// tests/arch/in_place_kernels_test.cpp: the products that read K and V rows in place (the
// decode path of kernels/forward.hpp) on the arch this TU is built for, against generic
// (bitwise: they sum in the same order) and a double-precision reference: Q K^T by dot
// products over scattered key rows (gemm_nt_rows) and P V over scattered value rows
// (gemm_rows), for float, bf16 and fp16 rows, over awkward shapes; the same products with Q
// and P as bf16 pairs over bf16 rows (gemm_nt_rows_pairs, gemm_rows_pairs: vdpbf16ps where
// in_place_pairs); all_finite over 16-bit rows; touch_rows on rows that end at the end of
// their allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/core/half_types.hpp"

namespace tileattn::arch {
namespace {

template <class E>
class InPlaceKernels : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, fp16>;
TYPED_TEST_SUITE(InPlaceKernels, StorageTypes);

/// n rows of `cols` elements, each in its own allocation slot at a scattered offset.
template <class E>
struct ScatteredRows {
  std::vector<E> pool;
  std::vector<const E*> rows;
  ScatteredRows(index_t n, index_t cols, std::mt19937& rng) {
    const index_t stride = cols + 5;
    pool.resize(static_cast<std::size_t>(n * stride * 2 + 8));
    std::normal_distribution<float> normal;
    for (auto& x : pool) x = from_float<E>(normal(rng));
    std::vector<index_t> slot(static_cast<std::size_t>(2 * n));
    for (index_t i = 0; i < 2 * n; ++i) slot[static_cast<std::size_t>(i)] = i;
    std::shuffle(slot.begin(), slot.end(), rng);
    for (index_t j = 0; j < n; ++j) rows.push_back(pool.data() + slot[static_cast<std::size_t>(j)] * stride + j % 3);
  }
};

/// start + the sum over p in [0, k) of a(p) b(p), in double, and the sum of the magnitudes
/// of the terms (|start| included): a reference value and the scale of its error bound.
struct DoubleSum {
  double value, magnitude;
};
template <class A, class B>
DoubleSum double_sum(double start, index_t k, A a, B b) {
  DoubleSum sum{start, std::abs(start)};
  for (index_t p = 0; p < k; ++p) {
    const double term = static_cast<double>(a(p)) * static_cast<double>(b(p));
    sum.value += term;
    sum.magnitude += std::abs(term);
  }
  return sum;
}

TYPED_TEST(InPlaceKernels, ScoresMatchGenericBitwiseAndDouble) {
  using E = TypeParam;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (index_t m : {1, 2, 3, 4, 5, 8})
    for (index_t n : {1, 7, 8, 9, 17, 128})
      for (index_t k : {1, 15, 16, 17, 64, 128, 130}) {
        ScatteredRows<E> keys(n, k, rng);
        std::vector<float> a(static_cast<std::size_t>(m * (k + 3)));
        for (auto& x : a) x = normal(rng);
        std::vector<float> c(static_cast<std::size_t>(m * (n + 2)), -7.0f), want(c);
        native::gemm_nt_rows(m, n, k, a.data(), k + 3, keys.rows.data(), c.data(), n + 2);
        generic::gemm_nt_rows(m, n, k, a.data(), k + 3, keys.rows.data(), want.data(), n + 2);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n + 2; ++j) {
            const float got = c[static_cast<std::size_t>(i * (n + 2) + j)];
            if (j >= n) {
              ASSERT_EQ(got, -7.0f) << "wrote past column n";
              continue;
            }
#if defined(__FMA__)
            ASSERT_EQ(std::memcmp(&got, &want[static_cast<std::size_t>(i * (n + 2) + j)], sizeof(float)), 0)
                << native::name << " m " << m << " n " << n << " k " << k;
#endif
            const DoubleSum ref = double_sum(
                0, k, [&](index_t p) { return a[static_cast<std::size_t>(i * (k + 3) + p)]; },
                [&](index_t p) { return to_float(keys.rows[static_cast<std::size_t>(j)][p]); });
            ASSERT_NEAR(got, ref.value, 1e-6 * (ref.magnitude + 1)) << "m " << m << " n " << n << " k " << k;
          }
      }
}

TYPED_TEST(InPlaceKernels, ValuesMatchGenericBitwiseAndDouble) {
  using E = TypeParam;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (index_t m : {1, 2, 3, 4, 7, 8, 9})
    for (index_t n : {1, 16, 17, 40, 64, 128, 129})
      for (index_t k : {1, 8, 13, 128}) {
        ScatteredRows<E> values(k, n, rng);
        std::vector<float> a(static_cast<std::size_t>(m * (k + 1)));
        for (auto& x : a) x = normal(rng);
        std::vector<float> c(static_cast<std::size_t>(m * (n + 3)));
        for (auto& x : c) x = normal(rng);
        std::vector<float> want(c), start(c);
        native::gemm_rows(m, n, k, a.data(), k + 1, values.rows.data(), c.data(), n + 3);
        generic::gemm_rows(m, n, k, a.data(), k + 1, values.rows.data(), want.data(), n + 3);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n + 3; ++j) {
            const auto at = static_cast<std::size_t>(i * (n + 3) + j);
            if (j >= n) {
              ASSERT_EQ(c[at], start[at]) << "wrote past column n";
              continue;
            }
#if defined(__FMA__)
            ASSERT_EQ(std::memcmp(&c[at], &want[at], sizeof(float)), 0) << native::name << " m " << m << " n " << n << " k " << k;
#endif
            const DoubleSum ref = double_sum(
                start[at], k, [&](index_t p) { return a[static_cast<std::size_t>(i * (k + 1) + p)]; },
                [&](index_t p) { return to_float(values.rows[static_cast<std::size_t>(p)][j]); });
            ASSERT_NEAR(c[at], ref.value, 1e-6 * (ref.magnitude + 1));
          }
      }
}

/// m rows of k bf16 values as pairs (lda pairs apart; an odd k's last pair has a zero high
/// half, as the tiles hold them), with their values as floats.
struct PairRows {
  std::vector<bf16x2> pairs;
  std::vector<float> values;
  index_t lda;
  PairRows(index_t m, index_t k, std::mt19937& rng) : lda((k + 1) / 2 + 3) {
    std::normal_distribution<float> normal;
    pairs.assign(static_cast<std::size_t>(m * lda), bf16x2{from_float<bf16>(NAN), from_float<bf16>(NAN)});
    values.resize(static_cast<std::size_t>(m * k));
    for (index_t i = 0; i < m; ++i)
      for (index_t p = 0; p < (k + 1) / 2; ++p) {
        const bf16 lo = from_float<bf16>(normal(rng)), hi = 2 * p + 1 < k ? from_float<bf16>(normal(rng)) : bf16{};
        pairs[static_cast<std::size_t>(i * lda + p)] = {lo, hi};
        values[static_cast<std::size_t>(i * k + 2 * p)] = to_float(lo);
        if (2 * p + 1 < k) values[static_cast<std::size_t>(i * k + 2 * p + 1)] = to_float(hi);
      }
  }
};

/// Whether the pair products run on AMX tiles here, whose sums round at their own points
/// (arch/amx.hpp): then within fp32's bound of generic's, not bitwise.
bool pairs_on_tiles() { return std::string(native_name()).find("amx") != std::string::npos; }

/// got equals generic's `want` bitwise (vdpbf16ps, generic's steps bit for bit on normal
/// values) or, on tiles, within k fp32 roundings of the magnitude.
void expect_generics(float got, float want, index_t k, double mag) {
  if (pairs_on_tiles())
    ASSERT_NEAR(got, want, (k + 2) * 0x1p-23 * (mag + 1));
  else
    ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0);
}

TEST(InPlacePairKernels, ScoresMatchGenericBitwiseAndDouble) {
  // Q as bf16 pairs (a NaN past each row's last pair: never read) against scattered bf16
  // key rows.
  std::mt19937 rng(13);
  for (index_t m : {1, 2, 3, 4, 5, 8, 16})
    for (index_t n : {1, 7, 8, 9, 17, 128})
      for (index_t k : {1, 15, 31, 32, 33, 64, 80, 128, 130, 576}) {
        ScatteredRows<bf16> keys(n, k, rng);
        const PairRows q(m, k, rng);
        SCOPED_TRACE(std::string(native_name()) + " m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                     std::to_string(k));
        std::vector<float> c(static_cast<std::size_t>(m * (n + 2)), -7.0f), want(c);
        native::gemm_nt_rows_pairs(m, n, k, q.pairs.data(), q.lda, keys.rows.data(), c.data(), n + 2);
        generic::gemm_nt_rows_pairs(m, n, k, q.pairs.data(), q.lda, keys.rows.data(), want.data(), n + 2);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n + 2; ++j) {
            const auto at = static_cast<std::size_t>(i * (n + 2) + j);
            if (j >= n) {
              ASSERT_EQ(c[at], -7.0f) << "wrote past column n";
              continue;
            }
            const DoubleSum ref = double_sum(
                0, k, [&](index_t p) { return q.values[static_cast<std::size_t>(i * k + p)]; },
                [&](index_t p) { return to_float(keys.rows[static_cast<std::size_t>(j)][p]); });
            ASSERT_NO_FATAL_FAILURE(expect_generics(c[at], want[at], k, ref.magnitude)) << "i " << i << " j " << j;
            ASSERT_NEAR(c[at], ref.value, (pairs_on_tiles() ? 1e-5 : 1e-6) * (ref.magnitude + 1))
                << "i " << i << " j " << j;
          }
      }
}

TEST(InPlacePairKernels, ValuesMatchGenericBitwiseAndDouble) {
  // P as bf16 pairs of keys against scattered bf16 value rows (an odd count's last row paired
  // with zeros), accumulated onto C; nothing written past column n.
  std::mt19937 rng(15);
  std::normal_distribution<float> normal;
  for (index_t m : {1, 2, 3, 4, 7, 8, 9, 16})
    for (index_t n : {1, 16, 17, 31, 33, 40, 64, 80, 128, 129, 512})
      for (index_t k : {1, 2, 8, 13, 127, 128}) {
        ScatteredRows<bf16> values(k, n, rng);
        const PairRows p(m, k, rng);
        std::vector<float> c(static_cast<std::size_t>(m * (n + 3)));
        for (auto& x : c) x = normal(rng);
        std::vector<float> want(c), start(c);
        SCOPED_TRACE(std::string(native_name()) + " m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                     std::to_string(k));
        native::gemm_rows_pairs(m, n, k, p.pairs.data(), p.lda, values.rows.data(), c.data(), n + 3);
        generic::gemm_rows_pairs(m, n, k, p.pairs.data(), p.lda, values.rows.data(), want.data(), n + 3);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < n + 3; ++j) {
            const auto at = static_cast<std::size_t>(i * (n + 3) + j);
            if (j >= n) {
              ASSERT_EQ(c[at], start[at]) << "wrote past column n";
              continue;
            }
            const DoubleSum ref = double_sum(
                start[at], k, [&](index_t r) { return p.values[static_cast<std::size_t>(i * k + r)]; },
                [&](index_t r) { return to_float(values.rows[static_cast<std::size_t>(r)][j]); });
            ASSERT_NO_FATAL_FAILURE(expect_generics(c[at], want[at], k, ref.magnitude)) << "i " << i << " j " << j;
            ASSERT_NEAR(c[at], ref.value, (pairs_on_tiles() ? 1e-5 : 1e-6) * (ref.magnitude + 1))
                << "i " << i << " j " << j;
          }
      }
}

TYPED_TEST(InPlaceKernels, AllFiniteFindsEveryInfAndNaN) {
  using E = TypeParam;
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (index_t n : {1, 15, 31, 32, 33, 64, 100}) {
    std::vector<E> x(static_cast<std::size_t>(n), from_float<E>(1.5f));
    EXPECT_TRUE(native::all_finite(x.data(), n));
    for (index_t at : {index_t{0}, n / 2, n - 1})
      for (float special : specials) {
        std::vector<E> y = x;
        y[static_cast<std::size_t>(at)] = from_float<E>(special);
        EXPECT_FALSE(native::all_finite(y.data(), n)) << "n " << n << " at " << at;
        EXPECT_TRUE(native::all_finite(y.data(), at)) << "reads past n";
      }
  }
}

TEST(InPlaceTouch, ReadsNothingPastARowsEnd) {
  // Rows that end exactly at the end of their heap block, with lengths that are not whole
  // lines: touch_rows must only prefetch a partial last line (ASan flags a load).
  for (index_t bytes : {4, 60, 64, 100, 256, 520}) {
    std::vector<std::vector<char>> blocks;
    std::vector<const void*> rows;
    for (int r = 0; r < 9; ++r) {
      blocks.emplace_back(static_cast<std::size_t>(bytes), static_cast<char>(r));
      rows.push_back(blocks.back().data());
    }
    native::touch_rows(rows.data(), static_cast<index_t>(rows.size()), bytes);
  }
  SUCCEED();
}

}  // namespace
}  // namespace tileattn::arch
