// tests/memory/tile_io_test.cpp: moves between HBM views and SRAM tiles (memory/tile_io.hpp):
// load_rows, load_rows_transposed, store_rows and store_vector, on contiguous and strided
// views, and the bytes each reports to the IO policy.
#include <gtest/gtest.h>

#include <vector>

#include "support/test_support.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"

namespace tileattn::test {
namespace {

constexpr index_t B = 2, S = 37, H = 3, D = 32;

class TileIo : public ::testing::TestWithParam<Layout> {};

TEST_P(TileIo, LoadRows) {
  HostTensor t({B, S, H, D}, GetParam());
  t.fill_normal(9);
  ScratchArena arena(1 << 20);
  auto tile = carve_tile<float>(arena, 16, D);
  const MatrixView<const float> m = head_matrix(t.cview(), 1, 2);
  CountingIo io;
  for (auto [row0, rows] : {std::pair<index_t, index_t>{0, 16}, {5, 11}, {30, 7}, {36, 1}}) {
    load_rows(tile, m, row0, rows, io);
    ASSERT_EQ(tile.rows(), rows);
    ASSERT_EQ(tile.cols(), D);
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < D; ++c) ASSERT_EQ(tile(r, c), t.view()(1, row0 + r, 2, c));
  }
  EXPECT_EQ(io.counts.bytes_read, (16u + 11 + 7 + 1) * D * sizeof(float));
  EXPECT_EQ(io.counts.bytes_written, 0u);
}

TEST_P(TileIo, LoadRowsTransposed) {
  HostTensor t({B, S, H, D}, GetParam());
  t.fill_normal(10);
  ScratchArena arena(1 << 20);
  auto kt = carve_tile<float>(arena, D, S);
  const MatrixView<const float> m = head_matrix(t.cview(), 0, 1);
  CountingIo io;
  for (auto [row0, rows] : {std::pair<index_t, index_t>{0, 37}, {3, 17}, {20, 16}, {36, 1}}) {
    load_rows_transposed(kt, m, row0, rows, io);
    ASSERT_EQ(kt.rows(), D);
    ASSERT_EQ(kt.cols(), rows);
    for (index_t c = 0; c < D; ++c)
      for (index_t r = 0; r < rows; ++r) ASSERT_EQ(kt(c, r), t.view()(0, row0 + r, 1, c));
  }
  EXPECT_EQ(io.counts.bytes_read, (37u + 17 + 16 + 1) * D * sizeof(float));
}

TEST_P(TileIo, StoreRowsWritesOnlyItsRows) {
  HostTensor t({B, S, H, D}, GetParam());
  t.fill(sentinel);
  ScratchArena arena(1 << 20);
  auto tile = carve_tile<float>(arena, 16, D);
  tile.set_extent(9, D);
  for (index_t r = 0; r < 9; ++r)
    for (index_t c = 0; c < D; ++c) tile(r, c) = static_cast<float>(r * 1000 + c);
  CountingIo io;
  store_rows(head_matrix(t.view(), 1, 0), 20, tile, io);
  EXPECT_EQ(io.counts.bytes_written, 9u * D * sizeof(float));
  EXPECT_EQ(io.counts.bytes_read, 0u);
  for_each_index(t.view().shape, [&](index_t b, index_t s, index_t h, index_t c) {
    const bool stored = b == 1 && h == 0 && s >= 20 && s < 29;
    const float want = stored ? static_cast<float>((s - 20) * 1000 + c) : sentinel;
    ASSERT_EQ(t.view()(b, s, h, c), want) << b << " " << s << " " << h << " " << c;
  });
  EXPECT_EQ(t.changed_outside_view(sentinel), 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TileIo, ::testing::ValuesIn(all_layouts),
                         [](const ::testing::TestParamInfo<Layout>& info) { return to_string(info.param); });

TEST(TileIoVector, StoreVectorWithStride) {
  std::vector<float> dst(30, sentinel);
  const float src[] = {1, 2, 3, 4, 5};
  CountingIo io;
  store_vector(dst.data() + 2, 3, src, 5, io);
  EXPECT_EQ(io.counts.bytes_written, 5 * sizeof(float));
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const bool stored = i >= 2 && (i - 2) % 3 == 0 && (i - 2) / 3 < 5;
    EXPECT_EQ(dst[i], stored ? src[(i - 2) / 3] : sentinel) << i;
  }
}

TEST(TileIoVector, NoCountingPolicyCompilesAway) {
  std::vector<float> dst(4);
  const float src[] = {1, 2, 3, 4};
  NoIoCounting io;
  store_vector(dst.data(), 1, src, 4, io);
  EXPECT_EQ(dst[3], 4.0f);
}

}  // namespace
}  // namespace tileattn::test
