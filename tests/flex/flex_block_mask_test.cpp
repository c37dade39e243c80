// tests/flex/flex_block_mask_test.cpp: the block masks of flexible attention
// (flex/block_mask.hpp) and the mod library (flex/mods.hpp), without the kernels:
//   - create_block_mask's kinds against a brute-force per-element evaluation, for every
//     library mask, a random-layout block_sparse, a per-batch / per-head mask (batch 2,
//     heads 3), block sizes 16 x 16, 7 x 13, 128 x 128 and 1 x 1, odd and empty lengths, on
//     the serial and a parallel backend; count(), density(), the accessors, broadcasting;
//   - copies and moves keep their own kinds; bad arguments throw invalid_argument by name;
//   - each library mod against the formula docs/flex.md gives for it, in float and double;
//   - each library score mod's grad() against a central difference in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/flex_support.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::document_ids;
using test::random_layout;

const char* name(BlockKind k) { return k == BlockKind::empty ? "empty" : k == BlockKind::full ? "full" : "partial"; }

// ---- Classification against brute force -----------------------------------------------------------

/// create_block_mask(mask, batch, heads, nq, nk, bs, exec) against counting every block's
/// visible positions one by one; the counts and density against those of the brute force.
template <class Mask>
void check_classification(const Mask& mask, index_t batch, index_t heads, index_t nq, index_t nk, BlockSize bs,
                          Execution exec = {Backend::serial, 1}) {
  SCOPED_TRACE(std::to_string(nq) + " x " + std::to_string(nk) + " in blocks of " + std::to_string(bs.q) + " x " +
               std::to_string(bs.kv) + ", batch " + std::to_string(batch) + ", heads " + std::to_string(heads) + ", " +
               to_string(exec.backend));
  const BlockMask<Mask> bm = create_block_mask(mask, batch, heads, nq, nk, bs, exec);
  const index_t qb_n = (nq + bs.q - 1) / bs.q, kb_n = (nk + bs.kv - 1) / bs.kv;
  ASSERT_EQ(bm.q_blocks(), qb_n);
  ASSERT_EQ(bm.kv_blocks(), kb_n);
  EXPECT_EQ(bm.batch(), batch);
  EXPECT_EQ(bm.heads(), heads);
  EXPECT_EQ(bm.seqlen_q(), nq);
  EXPECT_EQ(bm.seqlen_k(), nk);
  EXPECT_EQ(bm.block_size().q, bs.q);
  EXPECT_EQ(bm.block_size().kv, bs.kv);
  std::array<index_t, 3> counts{};
  int mismatches = 0;
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < heads; ++h)
      for (index_t qb = 0; qb < qb_n; ++qb)
        for (index_t kb = 0; kb < kb_n; ++kb) {
          index_t visible = 0, total = 0;
          for (index_t i = qb * bs.q; i < std::min(nq, (qb + 1) * bs.q); ++i)
            for (index_t j = kb * bs.kv; j < std::min(nk, (kb + 1) * bs.kv); ++j, ++total) visible += mask(b, h, i, j);
          const BlockKind want = visible == 0       ? BlockKind::empty
                                 : visible == total ? BlockKind::full
                                                    : BlockKind::partial;
          ++counts[static_cast<std::size_t>(want)];
          const BlockKind got = bm.kind(b, h, qb, kb);
          if (got != want && ++mismatches <= 3)
            ADD_FAILURE() << "block (" << b << ", " << h << ", " << qb << ", " << kb << ") is " << name(got) << ", "
                          << visible << " of its " << total << " positions are visible";
          EXPECT_EQ(bm.kinds()(b, h, qb, kb), got) << "kinds() and kind() disagree";
        }
  EXPECT_EQ(mismatches, 0);
  const index_t blocks = batch * heads * qb_n * kb_n;
  EXPECT_EQ(bm.count(BlockKind::empty), counts[0]);
  EXPECT_EQ(bm.count(BlockKind::partial), counts[1]);
  EXPECT_EQ(bm.count(BlockKind::full), counts[2]);
  EXPECT_DOUBLE_EQ(bm.density(), blocks ? 1.0 - static_cast<double>(counts[0]) / static_cast<double>(blocks) : 0.0);
}

