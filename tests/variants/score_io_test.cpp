// tests/variants/score_io_test.cpp: the optional bias and mask are read from main memory, so
// their bytes count as HBM traffic: without a causal or window mask every (query, key) score
// is computed exactly once, so a bias adds B * H * Nq * Nk floats and a mask as many bools
// to bytes_read, under any tiling, and nothing to bytes_written.
#include <gtest/gtest.h>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

IoCounts counted(Problem& p, ForwardOptions opts, std::size_t budget) {
  IoCounts io;
  opts.io_counts = &io;
  opts.sram_budget_bytes = budget;
  p.run(opts);
  return io;
}

TEST(ScoreIo, BiasAndMaskBytesAreCountedOncePerScore) {
  const Shape s{2, 6, 3, 37, 91, 32};
  const auto elements = static_cast<std::uint64_t>(s.batch * s.heads_q * s.seqlen_q * s.seqlen_k);
  const auto bias = random_bias({s.batch, 1, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous, 11);
  const auto mask = random_mask({1, s.heads_q, s.seqlen_q, s.seqlen_k}, ScoreLayout::contiguous, 12);
  for (std::size_t budget : {std::size_t{0}, rows_budget(16, s.head_dim)}) {
    Problem p(s);
    const IoCounts plain = counted(p, {}, budget);
    ForwardOptions with_bias;
    with_bias.bias = bias.view();
    const IoCounts biased = counted(p, with_bias, budget);
    EXPECT_EQ(biased.bytes_read - plain.bytes_read, elements * sizeof(float)) << "budget " << budget;
    EXPECT_EQ(biased.bytes_written, plain.bytes_written);
    ForwardOptions with_mask;
    with_mask.mask = mask.view();
    const IoCounts masked = counted(p, with_mask, budget);
    EXPECT_EQ(masked.bytes_read - plain.bytes_read, elements * sizeof(bool)) << "budget " << budget;
  }
}

}  // namespace
}  // namespace tileattn::test
