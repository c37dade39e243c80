// tests/paged/paged_forward_test.cpp: tileattn::forward_paged (paged.hpp) against the
// double-precision reference: decoding, chunked prefill and speculative verify over
// shuffled, non-contiguous block tables with poisoned unused pages; page sizes that split
// key tiles; GQA/MQA; every score option; batches of very different lengths; split-KV
// against unsplit and against the contiguous forward (bitwise when unsplit); determinism
// across backends and thread counts; the plan/run split; exact IO counts, split-KV's
// partial states included.
#include <gtest/gtest.h>

#include <map>

#include "support/paged_support.hpp"

namespace tileattn::test {
namespace {

struct DecodeCase {
  index_t page_size, heads_q, heads_kv, head_dim;
};

class PagedDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(PagedDecode, MatchesReferenceOverShuffledPages) {
  const DecodeCase c = GetParam();
  for (index_t splits : {0, 1, 3}) {
    PagedShape s{{1, 17, 127, 1000, 0, 33}, 1, c.heads_q, c.heads_kv, c.head_dim, 0, c.page_size};
    PagedBatch<float> batch(s, 7 + static_cast<std::uint64_t>(c.page_size));
    PagedOptions opt;
    opt.num_splits = splits;
    batch.run(opt);
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    expect_close(batch.against_reference(opt));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedDecode,
                         ::testing::Values(DecodeCase{16, 8, 2, 64}, DecodeCase{1, 4, 4, 17},
                                           DecodeCase{3, 6, 1, 128}, DecodeCase{17, 32, 8, 128},
                                           DecodeCase{5, 2, 1, 1}));

TEST(PagedForward, ChunkedPrefillAndVerifyWithEveryOption) {
  const float slopes[4] = {0.25f, 0.5f, 0.125f, 0.0625f};
  const float sinks[4] = {0.3f, -1.0f, 2.0f, 0.0f};
  for (index_t q_len : {4, 8, 37}) {
    for (int variant = 0; variant < 7; ++variant) {
      PagedShape s{{40, 9, 300, 1000}, q_len, 4, 2, 40, 24, 7};
      PagedBatch<float> batch(s, 11 + static_cast<std::uint64_t>(q_len));
      PagedOptions opt;
      opt.causal = variant != 4;
      if (variant == 1) opt.window_left = 13;
      if (variant == 2) opt.alibi_slopes = slopes;
      if (variant == 3) opt.softcap = 3.0f, opt.sinks = sinks;
      if (variant == 4) opt.window_left = 50, opt.window_right = 3, opt.alignment = MaskAlignment::top_left;
      if (variant == 5) opt.attention_chunk = 64;                             // chunked local attention
      if (variant == 6) opt.attention_chunk = 7, opt.window_left = 4, opt.causal = false;
      batch.run(opt);
      SCOPED_TRACE("q_len " + std::to_string(q_len) + " variant " + std::to_string(variant));
      expect_close(batch.against_reference(opt));
    }
  }
}

TEST(PagedForward, VeryDifferentLengthsInOneBatch) {
  PagedShape s{{1, 16384, 3}, 1, 4, 1, 64, 0, 16};
  PagedBatch<float> batch(s, 3);
  batch.run();
  expect_close(batch.against_reference({}));
}

TEST(PagedForward, SplitAgreesWithUnsplitAndUnsplitIsTheContiguousForwardBitwise) {
  PagedShape s{{2000, 700, 4096}, 2, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 5);
  PagedOptions opt;
  opt.causal = true;
  opt.num_splits = 1;
  batch.run(opt);
  const auto unsplit = batch.o;
  const auto unsplit_lse = batch.lse;
  // The contiguous forward on the same K/V (varlen: the sequences differ in length).
  std::vector<float> k_all, v_all;
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (index_t b = 0; b < s.batch(); ++b) {
    k_all.insert(k_all.end(), batch.k_seq[b].begin(), batch.k_seq[b].end());
    v_all.insert(v_all.end(), batch.v_seq[b].begin(), batch.v_seq[b].end());
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(s.q_len));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(s.k_lens[b]));
  }
  std::vector<float> o(batch.o.size()), lse(batch.lse.size());
  forward_varlen(make_thd<const float>(batch.q.data(), cu_q.back(), s.heads_q, s.head_dim),
                 make_thd<const float>(k_all.data(), cu_k.back(), s.heads_kv, s.head_dim),
                 make_thd<const float>(v_all.data(), cu_k.back(), s.heads_kv, s.head_dim),
                 make_thd(o.data(), cu_q.back(), s.heads_q, s.head_dim), PackedLseView{},
                 VarlenSequences{cu_q, cu_k, s.q_len, batch.max_k}, opt);
  EXPECT_TRUE(bitwise_equal(o, unsplit));
  for (index_t splits : {0, 2, 5}) {
    opt.num_splits = splits;
    batch.reset_outputs();
    batch.run(opt);
    double worst = 0;
    for (std::size_t i = 0; i < o.size(); ++i) worst = std::max<double>(worst, std::abs(batch.o[i] - unsplit[i]));
    for (std::size_t i = 0; i < lse.size(); ++i) worst = std::max<double>(worst, std::abs(batch.lse[i] - unsplit_lse[i]));
    EXPECT_LE(worst, 2e-6) << "num_splits " << splits;
    expect_close(batch.against_reference(opt));
  }
}

TEST(PagedForward, BitwiseIdenticalAcrossBackendsAndThreadCounts) {
  PagedShape s{{5000, 1, 999}, 1, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 9);
  PagedOptions opt;  // automatic split: the 5000-key sequence is cut
  expect_same_bits_on_every_backend(batch, opt, [&](const PagedOptions& o) { batch.run(o); });
}

TEST(PagedForward, RepeatedSplitRunsGiveTheSameBitsOnEveryBackendAndThreadCount) {
  // Races show up as rare differences: each parallel run is repeated determinism_repeats()
  // times (50; fewer under the sanitizers), split-KV forced so partial states and merges run.
  PagedShape s{{1500, 1, 299}, 2, 4, 2, 32, 0, 16};
  PagedBatch<float> batch(s, 4);
  PagedOptions opt;
  opt.num_splits = 4;
  opt.sram_budget_bytes = rows_budget(16, 32, 32);
  batch.run(opt);
  const auto first = batch.o;
  const auto first_lse = batch.lse;
  for (Backend backend : compiled_backends())
    for (int threads : {1, 2, 3})
      for (int repeat = 0; repeat < (backend == Backend::serial ? 1 : determinism_repeats()); ++repeat) {
        opt.execution = {backend, threads};
        batch.reset_outputs();
        batch.run(opt);
        ASSERT_TRUE(bitwise_equal(batch.o, first) && bitwise_equal(batch.lse, first_lse))
            << to_string(backend) << " x " << threads << ", repeat " << repeat;
      }
}

TEST(PagedForward, PlanIsReusedAndCheckedAgainstTheCall) {
  PagedShape s{{300, 4000}, 1, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 2);
  const PagedPlan plan = plan_forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(),
                                    batch.seqlens, batch.o_view(), batch.lse_view());
  EXPECT_GT(plan.keys_per_split(), 0);
  forward_paged(plan, batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                batch.o_view(), batch.lse_view());
  const auto planned = batch.o;
  batch.reset_outputs();
  batch.run();
  EXPECT_TRUE(bitwise_equal(planned, batch.o));
  batch.reset_outputs();
  batch.seqlens[0] = 299;  // another batch shape
  try {
    forward_paged(plan, batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                  batch.o_view(), batch.lse_view());
    ADD_FAILURE() << "a plan for other cache_seqlens was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "plan");
  }
  EXPECT_TRUE(all_equal(batch.o, sentinel));
}

