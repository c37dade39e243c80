// tests/memory/cache_size_test.cpp: per-core cache detection (memory/cache_size.hpp).
#include <gtest/gtest.h>

#include "tileattn/memory/cache_size.hpp"

namespace tileattn {
namespace {

TEST(CacheSize, ParsesSysfsSizes) {
  EXPECT_EQ(detail::parse_cache_size("1024K"), 1024u * 1024u);
  EXPECT_EQ(detail::parse_cache_size("512k\n"), 512u * 1024u);
  EXPECT_EQ(detail::parse_cache_size("2M"), 2u * 1024u * 1024u);
  EXPECT_EQ(detail::parse_cache_size("65536"), 65536u);
  EXPECT_EQ(detail::parse_cache_size(""), 0u);
  EXPECT_EQ(detail::parse_cache_size("K"), 0u);
}

TEST(CacheSize, PerCoreCacheIsPlausibleAndStable) {
  const std::size_t bytes = per_core_cache_bytes();
  EXPECT_GE(bytes, 64u * 1024u);
  EXPECT_LE(bytes, 1024u * 1024u * 1024u);
  EXPECT_EQ(per_core_cache_bytes(), bytes);
  const std::size_t sysfs = detail::sysfs_l2_bytes();
  if (sysfs > 0) {
    EXPECT_EQ(bytes, sysfs);
  }
  EXPECT_EQ(fallback_cache_bytes, 256u * 1024u);
}

}  // namespace
}  // namespace tileattn
