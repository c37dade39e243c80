// tests/memory/io_counter_test.cpp: the HBM traffic policies (memory/io_counter.hpp).
#include <gtest/gtest.h>

#include "tileattn/memory/io_counter.hpp"

namespace tileattn {
namespace {

TEST(IoCounter, CountsAddUp) {
  IoCounts a{10, 20};
  a += IoCounts{1, 2};
  EXPECT_EQ(a.bytes_read, 11u);
  EXPECT_EQ(a.bytes_written, 22u);
  EXPECT_EQ(a, (IoCounts{11, 22}));
  EXPECT_FALSE(a == (IoCounts{11, 23}));
  EXPECT_EQ(IoCounts{}, (IoCounts{0, 0}));
}

TEST(IoCounter, Policies) {
  static_assert(!NoIoCounting::enabled);
  static_assert(CountingIo::enabled);
  NoIoCounting none;
  none.read(100);
  none.written(100);
  CountingIo counting;
  counting.read(100);
  counting.read(28);
  counting.written(4);
  EXPECT_EQ(counting.counts, (IoCounts{128, 4}));
}

}  // namespace
}  // namespace tileattn
