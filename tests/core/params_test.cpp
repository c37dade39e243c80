// tests/core/params_test.cpp: ForwardOptions defaults and the ForwardParams accessors
// (core/params.hpp): sequence ranges (fixed and varlen), GQA groups and the mask offset.
#include <gtest/gtest.h>

#include "tileattn/core/params.hpp"

namespace tileattn {
namespace {

TEST(ForwardOptions, Defaults) {
  const ForwardOptions o;
  EXPECT_FALSE(o.softmax_scale.has_value());
  EXPECT_FALSE(o.causal);
  EXPECT_EQ(o.alignment, MaskAlignment::bottom_right);
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.softcap, 0.0f);
  EXPECT_TRUE(o.alibi_slopes.empty());
  EXPECT_TRUE(o.sinks.empty());
  EXPECT_EQ(o.bias.data, nullptr);
  EXPECT_EQ(o.mask.data, nullptr);
  EXPECT_EQ(o.execution.backend, Backend::automatic);
  EXPECT_EQ(o.execution.num_threads, 0);
  EXPECT_EQ(o.sram_budget_bytes, 0u);
  EXPECT_EQ(o.io_counts, nullptr);
}

TEST(ForwardParams, FixedLengthAccessors) {
  ForwardParams<float> p;
  p.q.shape = {3, 10, 8, 64};
  p.k.shape = {3, 25, 2, 64};
  EXPECT_FALSE(p.varlen());
  EXPECT_EQ(p.batch(), 3);
  EXPECT_EQ(p.heads(), 8);
  EXPECT_EQ(p.heads_kv(), 2);
  EXPECT_EQ(p.group_size(), 4);
  EXPECT_EQ(p.head_dim(), 64);
  const SequenceRange s = p.sequence(2);
  EXPECT_EQ(s.view_batch, 2);
  EXPECT_EQ(s.q_start, 0);
  EXPECT_EQ(s.q_len, 10);
  EXPECT_EQ(s.k_start, 0);
  EXPECT_EQ(s.k_len, 25);
  EXPECT_EQ(p.mask_offset(s), 15);  // bottom-right: query i aligned with key i + 15
  p.alignment = MaskAlignment::top_left;
  EXPECT_EQ(p.mask_offset(s), 0);
  p.window_right = 7;
  EXPECT_EQ(p.effective_window_right(), 7);
  p.causal = true;
  EXPECT_EQ(p.effective_window_right(), 0);
}

TEST(ForwardParams, VarlenSequences) {
  const std::int32_t cu_q[] = {0, 3, 3, 10};
  const std::int32_t cu_k[] = {0, 5, 9, 9};
  ForwardParams<float> p;
  p.q.shape = {1, 10, 4, 32};
  p.k.shape = {1, 9, 4, 32};
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.num_sequences = 3;
  EXPECT_TRUE(p.varlen());
  EXPECT_EQ(p.batch(), 3);
  const SequenceRange s1 = p.sequence(1), s2 = p.sequence(2);
  EXPECT_EQ(s1.view_batch, 0);
  EXPECT_EQ(s1.q_start, 3);
  EXPECT_EQ(s1.q_len, 0);
  EXPECT_EQ(s1.k_start, 5);
  EXPECT_EQ(s1.k_len, 4);
  EXPECT_EQ(s2.q_start, 3);
  EXPECT_EQ(s2.q_len, 7);
  EXPECT_EQ(s2.k_len, 0);
  EXPECT_EQ(p.mask_offset(s2), -7);
}

}  // namespace
}  // namespace tileattn
