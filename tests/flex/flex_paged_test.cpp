// tests/flex/flex_paged_test.cpp: forward_paged_flex and forward_paged_flex_varlen (flex.hpp)
// and the draft-tree mask of a speculative verify step (flex/tree_mask.hpp):
//   - a verify step under random draft trees (one shared, one per sequence) against the
//     double reference with the same mask as a dense boolean mask, in fp32, over sequences
//     of awkward lengths, with and without split-KV, at two SRAM budgets, and bitwise
//     identical on every backend and thread count;
//   - the tree mask itself: what each draft token sees, against the parent array walked by
//     hand, and the kind of each of its blocks;
//   - a custom mask_mod and score_mod on the paged path and its varlen form, against the
//     reference;
//   - IO: a block mask's empty blocks are never read (K/V bytes exactly those of the key
//     tiles it leaves);
//   - argument errors: parents out of order, too few keys for the drafts, a block mask of
//     another shape (nothing written);
//   - plans: plan_forward_paged_flex(_varlen) and the plan overloads give the unplanned
//     calls' bits, and a plan of another call throws "plan" with nothing written.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "support/expect_throw_naming.hpp"
#include "support/paged_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/flex.hpp"

namespace tileattn::test {
namespace {

/// A random draft tree of `tokens` nodes in topological order (about one root in five).
std::vector<std::int32_t> random_tree(index_t tokens, std::mt19937_64& rng) {
  std::vector<std::int32_t> parents;
  for (index_t t = 0; t < tokens; ++t) {
    std::uniform_int_distribution<std::int32_t> pick(-1, static_cast<std::int32_t>(t) - 1);
    const std::int32_t p = pick(rng);
    parents.push_back(t == 0 || rng() % 5 == 0 ? -1 : std::max<std::int32_t>(p, 0));
  }
  return parents;
}

/// Whether draft u is t or an ancestor of t, walking the parent array.
bool is_ancestor(const std::int32_t* parents, index_t u, index_t t) {
  for (index_t x = t; x >= 0; x = parents[x])
    if (x == u) return true;
  return false;
}

/// A mask_mod as a dense [B, 1, seqlen_q, max_k] boolean mask, for the reference and the
/// built-in mask path.
template <class MaskMod>
struct DenseMask {
  std::unique_ptr<bool[]> data;
  ScoreMaskView view;
  DenseMask(const MaskMod& mod, index_t batch, index_t nq, index_t nk)
      : data(new bool[static_cast<std::size_t>(batch * nq * nk)]), view{data.get(), {batch, 1, nq, nk}, {nq * nk, 0, nk, 1}} {
    for (index_t b = 0; b < batch; ++b)
      for (index_t i = 0; i < nq; ++i)
        for (index_t j = 0; j < nk; ++j) data[static_cast<std::size_t>((b * nq + i) * nk + j)] = mod(b, 0, i, j);
  }
};

template <class Mask>
void run_flex(PagedBatch<float>& batch, const Mask& mask, const PagedOptions& options) {
  forward_paged_flex(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     batch.o_view(), batch.lse_view(), flex::no_score_mod{}, mask, options);
}

TEST(DraftTree, EachDraftSeesTheAcceptedPositionsAndItsAncestors) {
  std::mt19937_64 rng(5);
  const index_t tokens = 70;  // two words of ancestor bits
  const std::vector<std::int32_t> parents = random_tree(tokens, rng);
  const std::vector<std::int32_t> seqlens{70, 200, 71};
  const auto mask = draft_tree_mask(parents, tokens, seqlens, BlockSize{16, 32});
  for (index_t b = 0; b < 3; ++b) {
    const index_t prefix = seqlens[static_cast<std::size_t>(b)] - tokens;
    for (index_t t = 0; t < tokens; ++t)
      for (index_t j = 0; j < seqlens[static_cast<std::size_t>(b)]; ++j) {
        const bool want = j < prefix || is_ancestor(parents.data(), j - prefix, t);
        ASSERT_EQ(mask.mask_mod()(b, 0, t, j), want) << "b " << b << " draft " << t << " key " << j;
      }
    // Each block's kind from the walk: full where every (draft, key) of it is seen, empty
    // where none is (keys past the sequence are not seen), partial otherwise.
    for (index_t qb = 0; qb < mask.q_blocks(); ++qb)
      for (index_t kb = 0; kb < mask.kv_blocks(); ++kb) {
        bool seen = false, hidden = false;
        for (index_t t = qb * 16; t < std::min(tokens, (qb + 1) * 16); ++t)
          for (index_t j = kb * 32; j < std::min<index_t>(mask.seqlen_k(), (kb + 1) * 32); ++j) {
            const bool v = j < prefix || (j < seqlens[static_cast<std::size_t>(b)] &&
                                          is_ancestor(parents.data(), j - prefix, t));
            (v ? seen : hidden) = true;
          }
        const BlockKind want = seen && hidden ? BlockKind::partial : seen ? BlockKind::full : BlockKind::empty;
        EXPECT_EQ(mask.kind(b, 0, qb, kb), want) << "b " << b << " query block " << qb << " key block " << kb;
      }
  }
}

struct VerifyCase {
  std::vector<index_t> k_lens;
  index_t tokens;
  bool per_sequence;
  index_t num_splits;
};

class TreeVerify : public ::testing::TestWithParam<VerifyCase> {};

TEST_P(TreeVerify, MatchesTheReferenceWithTheTreeAsADenseMask) {
  const VerifyCase& c = GetParam();
  std::mt19937_64 rng(17 + c.tokens);
  PagedBatch<float> batch(PagedShape{c.k_lens, c.tokens, 4, 2, 40, 24, 16}, 9);
  std::vector<std::int32_t> parents;
  for (std::size_t b = 0; b < (c.per_sequence ? c.k_lens.size() : 1); ++b) {
    const auto tree = random_tree(c.tokens, rng);
    parents.insert(parents.end(), tree.begin(), tree.end());
  }
  const auto mask = draft_tree_mask(parents, c.tokens, batch.seqlens, BlockSize{16, 64});
  const DenseMask dense(mask.mask_mod(), batch.shape.batch(), c.tokens, batch.max_k);
  PagedOptions options;
  options.num_splits = c.num_splits;
  std::vector<float> first_o, first_lse;
  for (std::size_t budget : {std::size_t{0}, rows_budget(16, 40, 24)}) {
    options.sram_budget_bytes = budget;
    batch.reset_outputs();
    run_flex(batch, mask, options);
    PagedOptions reference = options;
    reference.mask = dense.view;
    expect_close(batch.against_reference(reference));
    if (budget == 0) {
      first_o = batch.o, first_lse = batch.lse;
      for (const Backend backend : compiled_backends())
        for (int threads : {1, 2, 3}) {
          PagedOptions again = options;
          again.execution = {backend, threads};
          batch.reset_outputs();
          run_flex(batch, mask, again);
          EXPECT_TRUE(bitwise_equal(batch.o, first_o) && bitwise_equal(batch.lse, first_lse))
              << to_string(backend) << ", " << threads << " threads";
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Trees, TreeVerify,
                         ::testing::Values(VerifyCase{{17, 300, 1000}, 17, false, 0},
                                           VerifyCase{{64, 129}, 64, true, 0},
                                           VerifyCase{{1, 2000}, 1, false, 4},     // a one-token draft, split
                                           VerifyCase{{500, 3000}, 33, true, 3}));  // split-KV under a tree

// A custom mask_mod (attention to the first 8 positions plus a local band: StreamingLLM) and a
// score_mod on the paged path and its varlen form.
TEST(PagedFlex, CustomModsMatchTheReference) {
  const auto streaming = [](index_t, index_t, index_t i, index_t j) { return j < 8 || (j <= i + 290 && j + 40 > i + 290); };
  PagedBatch<float> batch(PagedShape{{300, 300}, 10, 4, 4, 32, 0, 16}, 4);
  const DenseMask dense(streaming, 2, 10, 300);
  PagedOptions options, reference;
  reference.mask = dense.view;
  forward_paged_flex(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     batch.o_view(), batch.lse_view(), flex::no_score_mod{}, streaming, options);
  expect_close(batch.against_reference(reference));
  // The varlen form over the same rows (two sequences of 10 queries each).
  const std::vector<float> fixed_o = batch.o;
  batch.reset_outputs();
  const std::vector<std::int32_t> cu{0, 10, 20};
  forward_paged_flex_varlen(make_thd<const float>(batch.q.data(), 20, 4, 32), batch.k_cache(), batch.v_cache(),
                            batch.block_table(), batch.seqlens, make_thd(batch.o.data(), 20, 4, 32),
                            make_packed_lse(batch.lse.data(), 4, 20), cu, flex::no_score_mod{},
                            create_block_mask(streaming, 1, 1, 10, 300, BlockSize{8, 32}), options);
  EXPECT_TRUE(bitwise_equal(batch.o, fixed_o));
  // A score_mod: ALiBi written by hand gives the built-in ALiBi's results.
  const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
  const auto alibi = [&](float s, index_t, index_t h, index_t i, index_t j) {
    return s - slopes[h] * static_cast<float>(std::abs(i + 290 - j));
  };
  batch.reset_outputs();
  forward_paged_flex(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     batch.o_view(), batch.lse_view(), alibi, flex::no_mask{}, options);
  PagedOptions with_alibi;
  with_alibi.alibi_slopes = slopes;
  expect_close(batch.against_reference(with_alibi));
}

// The K/V bytes of a block-sparse paged call are those of the key tiles its blocks leave.
TEST(PagedFlex, EmptyBlocksAreNeverRead) {
  constexpr index_t d = 32, n = 1024, block = 64;
  const auto every_other = [](index_t, index_t, index_t, index_t j) { return (j / block) % 2 == 0; };
  PagedBatch<float> batch(PagedShape{{n}, 4, 2, 2, d, 0, 16}, 2);
  const auto mask = create_block_mask(every_other, 1, 1, 4, n, BlockSize{4, block});
  PagedOptions options;
  options.num_splits = 1;
  options.sram_budget_bytes = rows_budget(8, d);
  IoCounts counts;
  options.io_counts = &counts;
  run_flex(batch, mask, options);
  const std::uint64_t q_bytes = 4 * 2 * d * sizeof(float), out_bytes = 4 * 2 * (d + 1) * sizeof(float);
  const std::uint64_t kv_bytes = counts.bytes_read - q_bytes;
  EXPECT_EQ(kv_bytes, std::uint64_t{n / 2} * 2 * 2 * d * sizeof(float)) << "K and V of the 8 visible blocks, 2 heads";
  EXPECT_EQ(counts.bytes_written, out_bytes);
  const DenseMask dense(every_other, 1, 4, n);
  PagedOptions reference;
  reference.mask = dense.view;
  expect_close(batch.against_reference(reference));
}

TEST(DraftTree, BadArgumentsNameTheirParameter) {
  const std::vector<std::int32_t> seqlens{10, 20};
  const auto rejects = [](auto&& call, const std::string& parameter) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error naming " << parameter;
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), parameter) << e.what();
    }
  };
  const std::vector<std::int32_t> ok{-1, 0, 1}, later{-1, 2, 1}, below{-2, 0, 0}, self{-1, 1, 0};
  rejects([&] { draft_tree_mask(later, 3, seqlens); }, "parents");
  rejects([&] { draft_tree_mask(below, 3, seqlens); }, "parents");
  rejects([&] { draft_tree_mask(self, 3, seqlens); }, "parents");
  rejects([&] { draft_tree_mask(std::span(ok).first(2), 3, seqlens); }, "parents");
  rejects([&] { draft_tree_mask(ok, 0, seqlens); }, "tokens");
  rejects([&] { draft_tree_mask(ok, 3, std::vector<std::int32_t>{10, 2}); }, "cache_seqlens");
  rejects([&] { draft_tree_mask(ok, 3, std::vector<std::int32_t>{}); }, "cache_seqlens");
  // A tree mask for other cache_seqlens: the call rejects it and writes nothing.
  PagedBatch<float> batch(PagedShape{{40, 9}, 3, 2, 1, 16, 0, 16}, 1);
  const auto mask = draft_tree_mask(ok, 3, std::vector<std::int32_t>{40, 50});
  rejects([&] { run_flex(batch, mask, {}); }, "block_mask");
  EXPECT_TRUE(all_equal(batch.lse, sentinel));
  // The same longest sequence but another's length (issue #42 item 7): the block mask's
  // extents fit, but its drafts would sit at positions 5..7 of sequence 1's 9 keys, not
  // 6..8; silently wrong attention until the tree checked the call.
  rejects([&] { run_flex(batch, draft_tree_mask(ok, 3, std::vector<std::int32_t>{40, 8}), {}); }, "block_mask");
  // A tree of one sequence broadcast over two: read its prefixes past their end (ASan: a
  // heap-buffer-overflow) until the tree checked the call's batch.
  rejects([&] { run_flex(batch, draft_tree_mask(ok, 3, std::vector<std::int32_t>{40}), {}); }, "block_mask");
  EXPECT_TRUE(all_equal(batch.lse, sentinel) && all_equal(batch.o, sentinel));
}

// ---- Plans -------------------------------------------------------------------------------
// Under the draft tree's block mask and no score_mod, the kernels run_flex compiles.

template <class Mask>
PagedPlan plan_flex(PagedBatch<float>& batch, const Mask& mask, const PagedOptions& options) {
  return plan_forward_paged_flex(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                 batch.o_view(), batch.lse_view(), flex::no_score_mod{}, mask, options);
}

template <class Mask>
void run_flex(const PagedPlan& plan, PagedBatch<float>& batch, const Mask& mask, const PagedOptions& options) {
  forward_paged_flex(plan, batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     batch.o_view(), batch.lse_view(), flex::no_score_mod{}, mask, options);
}

/// The batch's rows as a packed call (forward_paged_flex_varlen, planned when `plan` is
/// given): every sequence's q_len rows, cu_seqlens_q 0, q_len, 2 q_len, ...; O and LSE into
/// o and lse ([total, heads, dv] and [heads, total]).
template <class Mask>
void run_flex_varlen(const PagedPlan* plan, PagedBatch<float>& batch, const Mask& mask, const PagedOptions& options,
                     std::vector<float>& o, std::vector<float>& lse) {
  const PagedShape& s = batch.shape;
  const index_t total = s.batch() * s.q_len;
  std::vector<std::int32_t> cu;
  for (index_t b = 0; b <= s.batch(); ++b) cu.push_back(static_cast<std::int32_t>(b * s.q_len));
  const auto q = make_thd<const float>(batch.q.data(), total, s.heads_q, s.head_dim);
  const auto ov = make_thd(o.data(), total, s.heads_q, s.dv());
  const auto lv = make_packed_lse(lse.data(), s.heads_q, total);
  if (plan)
    forward_paged_flex_varlen(*plan, q, batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens, ov, lv,
                              cu, flex::no_score_mod{}, mask, options);
  else
    forward_paged_flex_varlen(q, batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens, ov, lv, cu,
                              flex::no_score_mod{}, mask, options);
}

template <class Mask>
PagedPlan plan_flex_varlen(PagedBatch<float>& batch, const Mask& mask, const PagedOptions& options,
                           std::vector<float>& o, std::vector<float>& lse) {
  const PagedShape& s = batch.shape;
  const index_t total = s.batch() * s.q_len;
  std::vector<std::int32_t> cu;
  for (index_t b = 0; b <= s.batch(); ++b) cu.push_back(static_cast<std::int32_t>(b * s.q_len));
  return plan_forward_paged_flex_varlen(make_thd<const float>(batch.q.data(), total, s.heads_q, s.head_dim),
                                        batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                        make_thd(o.data(), total, s.heads_q, s.dv()),
                                        make_packed_lse(lse.data(), s.heads_q, total), cu, flex::no_score_mod{}, mask,
                                        options);
}

/// One random draft tree of `tokens` per sequence of the batch, over its cache_seqlens.
BlockMask<flex::draft_tree> random_trees(const PagedBatch<float>& batch, index_t tokens, std::uint64_t seed,
                                         BlockSize block = {16, 64}) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> parents;
  for (index_t b = 0; b < batch.shape.batch(); ++b) {
    const auto tree = random_tree(tokens, rng);
    parents.insert(parents.end(), tree.begin(), tree.end());
  }
  return draft_tree_mask(parents, tokens, batch.seqlens, block);
}

