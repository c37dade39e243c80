// tests/core/strided_view_test.cpp: index math of StridedView, its slicing and broadcasting
// helpers (ptr, slice, broadcast, with_leading, sub_view: each against the hand-written
// data/shape/stride arithmetic it replaced), make_bshd, make_bhsd, make_lse, head_matrix and
// MatrixView (core/strided_view.hpp).
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

// ptr(i...) is data + sum(i * stride), without reading: the hand-written pointer offsets
// (kernels' block-table rows, paged_head_matrix's head) and a null view at index 0.
TEST(StridedView, PtrIsDataPlusTheOffset) {
  std::vector<int> buf(1000);
  const StridedView<int, 3> v{buf.data(), {2, 3, 4}, {200, 7, 30}};
  for (index_t a = 0; a < 2; ++a)
    for (index_t b = 0; b < 3; ++b)
      for (index_t c = 0; c < 4; ++c) {
        EXPECT_EQ(v.ptr(a, b, c), buf.data() + a * v.stride[0] + b * v.stride[1] + c * v.stride[2]);
        EXPECT_EQ(v.ptr(a, b, c), &v(a, b, c));
      }
  const StridedView<const float, 2> none{};
  EXPECT_EQ(none.ptr(0, 0), nullptr);
}

// slice(dim, start, length): distributed/ring.hpp's rows() and shard.hpp's row_of().
TEST(StridedView, SliceMovesToStartAndSetsTheExtent) {
  std::vector<float> buf(2 * 7 * 3 * 5);
  const TensorView<float> t = make_bshd(buf.data(), 2, 7, 3, 5);
  for (int d = 0; d < 4; ++d) {
    const index_t start = 1, len = t.shape[static_cast<std::size_t>(d)] - 1;
    TensorView<float> by_hand = t;  // what ring.hpp / shard.hpp wrote
    by_hand.data += start * by_hand.stride[static_cast<std::size_t>(d)];
    by_hand.shape[static_cast<std::size_t>(d)] = len;
    const TensorView<float> s = t.slice(d, start, len);
    EXPECT_EQ(s.data, by_hand.data);
    EXPECT_EQ(s.shape, by_hand.shape);
    EXPECT_EQ(s.stride, by_hand.stride);
  }
  const TensorView<float> row = t.slice(dim::seqlen, 4, 1);
  EXPECT_EQ(row.shape, (std::array<index_t, 4>{2, 1, 3, 5}));
  EXPECT_EQ(&row(1, 0, 2, 3), &t(1, 4, 2, 3));
  const TensorView<float> none = t.slice(dim::seqlen, 0, 0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data, t.data);
}

// broadcast(dim, extent): the resolved 8-bit scale views (stride 0 where the extent was 1).
TEST(StridedView, BroadcastSetsExtentAndZeroStride) {
  float scales[3] = {1, 2, 3};
  const StridedView<const float, 2> per_head{scales, {1, 3}, {3, 1}};
  StridedView<const float, 2> by_hand = per_head;  // what resolve_kv_scale wrote
  by_hand.stride[0] = 0;
  by_hand.shape[0] = 4;
  const StridedView<const float, 2> b = per_head.broadcast(0, 4);
  EXPECT_EQ(b.data, by_hand.data);
  EXPECT_EQ(b.shape, by_hand.shape);
  EXPECT_EQ(b.stride, by_hand.stride);
  for (index_t p = 0; p < 4; ++p)
    for (index_t h = 0; h < 3; ++h) EXPECT_EQ(b(p, h), scales[h]);
  const StridedView<const float, 2> one = StridedView<const float, 2>{scales, {1, 1}, {0, 0}};
  const StridedView<const float, 2> both = one.broadcast(0, 2).broadcast(1, 5);
  EXPECT_EQ(both.shape, (std::array<index_t, 2>{2, 5}));
  EXPECT_EQ(both.stride, (std::array<index_t, 2>{0, 0}));
  EXPECT_EQ(&both(1, 4), scales);
}

// with_leading(): forward.hpp's unpack() of packed [total, H, D] views and the packed LSE
// [H, total] as [1, H, total] in the varlen forward, backward and paged calls.
TEST(StridedView, WithLeadingAddsAStrideZeroDimension) {
  std::vector<float> buf(11 * 3 * 4);
  const StridedView<float, 3> packed{buf.data(), {11, 3, 4}, {12, 4, 1}};
  const StridedView<float, 4> by_hand{packed.data,
                                      {1, packed.shape[0], packed.shape[1], packed.shape[2]},
                                      {0, packed.stride[0], packed.stride[1], packed.stride[2]}};
  const StridedView<float, 4> u = packed.with_leading();
  EXPECT_EQ(u.data, by_hand.data);
  EXPECT_EQ(u.shape, by_hand.shape);
  EXPECT_EQ(u.stride, by_hand.stride);

  const StridedView<const float, 2> lse{buf.data(), {3, 11}, {1, 3}};
  const StridedView<const float, 3> lse_by_hand{
      lse.data, {1, lse.shape[0], lse.shape[1]}, {0, lse.stride[0], lse.stride[1]}};
  const StridedView<const float, 3> l = lse.with_leading();
  EXPECT_EQ(l.data, lse_by_hand.data);
  EXPECT_EQ(l.shape, lse_by_hand.shape);
  EXPECT_EQ(l.stride, lse_by_hand.stride);

  const StridedView<const float, 3> twice = lse.with_leading(2);  // the same elements twice
  EXPECT_EQ(twice.shape, (std::array<index_t, 3>{2, 3, 11}));
  EXPECT_EQ(&twice(1, 2, 7), &lse(2, 7));
}

// sub_view(i...): kv_cache.hpp's layer_rows() (layer l of [layers, n, H, D]) and more
// leading indices at once.
TEST(StridedView, SubViewDropsLeadingDimensions) {
  std::vector<float> buf(2 * 5 * 3 * 4);
  const TensorView<const float> rows = make_bhsd<const float>(buf.data(), 2, 3, 5, 4);
  for (index_t l = 0; l < 2; ++l) {
    const StridedView<const float, 3> by_hand{rows.data + l * rows.stride[0],
                                              {rows.shape[1], rows.shape[2], rows.shape[3]},
                                              {rows.stride[1], rows.stride[2], rows.stride[3]}};
    const StridedView<const float, 3> s = rows.sub_view(l);
    EXPECT_EQ(s.data, by_hand.data);
    EXPECT_EQ(s.shape, by_hand.shape);
    EXPECT_EQ(s.stride, by_hand.stride);
    const StridedView<const float, 2> two = rows.sub_view(l, 3);
    EXPECT_EQ(two.shape, (std::array<index_t, 2>{3, 4}));
    EXPECT_EQ(two.stride, (std::array<index_t, 2>{rows.stride[2], rows.stride[3]}));
    EXPECT_EQ(&two(2, 1), &rows(l, 3, 2, 1));
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