const BlockSize block_sizes[] = {{16, 16}, {7, 13}, {128, 128}, {1, 1}};
const std::pair<index_t, index_t> lengths[] = {{1, 1}, {17, 127}, {127, 17}, {300, 300}, {0, 17}, {17, 0}};

/// Every block size and length of the lists above; `make(nq, nk)` builds the mask for them.
template <class Make>
void check_everywhere(Make&& make, index_t batch = 1, index_t heads = 1) {
  for (const BlockSize& bs : block_sizes)
    for (auto [nq, nk] : lengths) check_classification(make(nq, nk), batch, heads, nq, nk, bs);
}

TEST(FlexBlockMaskClassification, Causal) {
  check_everywhere([](index_t, index_t) { return flex::causal{}; });
  check_everywhere([](index_t nq, index_t nk) { return flex::causal{nk - nq}; });
  check_everywhere([](index_t, index_t) { return flex::causal{-5}; });
}

TEST(FlexBlockMaskClassification, SlidingWindow) {
  check_everywhere([](index_t, index_t) { return flex::sliding_window{20, 5, 0}; });
  check_everywhere([](index_t nq, index_t nk) { return flex::sliding_window{-1, 0, nk - nq}; });
  check_everywhere([](index_t, index_t) { return flex::sliding_window{3, -1, 7}; });
}

TEST(FlexBlockMaskClassification, Document) {
  const auto ids = document_ids(300, 1, 60), other = document_ids(300, 2, 25);
  check_everywhere([&](index_t, index_t) { return flex::document{ids}; });
  check_everywhere([&](index_t, index_t) { return flex::document{ids, other}; });
}

TEST(FlexBlockMaskClassification, PrefixLmGlobalAndDilatedWindows) {
  check_everywhere([](index_t, index_t) { return flex::prefix_lm{50}; });
  check_everywhere([](index_t, index_t) { return flex::global_window{3, 10}; });
  check_everywhere([](index_t, index_t) { return flex::dilated_window{20, 3}; });
}

TEST(FlexBlockMaskClassification, RandomBlockSparseLayout) {
  const index_t block = 16, n = (300 + block - 1) / block;
  const auto layout = random_layout(n * n, 0.3, 3);
  check_everywhere([&](index_t, index_t) { return flex::block_sparse{layout, n, block}; });
  // Built with the layout's block size, every block is empty or full, as the layout says.
  const auto bm = create_block_mask(flex::block_sparse{layout, n, block}, 1, 1, 300, 300, {block, block});
  EXPECT_EQ(bm.count(BlockKind::partial), 0);
  for (index_t qb = 0; qb < n; ++qb)
    for (index_t kb = 0; kb < n; ++kb)
      EXPECT_EQ(bm.kind(0, 0, qb, kb),
                layout[static_cast<std::size_t>(qb * n + kb)] ? BlockKind::full : BlockKind::empty);
}

TEST(FlexBlockMaskClassification, AndOrNoMaskAndNothingVisible) {
  const auto ids = document_ids(300, 4, 40);
  check_everywhere([&](index_t, index_t) { return flex::and_masks{flex::causal{}, flex::document{ids}}; });
  check_everywhere([](index_t, index_t) { return flex::or_masks{flex::sliding_window{4, 4, 0}, flex::prefix_lm{9}}; });
  check_everywhere([](index_t, index_t) { return flex::no_mask{}; });
  check_everywhere([](index_t, index_t) { return [](index_t, index_t, index_t, index_t) { return false; }; });
}

TEST(FlexBlockMaskClassification, PerBatchAndPerHead) {
  const auto mask = [](index_t b, index_t h, index_t i, index_t j) {
    return (i + 2 * j + 3 * b + 5 * h) % 7 != 0 && j <= i + 40 * h + 13 * b;
  };
  check_everywhere([&](index_t, index_t) { return mask; }, 2, 3);
  // A per-head mask the kinds of each head tell apart.
  const auto head_window = [](index_t, index_t h, index_t i, index_t j) { return i - j <= 10 * h && j <= i; };
  check_classification(head_window, 1, 4, 300, 300, {16, 16});
}

