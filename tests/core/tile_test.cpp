// tests/core/tile_test.cpp: SRAM tiles (core/tile.hpp): footprint() is exactly the bytes
// carve_tile() (memory/scratch_arena.hpp) takes, rows are cache-line aligned and disjoint,
// extents and slices.
#include <gtest/gtest.h>

#include <cstdint>

#include "tileattn/core/tile.hpp"
#include "tileattn/memory/scratch_arena.hpp"

namespace tileattn {
namespace {

bool line_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % cache_line_bytes == 0; }

void check_carve(index_t rows, index_t cols) {
  ScratchArena arena(1 << 20);
  const std::size_t before = arena.used();
  Tile<float> t = carve_tile<float>(arena, rows, cols);
  EXPECT_EQ(arena.used() - before, (Tile<float>::footprint(rows, cols))) << rows << " x " << cols;
  EXPECT_EQ(t.rows(), rows);
  EXPECT_EQ(t.cols(), cols);
  EXPECT_EQ(t.capacity_rows(), rows);
  EXPECT_EQ(t.capacity_cols(), cols);
  EXPECT_GE(t.ld(), cols);
  EXPECT_EQ(t.ld() % 16, 0) << "ld is whole cache lines of floats";
  EXPECT_LT(t.ld() - cols, 16);
  for (index_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(line_aligned(t.row(r))) << "row " << r;
    EXPECT_EQ(&t(r, 0), t.row(r));
    if (r + 1 < rows) {
      EXPECT_LE(t.row(r) + cols, t.row(r + 1));
    }
  }
  EXPECT_LE(reinterpret_cast<const std::byte*>(t.row(rows - 1) + cols),
            reinterpret_cast<const std::byte*>(t.data()) + (arena.used() - before));
}

TEST(Tile, FootprintEqualsBytesCarved) {
  for (index_t rows : {1, 2, 7, 16, 33, 128})
    for (index_t cols : {1, 3, 15, 16, 17, 31, 64, 80, 100, 256}) check_carve(rows, cols);
  for (index_t rows : {1, 5, 64}) {
    check_carve(rows, 32);
    check_carve(rows, 80);
    check_carve(rows, 96);
    check_carve(rows, 256);
  }
  EXPECT_EQ(Tile<float>::footprint(3, 17), 3u * 32u * 4u);
  EXPECT_EQ(Tile<float>::footprint(1, 1), 64u);
  EXPECT_EQ(Tile<float>::footprint(2, 80), 2u * 80u * 4u);
}

TEST(Tile, ConsecutiveCarvesAreDisjoint) {
  ScratchArena arena(1 << 16);
  auto a = carve_tile<float>(arena, 5, 20);
  auto b = carve_tile<float>(arena, 3, 7);
  EXPECT_GE(reinterpret_cast<std::byte*>(b.data()),
            reinterpret_cast<std::byte*>(a.data()) + Tile<float>::footprint(5, 20));
}

TEST(Tile, ExtentAndSlices) {
  ScratchArena arena(1 << 16);
  auto t = carve_tile<float>(arena, 10, 20);
  t.set_extent(4, 7);
  EXPECT_EQ(t.rows(), 4);
  EXPECT_EQ(t.cols(), 7);
  EXPECT_EQ(t.capacity_rows(), 10);
  EXPECT_EQ(t.ld(), 32);
  t.set_extent(10, 20);
  for (index_t r = 0; r < 10; ++r)
    for (index_t c = 0; c < 20; ++c) t(r, c) = static_cast<float>(r * 100 + c);
  const auto s = t.slice_rows(3, 4);
  EXPECT_EQ(s.rows(), 4);
  EXPECT_EQ(s.capacity_rows(), 4);
  EXPECT_EQ(s.cols(), 20);
  EXPECT_EQ(s.ld(), t.ld());
  EXPECT_EQ(s(0, 5), 305.0f);
  EXPECT_EQ(s(3, 19), 619.0f);

  auto wide = carve_tile<float>(arena, 8, 64);
  EXPECT_EQ(wide.cols(), 64);
  wide.set_extent(3, 64);
  EXPECT_EQ(wide.rows(), 3);
  EXPECT_EQ(wide.cols(), 64);
}

TEST(TileVector, FootprintEqualsBytesCarvedAndSlices) {
  for (index_t n : {1, 15, 16, 17, 100, 1000}) {
    ScratchArena arena(1 << 16);
    auto v = carve_tile_vector<float>(arena, n);
    EXPECT_EQ(arena.used(), TileVector<float>::footprint(n));
    EXPECT_EQ(v.size(), n);
    EXPECT_TRUE(line_aligned(v.data()));
    for (index_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
    const auto s = v.slice(n / 2, n - n / 2);
    EXPECT_EQ(s.size(), n - n / 2);
    EXPECT_EQ(s[0], static_cast<float>(n / 2));
  }
}

}  // namespace
}  // namespace tileattn
