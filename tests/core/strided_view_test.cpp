// tests/core/strided_view_test.cpp: index math of StridedView, make_bshd, make_bhsd, make_lse,
// head_matrix and MatrixView (core/strided_view.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "tileattn/core/strided_view.hpp"

namespace tileattn {
namespace {

TEST(StridedView, OffsetIsTheDotProductOfIndexAndStride) {
  std::vector<int> buf(1000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int>(i);
  const StridedView<int, 3> v{buf.data(), {2, 3, 4}, {200, 7, 30}};
  for (index_t a = 0; a < 2; ++a)
    for (index_t b = 0; b < 3; ++b)
      for (index_t c = 0; c < 4; ++c) EXPECT_EQ(v(a, b, c), a * 200 + b * 7 + c * 30);
  v(1, 2, 3) = -5;  // a reference into the buffer
  EXPECT_EQ(buf[200 + 14 + 90], -5);
}

TEST(StridedView, EmptyAndConstConversion) {
  float x[4] = {1, 2, 3, 4};
  StridedView<float, 2> v{x, {2, 2}, {2, 1}};
  EXPECT_FALSE(v.empty());
  const StridedView<const float, 2> c = v;  // outputs can be passed where inputs are read
  EXPECT_EQ(c.data, x);
  EXPECT_EQ(c.shape, v.shape);
  EXPECT_EQ(c.stride, v.stride);
  EXPECT_EQ(c(1, 0), 3.0f);
  v.shape[1] = 0;
  EXPECT_TRUE(v.empty());
  EXPECT_TRUE((StridedView<float, 1>{}.empty()));
}

// make_bshd: element (b, s, h, d) of a contiguous [B, S, H, D] buffer.
TEST(StridedView, MakeBshd) {
  constexpr index_t B = 2, S = 5, H = 3, D = 4;
  std::vector<float> buf(B * S * H * D);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  const auto v = make_bshd(buf.data(), B, S, H, D);
  EXPECT_EQ(v.shape, (std::array<index_t, 4>{B, S, H, D}));
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d)
          ASSERT_EQ(v(b, s, h, d), static_cast<float>(((b * S + s) * H + h) * D + d));
}

// make_bhsd: a contiguous [B, H, S, D] buffer, still indexed [batch, seqlen, heads, head_dim].
TEST(StridedView, MakeBhsdIndexesAsBshd) {
  constexpr index_t B = 2, S = 5, H = 3, D = 4;
  std::vector<float> buf(B * S * H * D);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  const auto v = make_bhsd(buf.data(), B, H, S, D);
  EXPECT_EQ(v.shape, (std::array<index_t, 4>{B, S, H, D}));
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d)
          ASSERT_EQ(v(b, s, h, d), static_cast<float>(((b * H + h) * S + s) * D + d));
}

TEST(StridedView, MakeLse) {
  constexpr index_t B = 3, H = 2, N = 7;
  std::vector<float> buf(B * H * N);
  const LseView v = make_lse(buf.data(), B, H, N);
  EXPECT_EQ(v.shape, (std::array<index_t, 3>{B, H, N}));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < N; ++i) EXPECT_EQ(&v(b, h, i), buf.data() + (b * H + h) * N + i);
}

// head_matrix: the [seqlen, head_dim] matrix of one (batch, head), in any layout.
TEST(StridedView, HeadMatrixMatchesTheTensor) {
  constexpr index_t B = 2, S = 6, H = 3, D = 5;
  std::vector<float> buf(B * S * H * D * 2);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  const TensorView<float> layouts[] = {
      make_bshd(buf.data(), B, S, H, D),
      make_bhsd(buf.data(), B, H, S, D),
      {buf.data() + 3, {B, S, H, D}, {S * H * D * 2, 1, S * D, S}},  // head_dim strided
  };
  for (const auto& t : layouts)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h) {
        const MatrixView<float> m = head_matrix(t, b, h);
        EXPECT_EQ(m.rows, S);
        EXPECT_EQ(m.cols, D);
        EXPECT_EQ(m.row_stride, t.stride[dim::seqlen]);
        EXPECT_EQ(m.col_stride, t.stride[dim::head_dim]);
        for (index_t s = 0; s < S; ++s) {
          EXPECT_EQ(m.row(s), &t(b, s, h, 0));
          for (index_t d = 0; d < D; ++d) ASSERT_EQ(&m(s, d), &t(b, s, h, d));
        }
      }
}

TEST(StridedView, DimensionNames) {
  EXPECT_EQ(dim::batch, 0);
  EXPECT_EQ(dim::seqlen, 1);
  EXPECT_EQ(dim::heads, 2);
  EXPECT_EQ(dim::head_dim, 3);
}

}  // namespace
}  // namespace tileattn