TEST(FlexBlockMaskClassification, ParallelBackendsGiveTheSameKinds) {
  const auto ids = document_ids(300, 5, 70);
  const auto mask = flex::and_masks{flex::causal{}, flex::document{ids}};
  for (Backend b : {Backend::openmp, Backend::tbb})
    if (backend_available(b))
      for (int threads : {2, 3}) check_classification(mask, 2, 2, 300, 257, {24, 40}, {b, threads});
}

// ---- The block mask object ---------------------------------------------------------------------------

/// Every kind of a and b equal.
template <class M>
bool same_kinds(const BlockMask<M>& a, const BlockMask<M>& b) {
  if (a.batch() != b.batch() || a.heads() != b.heads() || a.q_blocks() != b.q_blocks() ||
      a.kv_blocks() != b.kv_blocks())
    return false;
  for (index_t bi = 0; bi < a.batch(); ++bi)
    for (index_t h = 0; h < a.heads(); ++h)
      for (index_t qb = 0; qb < a.q_blocks(); ++qb)
        for (index_t kb = 0; kb < a.kv_blocks(); ++kb)
          if (a.kind(bi, h, qb, kb) != b.kind(bi, h, qb, kb) || a.kinds()(bi, h, qb, kb) != a.kind(bi, h, qb, kb))
            return false;
  return true;
}

TEST(FlexBlockMaskObject, ExtentOneBroadcasts) {
  const auto bm = create_block_mask(flex::causal{}, 1, 1, 127, 300, {16, 16});
  for (index_t qb = 0; qb < bm.q_blocks(); ++qb)
    for (index_t kb = 0; kb < bm.kv_blocks(); ++kb) EXPECT_EQ(bm.kinds()(3, 5, qb, kb), bm.kind(0, 0, qb, kb));
  EXPECT_EQ(bm.kinds().batch, 1);
  EXPECT_EQ(bm.kinds().heads, 1);
}

TEST(FlexBlockMaskObject, CountsAndDensity) {
  // Causal 128 x 128 in 32 x 32 blocks: the 4 diagonal blocks partial, 6 full below, 6 empty above.
  const auto bm = create_block_mask(flex::causal{}, 1, 1, 128, 128, {32, 32});
  EXPECT_EQ(bm.count(BlockKind::partial), 4);
  EXPECT_EQ(bm.count(BlockKind::full), 6);
  EXPECT_EQ(bm.count(BlockKind::empty), 6);
  EXPECT_DOUBLE_EQ(bm.density(), 10.0 / 16.0);
  EXPECT_DOUBLE_EQ(create_block_mask(flex::no_mask{}, 2, 2, 17, 17, {7, 13}).density(), 1.0);
  const auto none = create_block_mask([](index_t, index_t, index_t, index_t) { return false; }, 1, 1, 17, 17);
  EXPECT_DOUBLE_EQ(none.density(), 0.0);
  const auto empty = create_block_mask(flex::causal{}, 1, 1, 0, 17);
  EXPECT_EQ(empty.q_blocks(), 0);
  EXPECT_DOUBLE_EQ(empty.density(), 0.0);
  EXPECT_EQ(empty.count(BlockKind::empty), 0);
  // set_kind edits one block.
  auto edited = bm;
  edited.set_kind(0, 0, 0, 3, BlockKind::full);
  EXPECT_EQ(edited.count(BlockKind::full), 7);
  EXPECT_EQ(edited.kind(0, 0, 0, 3), BlockKind::full);
  EXPECT_EQ(bm.kind(0, 0, 0, 3), BlockKind::empty) << "editing a copy changed the original";
}