// plan_forward_paged_flex(_varlen) and the plan overloads: the unplanned calls' bits, over
// sequences of 3, 17 and 127 keys verifying 3-token draft trees, with and without split-KV;
// planning writes nothing. A plan serves another tree of the same block size (the mask only
// orders the work).
TEST(PagedFlex, PlanGivesTheUnplannedCallsBits) {
  PagedBatch<float> batch(PagedShape{{3, 17, 127}, 3, 4, 2, 40, 24, 16}, 12);
  const auto trees = random_trees(batch, 3, 13), other_trees = random_trees(batch, 3, 14);
  const std::size_t o_size = batch.o.size(), lse_size = batch.lse.size();
  for (index_t splits : {0, 3}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedOptions opt;
    opt.num_splits = splits;
    batch.reset_outputs();
    run_flex(batch, trees, opt);
    const std::vector<float> want_o = batch.o, want_lse = batch.lse;
    batch.reset_outputs();
    const PagedPlan plan = plan_flex(batch, trees, opt);
    EXPECT_EQ(plan.keys_per_split() > 0, splits == 3);  // 3: sequence 2 in chunks of 64 keys
    EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel));
    run_flex(plan, batch, trees, opt);
    EXPECT_TRUE(bitwise_equal(batch.o, want_o));
    EXPECT_TRUE(bitwise_equal(batch.lse, want_lse));
    // Another tree on the same plan.
    batch.reset_outputs();
    run_flex(batch, other_trees, opt);
    const std::vector<float> other_o = batch.o, other_lse = batch.lse;
    batch.reset_outputs();
    run_flex(plan, batch, other_trees, opt);
    EXPECT_TRUE(bitwise_equal(batch.o, other_o));
    EXPECT_TRUE(bitwise_equal(batch.lse, other_lse));
    // The varlen form.
    std::vector<float> o(o_size, sentinel), lse(lse_size, sentinel);
    run_flex_varlen(nullptr, batch, trees, opt, o, lse);
    const std::vector<float> want_packed_o = o, want_packed_lse = lse;
    o.assign(o_size, sentinel);
    lse.assign(lse_size, sentinel);
    const PagedPlan packed = plan_flex_varlen(batch, trees, opt, o, lse);
    EXPECT_EQ(packed.keys_per_split() > 0, splits == 3);
    EXPECT_TRUE(all_equal(o, sentinel) && all_equal(lse, sentinel));
    run_flex_varlen(&packed, batch, trees, opt, o, lse);
    EXPECT_TRUE(bitwise_equal(o, want_packed_o));
    EXPECT_TRUE(bitwise_equal(lse, want_packed_lse));
  }
}