TEST(PagedForward, CountsEachPageOncePerGroupOfQueryHeads) {
  PagedShape s{{1000, 37, 260}, 1, 8, 2, 64, 32, 16};
  PagedBatch<float> batch(s, 4);
  IoCounts io;
  PagedOptions opt;
  opt.num_splits = 1;
  opt.io_counts = &io;
  batch.run(opt);
  std::uint64_t keys = 0;
  for (index_t len : s.k_lens) keys += static_cast<std::uint64_t>(len);
  const std::uint64_t kv = keys * s.heads_kv * (s.head_dim + s.dv()) * sizeof(float);
  const std::uint64_t q = static_cast<std::uint64_t>(batch.q.size()) * sizeof(float);
  EXPECT_EQ(io.bytes_read, kv + q);
  EXPECT_EQ(io.bytes_written, (batch.o.size() + batch.lse.size()) * sizeof(float));
}

TEST(PagedForward, CountsSplitKvPartialStatesExactly) {
  // Each chunk's item reads its sequence's Q and writes a partial state: per query row,
  // head_dim_v floats of O and its max and sum (no LSE); the merge reads every state back
  // and writes O and the LSE once. Sequence 1 is too short to split.
  PagedShape s{{1000, 37, 2600}, 2, 8, 2, 64, 32, 16};
  PagedBatch<float> batch(s, 4);
  IoCounts io;
  PagedOptions opt;
  opt.num_splits = 3;
  opt.io_counts = &io;
  const PagedPlan plan = plan_forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(),
                                    batch.seqlens, batch.o_view(), batch.lse_view(), opt);
  const auto per_chunk = static_cast<std::uint64_t>(plan.keys_per_split());
  ASSERT_GT(per_chunk, 0u);
  batch.run(opt);
  const std::uint64_t rows = static_cast<std::uint64_t>(s.q_len * s.heads_q), f = sizeof(float);
  const std::uint64_t q = rows * s.head_dim * f, o = rows * s.dv() * f, lse = rows * f;
  const std::uint64_t state = rows * (s.dv() + 2) * f;  // O, max and sum of each row
  std::uint64_t read = 0, written = 0;
  for (index_t len : s.k_lens) {
    const auto keys = static_cast<std::uint64_t>(len);
    const std::uint64_t chunks = keys > per_chunk ? (keys + per_chunk - 1) / per_chunk : 1;
    ASSERT_EQ(chunks > 1, len != 37);
    const std::uint64_t states = chunks > 1 ? chunks * state : 0;
    read += chunks * q + keys * s.heads_kv * (s.head_dim + s.dv()) * f + states;
    written += states + o + lse;
  }
  EXPECT_EQ(io.bytes_read, read);
  EXPECT_EQ(io.bytes_written, written);
}