TEST(FlexBlockMaskObject, CopiesAndMovesKeepTheirKinds) {
  const auto ids = document_ids(300, 6, 50);
  using Mask = flex::and_masks<flex::causal, flex::document>;
  const Mask mask{flex::causal{}, flex::document{ids}};
  const BlockMask<Mask> want = create_block_mask(mask, 2, 3, 300, 127, {7, 13});
  auto original = std::make_unique<BlockMask<Mask>>(want);
  EXPECT_TRUE(same_kinds(*original, want));
  EXPECT_NE(original->kinds().data, want.kinds().data) << "a copy shares its original's kinds";
  BlockMask<Mask> copy(*original);
  BlockMask<Mask> assigned = create_block_mask(mask, 1, 1, 5, 5);
  assigned = *original;
  original.reset();  // the copies outlive it (ASan sees a use after free)
  EXPECT_TRUE(same_kinds(copy, want));
  EXPECT_TRUE(same_kinds(assigned, want));
  EXPECT_EQ(assigned.seqlen_q(), 300);
  auto& self = assigned;
  assigned = self;
  EXPECT_TRUE(same_kinds(assigned, want));
  const BlockKind* before = copy.kinds().data;
  BlockMask<Mask> moved(std::move(copy));
  EXPECT_EQ(moved.kinds().data, before) << "a move keeps the buffer";
  EXPECT_TRUE(same_kinds(moved, want));
  BlockMask<Mask> move_assigned = create_block_mask(mask, 1, 1, 5, 5);
  move_assigned = std::move(moved);
  EXPECT_TRUE(same_kinds(move_assigned, want));
  EXPECT_TRUE(move_assigned.mask_mod()(0, 0, 10, 3) == mask(0, 0, 10, 3));
  std::vector<BlockMask<Mask>> many;  // reallocation moves them
  for (int i = 0; i < 9; ++i) many.push_back(want);
  for (const auto& m : many) EXPECT_TRUE(same_kinds(m, want));
}

// ---- Bad arguments -------------------------------------------------------------------------------

template <class F>
void expect_invalid(F&& f, const std::string& parameter) {
  try {
    f();
    ADD_FAILURE() << "no invalid_argument (expected one naming " << parameter << ")";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
  }
}

TEST(FlexBlockMaskErrors, BadArgumentsThrowByName) {
  const flex::causal m{};
  expect_invalid([&] { create_block_mask(m, 0, 1, 17, 17); }, "batch");
  expect_invalid([&] { create_block_mask(m, -2, 1, 17, 17); }, "batch");
  expect_invalid([&] { create_block_mask(m, 1, 0, 17, 17); }, "heads");
  expect_invalid([&] { create_block_mask(m, 1, 1, -1, 17); }, "seqlen_q");
  expect_invalid([&] { create_block_mask(m, 1, 1, 17, -1); }, "seqlen_k");
  expect_invalid([&] { create_block_mask(m, 1, 1, 17, 17, {0, 16}); }, "block");
  expect_invalid([&] { create_block_mask(m, 1, 1, 17, 17, {16, 0}); }, "block");
  expect_invalid([&] { create_block_mask(m, 1, 1, 17, 17, {-4, -4}); }, "block");
  expect_invalid([&] { create_block_mask(m, 1, 1, 17, 17, {16, 16}, {Backend::serial, -1}); }, "num_threads");
}

// Issue 27, N3: the block count was unchecked int64 (a segfault at 2^62 keys, length_error
// at INT64_MAX, 0 stored blocks for 2^70 of them). Now at most max_allocation_bytes blocks
// (one byte each), named after the extent that passes it; the constructor checks the same.
TEST(FlexBlockMaskErrors, BlockCountsPastTheAddressSpaceAreNamed) {
  const flex::causal m{};
  const index_t big = index_t{1} << 62, max = std::numeric_limits<index_t>::max();
  expect_invalid([&] { create_block_mask(m, 512, 1, 16, big); }, "seqlen_k");
  expect_invalid([&] { create_block_mask(m, 1, 1, 16, max); }, "seqlen_k");
  expect_invalid([&] { create_block_mask(m, 1, 1, max, 16, {1, 16}); }, "seqlen_q");
  expect_invalid([&] { create_block_mask(m, index_t{1} << 40, index_t{1} << 30, 16, 16); }, "heads");
  expect_invalid([&] { create_block_mask(m, max, 1, 16, 16); }, "batch");
  expect_invalid([&] { create_block_mask(m, 1, 1, max, max, {1, 1}); }, "seqlen_q");
  expect_invalid([&] { BlockMask<flex::causal>(m, 1, 1, 16, max, {1, 1}); }, "seqlen_k");
  expect_invalid([&] { BlockMask<flex::causal>(m, 0, 1, 16, 16, {}); }, "batch");
  // Blocks as large as the extents: one block each way, no overflow in their bounds.
  const auto one = create_block_mask(m, 1, 1, big + 1, 3, {big, max});
  EXPECT_EQ(one.q_blocks(), 2);
  EXPECT_EQ(one.kv_blocks(), 1);
  EXPECT_EQ(one.kind(0, 0, 0, 0), BlockKind::partial);  // query 0 sees key 0 only
  EXPECT_EQ(one.kind(0, 0, 1, 0), BlockKind::full);     // query 2^62 sees all 3
}

