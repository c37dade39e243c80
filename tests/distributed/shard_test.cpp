// distributed/shard.hpp without MPI: every layout covers the sequence exactly once in order
// within each chunk; zig-zag balances causal work; shard and unshard are inverses; bad
// arguments name themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "tileattn/distributed/shard.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

using ring::Chunk;
using ring::Sharding;
using ring::ShardLayout;

TEST(ShardLayout, EveryRowOnceAtItsLocalPlace) {
  for (Sharding sharding : {Sharding::contiguous, Sharding::zigzag})
    for (int ranks : {1, 2, 3, 4, 7, 16})
      for (index_t n : {0, 1, 5, 17, 127, 1000, 1001}) {
        const ShardLayout layout(n, ranks, sharding);
        std::vector<int> owner(static_cast<std::size_t>(n), -1);
        index_t total = 0, longest = 0;
        for (int r = 0; r < ranks; ++r) {
          index_t local = 0;
          for (int c = 0; c < layout.chunks_per_rank(); ++c) {
            const Chunk ch = layout.chunk(r, c);
            EXPECT_EQ(ch.local_start, local) << "rank " << r << " chunk " << c;
            for (index_t i = 0; i < ch.length; ++i) {
              ASSERT_LT(ch.start + i, n);
              EXPECT_EQ(owner[static_cast<std::size_t>(ch.start + i)], -1) << "row " << ch.start + i << " twice";
              owner[static_cast<std::size_t>(ch.start + i)] = r;
            }
            local += ch.length;
          }
          EXPECT_EQ(layout.local_len(r), local);
          total += local;
          longest = std::max(longest, local);
        }
        EXPECT_EQ(total, n);
        EXPECT_EQ(layout.max_local_len(), longest);
        EXPECT_TRUE(std::none_of(owner.begin(), owner.end(), [](int o) { return o < 0; }));
      }
}

// Under a causal mask, query at position p sees p + 1 keys: zig-zag gives every rank the
// same count within a few rows' worth, contiguous gives the last rank almost P times more.
TEST(ShardLayout, ZigzagBalancesCausalWork) {
  const index_t n = 4096;
  const int ranks = 8;
  const auto work = [&](Sharding s, int r) {
    const ShardLayout layout(n, ranks, s);
    double keys = 0;
    for (int c = 0; c < layout.chunks_per_rank(); ++c) {
      const Chunk ch = layout.chunk(r, c);
      for (index_t i = 0; i < ch.length; ++i) keys += static_cast<double>(ch.start + i + 1);
    }
    return keys;
  };
  double lo = 1e300, hi = 0;
  for (int r = 0; r < ranks; ++r) lo = std::min(lo, work(Sharding::zigzag, r)), hi = std::max(hi, work(Sharding::zigzag, r));
  EXPECT_LE(hi / lo, 1.0 + 1e-9);  // 4096 = 16 pieces of 256: exactly equal
  EXPECT_GT(work(Sharding::contiguous, ranks - 1) / work(Sharding::contiguous, 0), 10.0);
}

TEST(ShardLayout, ShardThenUnshardIsTheIdentity) {
  const index_t B = 2, n = 127, H = 3, D = 5;
  std::vector<float> full(static_cast<std::size_t>(B * n * H * D)), back(full.size(), -1.0f);
  std::iota(full.begin(), full.end(), 0.5f);
  std::vector<float> lse(static_cast<std::size_t>(B * H * n)), lse_back(lse.size(), -1.0f);
  std::iota(lse.begin(), lse.end(), 0.25f);
  const ShardLayout layout(n, 3);
  for (int r = 0; r < 3; ++r) {
    const index_t m = layout.local_len(r);
    std::vector<float> local(static_cast<std::size_t>(B * m * H * D)), local_lse(static_cast<std::size_t>(B * H * m));
    ring::shard(make_bshd(full.data(), B, n, H, D), make_bshd(local.data(), B, m, H, D), layout, r);
    ring::shard(make_lse(lse.data(), B, H, n), make_lse(local_lse.data(), B, H, m), layout, r, 2);
    const Chunk second = layout.chunk(r, 1);  // its first local row is global row second.start
    EXPECT_EQ(local[static_cast<std::size_t>(second.local_start * H * D)], full[static_cast<std::size_t>(second.start * H * D)]);
    ring::unshard(make_bshd(local.data(), B, m, H, D), make_bshd(back.data(), B, n, H, D), layout, r);
    ring::unshard(make_lse(local_lse.data(), B, H, m), make_lse(lse_back.data(), B, H, n), layout, r, 2);
  }
  EXPECT_EQ(back, full);
  EXPECT_EQ(lse_back, lse);
}

TEST(ShardLayout, BadArgumentsNameThemselves) {
  const auto parameter = [](auto&& f) {
    try {
      f();
    } catch (const invalid_argument& e) {
      return e.parameter();
    }
    return std::string("(nothing thrown)");
  };
  EXPECT_EQ(parameter([] { ShardLayout(-1, 2); }), "seqlen");
  EXPECT_EQ(parameter([] { ShardLayout(10, 0); }), "ranks");
  std::vector<float> full(40), local(40, 7.0f);
  const ShardLayout layout(10, 2);
  EXPECT_EQ(parameter([&] { ring::shard(make_bshd(full.data(), 1, 10, 1, 4), make_bshd(local.data(), 1, 4, 1, 4), layout, 0); }),
            "local");
  EXPECT_EQ(parameter([&] { ring::shard(make_bshd(full.data(), 1, 9, 1, 4), make_bshd(local.data(), 1, 5, 1, 4), layout, 0); }),
            "full");
  EXPECT_EQ(parameter([&] { ring::shard(make_bshd(full.data(), 1, 10, 1, 4), make_bshd(local.data(), 1, 5, 1, 4), layout, 2); }),
            "rank");
  EXPECT_TRUE(std::all_of(local.begin(), local.end(), [](float x) { return x == 7.0f; }));
}

}  // namespace
}  // namespace tileattn::test