TEST(PagedForward, NonFiniteKeysAndValuesAsTheReferenceSaysInPlaceAndPacked) {
  // Decoding reads K/V in place (4 query rows per group), verify with 4 tokens packs them
  // (16 rows): both must follow the reference's NaN and Inf rules. Sequence 0: an Inf value
  // of a key the window hides; 1: a NaN key it shows; 2: an Inf value it shows.
  for (index_t q_len : {1, 4}) {
    PagedShape s{{300, 300, 300}, q_len, 8, 2, 64, 0, 16};
    PagedBatch<float> batch(s, 21);
    const float inf = std::numeric_limits<float>::infinity();
    const auto poke = [&](std::vector<std::vector<float>>& seq, std::vector<float, LineAlignedAllocator<float>>& pool,
                          index_t b, index_t key, float value) {
      const index_t row = s.heads_kv * s.head_dim;
      seq[b][static_cast<std::size_t>(key * row + 5)] = value;
      const index_t page = batch.table[static_cast<std::size_t>(b * batch.max_pages + key / s.page_size)];
      pool[static_cast<std::size_t>((page * s.page_size + key % s.page_size) * row + 5)] = value;
    };
    poke(batch.v_seq, batch.v_pool, 0, 195, inf);  // in a loaded key tile, just outside the window
    poke(batch.k_seq, batch.k_pool, 1, 290, std::numeric_limits<float>::quiet_NaN());
    poke(batch.v_seq, batch.v_pool, 2, 295, inf);
    PagedOptions opt;
    opt.causal = true;
    opt.window_left = 100;
    for (index_t splits : {1, 0}) {
      opt.num_splits = splits;
      batch.reset_outputs();
      batch.run(opt);
      SCOPED_TRACE("q_len " + std::to_string(q_len) + " num_splits " + std::to_string(splits));
      expect_close(batch.against_reference(opt));
    }
  }
}

