// tests/ops/matmul_test.cpp: tile products (ops/matmul.hpp): C = A B and C += A B on SRAM tiles
// of odd extents, against double; and nothing written outside C's extent.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "support/test_support.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/ops/matmul.hpp"

namespace tileattn::test {
namespace {

using Extents = std::tuple<index_t, index_t, index_t>;  // m, n, k

class TileMatmul : public ::testing::TestWithParam<Extents> {};

TEST_P(TileMatmul, MatchesDoubleAndStaysInsideTheExtent) {
  // (std::get, not a structured binding: clang 14 cannot capture bindings in lambdas)
  const index_t m = std::get<0>(GetParam()), n = std::get<1>(GetParam()), k = std::get<2>(GetParam());
  ScratchArena arena(4 << 20);
  // Carve with spare capacity so the padding and extra rows/columns can be checked.
  auto a = carve_tile<float>(arena, m + 3, k + 5);
  auto b = carve_tile<float>(arena, k + 2, n + 7);
  auto c = carve_tile<float>(arena, m + 4, n + 33);
  std::mt19937_64 rng(m * 1000003 + n * 1009 + k);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  a.set_extent(m, k);
  b.set_extent(k, n);
  for (index_t i = 0; i < m; ++i)
    for (index_t p = 0; p < k; ++p) a(i, p) = normal(rng);
  for (index_t p = 0; p < k; ++p)
    for (index_t j = 0; j < n; ++j) b(p, j) = normal(rng);
  c.set_extent(m + 4, n + 33);
  for (index_t i = 0; i < m + 4; ++i)
    for (index_t j = 0; j < c.ld(); ++j) c.row(i)[j] = sentinel;

  const auto expect_product = [&](double times, double plus_initial, const char* what) {
    for (index_t i = 0; i < m + 4; ++i)
      for (index_t j = 0; j < c.ld(); ++j) {
        if (i >= m || j >= n) {
          ASSERT_EQ(c.row(i)[j], sentinel) << what << ": wrote outside the extent at " << i << "," << j;
          continue;
        }
        double want = plus_initial;
        for (index_t p = 0; p < k; ++p) want += times * static_cast<double>(a(i, p)) * b(p, j);
        ASSERT_NEAR(c(i, j), want, 1e-5 * (1.0 + std::sqrt(static_cast<double>(k)))) << what << " at " << i << "," << j;
      }
  };
  ops::matmul(c, a, b);
  EXPECT_EQ(c.rows(), m);
  EXPECT_EQ(c.cols(), n);
  expect_product(1.0, 0.0, "matmul");
  // C += A B: twice the product now. Seed C with a constant first to check it accumulates.
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) c(i, j) = 0.5f;
  ops::matmul_accumulate(c, a, b);
  expect_product(1.0, 0.5, "matmul_accumulate");
}

INSTANTIATE_TEST_SUITE_P(OddExtents, TileMatmul,
                         ::testing::Combine(::testing::Values<index_t>(1, 7, 8, 13, 64),
                                            ::testing::Values<index_t>(1, 15, 16, 17, 48, 100),
                                            ::testing::Values<index_t>(1, 32, 80, 131)),
                         [](const ::testing::TestParamInfo<Extents>& info) {
                           return "m" + std::to_string(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(TileMatmulForwardShapes, HeadDim80) {
  // The forward kernel's shapes: (Br, D) x (D, Bc) -> (Br, Bc), then (Br, Bc) x (Bc, D) += (Br, D).
  constexpr index_t D = 80, br = 11, bc = 29;
  ScratchArena arena(1 << 20);
  auto q = carve_tile<float>(arena, br, D);
  auto kt = carve_tile<float>(arena, D, bc);
  auto v = carve_tile<float>(arena, bc, D);
  auto s = carve_tile<float>(arena, br, bc);
  auto o = carve_tile<float>(arena, br, D);
  for (index_t i = 0; i < br; ++i)
    for (index_t c = 0; c < D; ++c) q(i, c) = static_cast<float>((i + 2 * c) % 7) - 3.0f;
  for (index_t c = 0; c < D; ++c)
    for (index_t j = 0; j < bc; ++j) kt(c, j) = static_cast<float>((3 * c + j) % 5) - 2.0f;
  for (index_t j = 0; j < bc; ++j)
    for (index_t c = 0; c < D; ++c) v(j, c) = static_cast<float>((j + c) % 3) - 1.0f;
  ops::matmul(s, q, kt);
  ops::fill(o, 0.0f);
  ops::matmul_accumulate(o, s, v);
  for (index_t i = 0; i < br; ++i)
    for (index_t c = 0; c < D; ++c) {
      double want = 0.0;
      for (index_t j = 0; j < bc; ++j) {
        double sij = 0.0;
        for (index_t p = 0; p < D; ++p) sij += static_cast<double>(q(i, p)) * kt(p, j);
        want += sij * v(j, c);
      }
      ASSERT_EQ(o(i, c), static_cast<float>(want)) << "small integers are exact in fp32";
    }
}

}  // namespace
}  // namespace tileattn::test