// ---- The mod library against docs/flex.md's formulas ---------------------------------------------

TEST(FlexMods, MasksFollowTheirFormulas) {
  const auto ids = document_ids(60, 7, 9), other = document_ids(60, 8, 5);
  const auto layout = random_layout(4 * 4, 0.5, 9);
  for (index_t i = 0; i < 60; ++i)
    for (index_t j = 0; j < 60; ++j) {
      SCOPED_TRACE(std::to_string(i) + ", " + std::to_string(j));
      const index_t d = i - j;
      EXPECT_EQ(flex::causal{}(0, 0, i, j), j <= i);
      EXPECT_EQ(flex::causal{7}(0, 0, i, j), j <= i + 7);
      EXPECT_EQ((flex::sliding_window{5, 2, 3}(0, 0, i, j)), i + 3 - 5 <= j && j <= i + 3 + 2);
      EXPECT_EQ((flex::sliding_window{-1, 0, 0}(0, 0, i, j)), j <= i);
      EXPECT_EQ((flex::sliding_window{4, -1, -2}(0, 0, i, j)), i - 2 - 4 <= j);
      EXPECT_EQ(flex::document{ids}(0, 0, i, j), ids[static_cast<std::size_t>(i)] == ids[static_cast<std::size_t>(j)]);
      EXPECT_EQ((flex::document{ids, other}(0, 0, i, j)),
                ids[static_cast<std::size_t>(i)] == other[static_cast<std::size_t>(j)]);
      EXPECT_EQ(flex::prefix_lm{10}(0, 0, i, j), j < 10 || j <= i);
      EXPECT_EQ((flex::global_window{2, 3}(0, 0, i, j)), i < 2 || j < 2 || std::abs(d) <= 3);
      EXPECT_EQ((flex::dilated_window{4, 3}(0, 0, i, j)), d >= 0 && d <= 12 && d % 3 == 0);
      EXPECT_EQ((flex::block_sparse{layout, 4, 16}(0, 0, i, j)),
                layout[static_cast<std::size_t>(i / 16 * 4 + j / 16)] != 0);
      EXPECT_EQ((flex::and_masks{flex::causal{}, flex::prefix_lm{10}}(0, 0, i, j)), j <= i);
      EXPECT_EQ((flex::or_masks{flex::causal{}, flex::prefix_lm{10}}(0, 0, i, j)), j <= i || j < 10);
      EXPECT_TRUE(flex::no_mask{}(0, 0, i, j));
    }
}

TEST(FlexMods, ScoreModsFollowTheirFormulasInFloatAndDouble) {
  const std::vector<float> slopes{0.5f, 0.125f, 0.03f};
  const index_t md = 4;
  std::vector<float> table(3 * (2 * md + 1));
  for (std::size_t e = 0; e < table.size(); ++e) table[e] = 0.1f * static_cast<float>(e) - 1.0f;
  const flex::alibi alibi{slopes, 5};
  const flex::softcap cap{2.5f};
  const flex::relative_bias bias{table, md};
  for (double s : {-40.0, -3.1, -0.2, 0.0, 0.7, 6.0, 55.0})
    for (index_t h = 0; h < 3; ++h)
      for (index_t i : {0, 3, 17})
        for (index_t j : {0, 1, 9, 30}) {
          SCOPED_TRACE("s " + std::to_string(s) + ", h " + std::to_string(h) + ", " + std::to_string(i) + ", " +
                       std::to_string(j));
          const double a = s - slopes[static_cast<std::size_t>(h)] * static_cast<double>(std::abs(i + 5 - j));
          EXPECT_DOUBLE_EQ(alibi(s, 0, h, i, j), a);
          EXPECT_NEAR(alibi(static_cast<float>(s), 0, h, i, j), a, 1e-6 * (1 + std::abs(a)));
          const double c = 2.5 * std::tanh(s / 2.5);
          EXPECT_DOUBLE_EQ(cap(s, 0, h, i, j), c);
          EXPECT_NEAR(cap(static_cast<float>(s), 0, h, i, j), c, 1e-6 * (1 + std::abs(c)));
          const index_t slot = std::clamp<index_t>(i - j, -md, md) + md;
          const double r = s + table[static_cast<std::size_t>(h * (2 * md + 1) + slot)];
          EXPECT_DOUBLE_EQ(bias(s, 0, h, i, j), r);
          EXPECT_NEAR(bias(static_cast<float>(s), 0, h, i, j), r, 1e-6 * (1 + std::abs(r)));
          EXPECT_EQ(flex::no_score_mod{}(s, 0, h, i, j), s);
        }
}