// A plan used with a call it was not made for throws invalid_argument naming "plan" and
// writes nothing: other cache_seqlens (with a tree made for them), another block size, the
// plan of the tree's mask_mod without its blocks, other options; the varlen form likewise.
// The planner checks the call's arguments (a tree for other cache_seqlens: "block_mask").
TEST(PagedFlex, PlanOfAnotherCallIsRejectedWithNothingWritten) {
  PagedBatch<float> batch(PagedShape{{3, 17, 127}, 3, 4, 2, 40, 24, 16}, 15);
  const std::vector<std::int32_t> chain{-1, 0, 1};
  const auto tree = draft_tree_mask(chain, 3, batch.seqlens, BlockSize{16, 64});
  const PagedPlan plan = plan_flex(batch, tree, {});
  const auto expect_rejected = [&](auto&& call, const std::string& name) {
    batch.reset_outputs();
    EXPECT_THROW_NAMING(call(), name);
    EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel)) << name;
  };
  batch.seqlens[2] = 126;
  const auto shorter = draft_tree_mask(chain, 3, batch.seqlens, BlockSize{16, 64});
  expect_rejected([&] { run_flex(plan, batch, shorter, {}); }, "plan");
  batch.seqlens[2] = 127;
  const auto other_blocks = draft_tree_mask(chain, 3, batch.seqlens, BlockSize{16, 32});
  expect_rejected([&] { run_flex(plan, batch, other_blocks, {}); }, "plan");
  const PagedPlan unblocked = plan_flex(batch, tree.mask_mod(), {});
  expect_rejected([&] { run_flex(unblocked, batch, tree, {}); }, "plan");
  PagedOptions split;
  split.num_splits = 2;
  expect_rejected([&] { run_flex(plan, batch, tree, split); }, "plan");
  expect_rejected([&] { plan_flex(batch, shorter, {}); }, "block_mask");
  // Varlen: a plan of other options.
  const PagedPlan packed = plan_flex_varlen(batch, tree, split, batch.o, batch.lse);
  expect_rejected([&] { run_flex_varlen(&packed, batch, tree, {}, batch.o, batch.lse); }, "plan");
  batch.reset_outputs();
  run_flex_varlen(&packed, batch, tree, split, batch.o, batch.lse);  // the call it was made for
  EXPECT_FALSE(all_equal(batch.o, sentinel));
}

}  // namespace
}  // namespace tileattn::test