TEST(PagedForward, OnTheCacheManagerAfterForkCopyOnWritePrefixSharingAndTruncation) {
  // A KvCache is filled, forked mid-page, shares a prefix, truncates; after each step the
  // batch attends through cache.batch() and matches the double reference on contiguous
  // copies the test keeps (the model), and the parent's pages stay bitwise unchanged.
  constexpr index_t hkv = 2, hq = 6, d = 24, page = 5;
  KvCache<float> cache({.num_layers = 1, .num_pages = 64, .page_size = page, .heads_kv = hkv, .head_dim = d});
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  std::map<SequenceId, std::vector<float>> k_model, v_model;  // [len, hkv, d] per sequence
  const auto append = [&](SequenceId id, index_t n) {
    std::vector<float> k(static_cast<std::size_t>(n * hkv * d)), v(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    cache.append(id, make_bshd<const float>(k.data(), 1, n, hkv, d), make_bshd<const float>(v.data(), 1, n, hkv, d));
    k_model[id].insert(k_model[id].end(), k.begin(), k.end());
    v_model[id].insert(v_model[id].end(), v.begin(), v.end());
  };
  const auto check = [&](const std::vector<SequenceId>& ids, index_t q_len) {
    const auto tables = cache.batch(ids);
    const auto b = static_cast<index_t>(ids.size());
    std::vector<float> q(static_cast<std::size_t>(b * q_len * hq * d)), o(q.size()), lse(static_cast<std::size_t>(b * hq * q_len));
    for (auto& x : q) x = normal(rng);
    PagedOptions opt;
    opt.causal = true;
    forward_paged(make_bshd<const float>(q.data(), b, q_len, hq, d), cache.k_pages(0), cache.v_pages(0),
                  tables.block_table_view(), tables.seqlens(), make_bshd(o.data(), b, q_len, hq, d),
                  make_lse(lse.data(), b, hq, q_len), opt);
    for (index_t s = 0; s < b; ++s) {
      const SequenceId id = ids[static_cast<std::size_t>(s)];
      const index_t len = cache.length(id);
      reference::Options ref_opt = reference::Options::from(opt);
      const auto ref = reference::attention(
          make_bshd<const float>(q.data() + s * q_len * hq * d, 1, q_len, hq, d),
          make_bshd<const float>(k_model[id].data(), 1, len, hkv, d), make_bshd<const float>(v_model[id].data(), 1, len, hkv, d),
          ref_opt);
      const Deviation dev = compare_to_reference(ref, make_bshd<const float>(o.data() + s * q_len * hq * d, 1, q_len, hq, d),
                                                 make_lse(lse.data() + s * hq * q_len, 1, hq, q_len));
      EXPECT_TRUE(dev.problem.empty()) << dev.problem;
      EXPECT_LE(dev.o, forward_o_tolerance) << "sequence " << id;
      EXPECT_LE(dev.lse, forward_lse_tolerance) << "sequence " << id;
    }
  };
  const auto pages_of = [&](SequenceId id) {  // the sequence's K rows as the cache holds them
    std::vector<float> rows;
    const auto pool = cache.k_pages(0);
    for (index_t t = 0; t < cache.length(id); ++t) {
      const std::int32_t p = cache.pages(id)[static_cast<std::size_t>(t / page)];
      for (index_t h = 0; h < hkv; ++h) {  // each head's row, whatever the page layout
        const float* row = &pool(p, t % page, h, 0);
        rows.insert(rows.end(), row, row + d);
      }
    }
    return rows;
  };
  const SequenceId parent = cache.create();
  append(parent, 12);  // 2 full pages and 2 tokens of a third
  check({parent}, 3);
  const SequenceId child = cache.fork(parent);
  k_model[child] = k_model[parent];
  v_model[child] = v_model[parent];
  const auto parent_before = pages_of(parent);
  append(child, 4);    // copy-on-write of the shared third page
  EXPECT_NE(cache.pages(child)[2], cache.pages(parent)[2]);
  EXPECT_EQ(pages_of(parent), parent_before);
  const SequenceId prefix = cache.share_prefix(parent, 10);  // two full pages adopted
  k_model[prefix].assign(k_model[parent].begin(), k_model[parent].begin() + 10 * hkv * d);
  v_model[prefix].assign(v_model[parent].begin(), v_model[parent].begin() + 10 * hkv * d);
  append(prefix, 7);
  append(parent, 1);
  const auto parent_after = pages_of(parent);
  EXPECT_EQ(std::vector<float>(parent_after.begin(), parent_after.begin() + 12 * hkv * d), parent_before);
  check({parent, child, prefix}, 1);  // decode
  check({parent, child, prefix}, 4);  // verify 4 draft tokens
  cache.truncate(child, 13);          // reject 3 drafts
  k_model[child].resize(static_cast<std::size_t>(13 * hkv * d));
  v_model[child].resize(static_cast<std::size_t>(13 * hkv * d));
  append(child, 2);
  check({child, parent, prefix}, 2);
  for (SequenceId id : {parent, child, prefix}) cache.free(id);
  EXPECT_EQ(cache.free_pages(), cache.num_pages());
}

}  // namespace
}  // namespace tileattn::test