// ---- grad() against central differences ----------------------------------------------------------

/// |grad - (f(s + e) - f(s - e)) / 2e| <= 1e-7 (1 + |grad|) at e = 2^-17 in double (error
/// O(e^2 f''') ~ 1e-10 here, rounding ~ 1e-16 |f| / e ~ 1e-9 at |f| ~ 60).
template <class Mod>
void check_grad(const Mod& mod, const std::string& what) {
  SCOPED_TRACE(what);
  constexpr double e = 0x1p-17;
  for (double s : {-30.0, -7.3, -1.1, -0.01, 0.0, 0.4, 2.5, 9.0, 30.0})
    for (index_t h : {0, 1})
      for (auto [i, j] : {std::pair<index_t, index_t>{0, 0}, {5, 2}, {2, 40}}) {
        const double numeric = (mod(s + e, 0, h, i, j) - mod(s - e, 0, h, i, j)) / (2 * e);
        const double analytic = mod.grad(s, index_t{0}, h, i, j);
        EXPECT_NEAR(analytic, numeric, 1e-7 * (1 + std::abs(analytic))) << "at s " << s << ", h " << h;
        EXPECT_NEAR(mod.grad(static_cast<float>(s), index_t{0}, h, i, j), analytic, 1e-6 * (1 + std::abs(analytic)))
            << "float grad at s " << s;
      }
}

TEST(FlexMods, GradsMatchCentralDifferences) {
  const std::vector<float> slopes{0.5f, 0.0625f};
  std::vector<float> table(2 * 7);
  for (std::size_t e = 0; e < table.size(); ++e) table[e] = std::sin(static_cast<float>(e));
  check_grad(flex::alibi{slopes, 3}, "alibi");
  for (float cap : {0.7f, 2.0f, 30.0f}) check_grad(flex::softcap{cap}, "softcap " + std::to_string(cap));
  check_grad(flex::relative_bias{table, 3}, "relative_bias");
  check_grad(flex::no_score_mod{}, "no_score_mod");
  check_grad(flex::with_grad{[](auto s, index_t, index_t h, index_t, index_t) {
                               return s * s * decltype(s)(0.1) + std::sin(s) * static_cast<decltype(s)>(h + 1);
                             },
                             [](auto s, index_t, index_t h, index_t, index_t) {
                               return s * decltype(s)(0.2) + std::cos(s) * static_cast<decltype(s)>(h + 1);
                             }},
             "with_grad");
}

// The concepts say which callables the kernels take.
TEST(FlexMods, Concepts) {
  static_assert(mask_mod_function<flex::causal> && mask_mod_function<flex::no_mask>);
  static_assert(score_mod_with_grad<flex::alibi> && score_mod_with_grad<flex::softcap> &&
                score_mod_with_grad<flex::relative_bias> && score_mod_with_grad<flex::no_score_mod>);
  const auto plain = [](float s, index_t, index_t, index_t, index_t) { return s; };
  static_assert(score_mod_function<decltype(plain)> && !score_mod_with_grad<decltype(plain)>);
  static_assert(!mask_mod_function<flex::alibi> && !score_mod_function<flex::causal>);
  SUCCEED();
}

}  // namespace
}  // namespace tileattn
