// tests/paged/topk_test.cpp: top-k sparse attention (forward_paged_topk, topk.hpp) against
// the double reference over the whole sequence with a mask that keeps exactly the selected
// keys (and a bias of log(count) for a key selected twice): awkward topk (1, 17, 127, 1000)
// with -1 padding past short sequences, GQA and MQA, seqlen_q > 1 with causal and window
// dropping keys, softcap and sinks, bf16 and per-page int8 caches; every key selected in
// order is forward_paged bitwise; the varlen form is the fixed one bitwise; bitwise the
// same on every backend and thread count; IO counts exactly the selected rows; bad
// indices and unsupported options rejected with nothing written; the plan forms
// (plan_forward_paged_topk(_varlen)) give the unplanned calls' bits, and a plan of another
// call throws "plan" with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "support/expect_throw_naming.hpp"
#include "support/naive_same_precision.hpp"
#include "support/paged_support.hpp"
#include "tileattn/topk.hpp"

namespace tileattn::test {
namespace {

/// Random top-k lists for a batch: each row picks `k` keys of its sequence without
/// repetition in random order (all of them and -1 padding when the sequence is shorter),
/// `duplicates` of its picks repeated in place of others.
struct TopkLists {
  index_t batch, q_len, k;
  std::vector<std::int32_t> idx;  // [batch, q_len, k]

  TopkLists(const PagedShape& s, index_t topk, std::uint64_t seed, index_t duplicates = 0)
      : batch(s.batch()), q_len(s.q_len), k(topk) {
    std::mt19937_64 rng(seed);
    for (index_t b = 0; b < batch; ++b)
      for (index_t i = 0; i < q_len; ++i) {
        std::vector<std::int32_t> keys(static_cast<std::size_t>(s.k_lens[static_cast<std::size_t>(b)]));
        std::iota(keys.begin(), keys.end(), 0);
        std::shuffle(keys.begin(), keys.end(), rng);
        keys.resize(static_cast<std::size_t>(k), -1);
        for (index_t d = 0; d < duplicates && d + 1 < k && keys[0] >= 0; ++d) keys[static_cast<std::size_t>(k - 1 - d)] = keys[0];
        std::shuffle(keys.begin(), keys.end(), rng);
        idx.insert(idx.end(), keys.begin(), keys.end());
      }
  }
  TopkIndicesView view() const { return make_topk_indices(idx.data(), batch, q_len, k); }
  std::int32_t at(index_t b, index_t i, index_t j) const { return idx[static_cast<std::size_t>((b * q_len + i) * k + j)]; }
};

/// Sequence b's dense options for its top-k lists: a mask keeping the listed keys and a bias
/// of log(times listed), over [1, 1, q_len, k_len].
struct TopkMask {
  std::unique_ptr<bool[]> keep;
  std::vector<float> bias;
  reference::Options opt;

  TopkMask(const PagedShape& s, const TopkLists& lists, index_t b, const ForwardOptions& options) {
    const index_t len = s.k_lens[static_cast<std::size_t>(b)], n = s.q_len * std::max<index_t>(len, 1);
    keep.reset(new bool[static_cast<std::size_t>(n)]());
    bias.assign(static_cast<std::size_t>(n), 0.0f);
    for (index_t i = 0; i < s.q_len; ++i)
      for (index_t j = 0; j < lists.k; ++j)
        if (const std::int32_t key = lists.at(b, i, j); key >= 0) bias[static_cast<std::size_t>(i * len + key)] += 1;
    for (std::size_t x = 0; x < bias.size(); ++x) {
      keep[x] = bias[x] > 0;
      bias[x] = bias[x] > 1 ? std::log(bias[x]) : 0.0f;
    }
    opt = reference::Options::from(options);
    opt.batch_index = 0;
    opt.mask = {keep.get(), {1, 1, s.q_len, len}, {0, 0, len, 1}};
    opt.bias = {bias.data(), {1, 1, s.q_len, len}, {0, 0, len, 1}};
  }
};

/// Sequence b's reference: the dense attention over its keys with its TopkMask.
reference::AttentionResult topk_reference(const PagedShape& s, const TopkLists& lists, index_t b,
                                          const TensorView<const float>& q, const TensorView<const float>& k,
                                          const TensorView<const float>& v, const ForwardOptions& options) {
  const TopkMask mask(s, lists, b, options);
  return reference::attention(q, k, v, mask.opt);
}

/// A float batch's deviation from topk_reference, every sequence.
Deviation topk_deviation(const PagedBatch<float>& batch, const TopkLists& lists, const ForwardOptions& options) {
  Deviation worst;
  const PagedShape& s = batch.shape;
  for (index_t b = 0; b < s.batch(); ++b) {
    const auto ref = topk_reference(s, lists, b, batch.q_of(b), batch.k_of(b), batch.v_of(b), options);
    auto o_b = batch.o_of(b);
    auto lse_b = batch.lse_of(b);
    const Deviation d = compare_to_reference(ref, make_bshd<const float>(o_b.data(), 1, s.q_len, s.heads_q, s.dv()),
                                             make_lse(lse_b.data(), 1, s.heads_q, s.q_len));
    worst.o = std::max(worst.o, d.o);
    worst.lse = std::max(worst.lse, d.lse);
    if (worst.problem.empty() && !d.problem.empty()) worst.problem = "sequence " + std::to_string(b) + ": " + d.problem;
  }
  return worst;
}

template <class T>
void run_topk(PagedBatch<T>& batch, const TopkLists& lists, const PagedOptions& options = {}) {
  forward_paged_topk(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     lists.view(), batch.o_view(), batch.lse_view(), options);
}

TEST(PagedTopk, MatchesMaskedDenseReferenceAtAwkwardTopk) {
  for (index_t topk : {1, 17, 127, 1000}) {
    for (index_t splits : {0, 1, 3}) {
      PagedShape s{{1, 17, 127, 1000, 33}, 1, 8, 2, 64, 0, 16};
      PagedBatch<float> batch(s, 3 + static_cast<std::uint64_t>(topk));
      const TopkLists lists(s, topk, 5 + static_cast<std::uint64_t>(topk));
      PagedOptions opt;
      opt.num_splits = splits;
      run_topk(batch, lists, opt);
      SCOPED_TRACE("topk " + std::to_string(topk) + " num_splits " + std::to_string(splits));
      expect_close(topk_deviation(batch, lists, opt));
    }
  }
}

TEST(PagedTopk, MqaOddHeadDimsAndPageSizes) {
  PagedShape s{{300, 5, 64}, 1, 6, 1, 17, 24, 3};
  PagedBatch<float> batch(s, 8);
  const TopkLists lists(s, 40, 9);
  run_topk(batch, lists);
  expect_close(topk_deviation(batch, lists, {}));
}

// More than in_place_max_rows query rows per K/V group (MLA's 128 heads on one K/V head):
// the packed path, whose K^T loads stage the gathered rows (memory/tile_io.hpp).
TEST(PagedTopk, PackedPathOfLargeGroups) {
  for (index_t splits : {1, 2}) {
    PagedShape s{{600, 40}, 2, 24, 1, 72, 64, 16};
    PagedBatch<float> batch(s, 12);
    const TopkLists lists(s, 300, 13, 3);
    PagedOptions opt;
    opt.num_splits = splits;
    opt.causal = true;
    run_topk(batch, lists, opt);
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    expect_close(topk_deviation(batch, lists, opt));
  }
}

TEST(PagedTopk, DuplicatesAreAttendedTwice) {
  PagedShape s{{200, 50}, 2, 4, 2, 32, 0, 16};
  PagedBatch<float> batch(s, 21);
  const TopkLists lists(s, 64, 22, 5);
  run_topk(batch, lists);
  expect_close(topk_deviation(batch, lists, {}));
}

TEST(PagedTopk, SeveralQueryRowsWithCausalWindowSoftcapAndSinks) {
  const float sinks[4] = {0.3f, -1.0f, 2.0f, 0.0f};
  for (int variant = 0; variant < 4; ++variant) {
    PagedShape s{{40, 300, 9}, 5, 4, 2, 40, 0, 7};  // seqlen_q 5: verify / chunked prefill
    PagedBatch<float> batch(s, 31 + static_cast<std::uint64_t>(variant));
    const TopkLists lists(s, 32, 32);
    PagedOptions opt;
    opt.causal = variant != 3;  // keys after a row's diagonal are dropped, as a dense mask would
    if (variant == 1) opt.window_left = 20;
    if (variant == 2) opt.softcap = 3.0f, opt.sinks = sinks;
    if (variant == 3) opt.attention_chunk = 64, opt.window_right = 2, opt.window_left = 100;
    opt.num_splits = variant == 2 ? 2 : 0;
    run_topk(batch, lists, opt);
    SCOPED_TRACE("variant " + std::to_string(variant));
    expect_close(topk_deviation(batch, lists, opt));
  }
}

TEST(PagedTopk, EmptyRowsSeeNoKey) {
  PagedShape s{{20, 0}, 1, 4, 2, 32, 0, 16};
  PagedBatch<float> batch(s, 41);
  TopkLists lists(s, 8, 42);
  std::fill(lists.idx.begin(), lists.idx.begin() + 8, -1);  // sequence 0: padding only
  run_topk(batch, lists);
  expect_close(topk_deviation(batch, lists, {}));
  for (index_t h = 0; h < s.heads_q; ++h) EXPECT_TRUE(std::isinf(batch.lse[static_cast<std::size_t>(h)]));
}

TEST(PagedTopk, EveryKeyInOrderIsForwardPagedBitwise) {
  PagedShape s{{1, 17, 1000, 3000}, 1, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 51);
  TopkLists lists(s, 3000, 52);
  for (index_t b = 0; b < s.batch(); ++b)
    for (index_t j = 0; j < 3000; ++j)
      lists.idx[static_cast<std::size_t>(b * 3000 + j)] = j < s.k_lens[static_cast<std::size_t>(b)] ? static_cast<std::int32_t>(j) : -1;
  PagedOptions opt;
  opt.shared_prefix = false;
  batch.run(opt);
  const auto dense_o = batch.o;
  const auto dense_lse = batch.lse;
  batch.reset_outputs();
  run_topk(batch, lists, opt);
  EXPECT_TRUE(bitwise_equal(batch.o, dense_o));
  EXPECT_TRUE(bitwise_equal(batch.lse, dense_lse));
}

TEST(PagedTopk, VarlenIsTheFixedFormBitwise) {
  PagedShape s{{500, 90, 33}, 3, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 61);
  const TopkLists lists(s, 50, 62);
  PagedOptions opt;
  opt.causal = true;
  run_topk(batch, lists, opt);
  // The same rows packed: q and o [B * 3, H, D], lse [H, B * 3] (the fixed LSE is [B, H, 3]).
  const index_t total = s.batch() * s.q_len;
  std::vector<std::int32_t> cu{0, 3, 6, 9};
  std::vector<float> o(batch.o.size(), sentinel), lse(batch.lse.size(), sentinel);
  forward_paged_topk_varlen(make_thd<const float>(batch.q.data(), total, s.heads_q, s.head_dim), batch.k_cache(),
                            batch.v_cache(), batch.block_table(), batch.seqlens,
                            make_packed_topk_indices(lists.idx.data(), total, 50),
                            make_thd(o.data(), total, s.heads_q, s.head_dim), PackedLseView{lse.data(), {s.heads_q, total}, {total, 1}},
                            cu, opt);
  EXPECT_TRUE(bitwise_equal(o, batch.o));
  for (index_t b = 0; b < s.batch(); ++b)
    for (index_t h = 0; h < s.heads_q; ++h)
      for (index_t i = 0; i < s.q_len; ++i)
        EXPECT_EQ(lse[static_cast<std::size_t>(h * total + b * s.q_len + i)],
                  batch.lse[static_cast<std::size_t>((b * s.heads_q + h) * s.q_len + i)]);
}

// Q and O whose batch and position strides do not make one row dimension (a gap after each
// sequence), and an LSE [B, H, S]: run_topk_rows stages them; the same bits as contiguous.
TEST(PagedTopk, PaddedLayoutsAreTheContiguousBitwise) {
  PagedShape s{{300, 64}, 3, 4, 2, 32, 0, 16};
  PagedBatch<float> batch(s, 65);
  const TopkLists lists(s, 40, 66);
  run_topk(batch, lists);
  const index_t row = s.heads_q * s.head_dim, gap = 5;
  std::vector<float> q(static_cast<std::size_t>(s.batch() * (s.q_len * row + gap)), std::nanf("")), o(q.size(), sentinel);
  for (index_t b = 0; b < s.batch(); ++b)
    std::copy_n(batch.q.begin() + b * s.q_len * row, s.q_len * row, q.begin() + b * (s.q_len * row + gap));
  const TensorView<float> qv{q.data(), {s.batch(), s.q_len, s.heads_q, s.head_dim}, {s.q_len * row + gap, row, s.head_dim, 1}};
  TensorView<float> ov = qv;
  ov.data = o.data();
  std::vector<float> lse(batch.lse.size(), sentinel);
  forward_paged_topk(TensorView<const float>(qv), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     lists.view(), ov, make_lse(lse.data(), s.batch(), s.heads_q, s.q_len));
  EXPECT_TRUE(bitwise_equal(lse, batch.lse));
  for (index_t b = 0; b < s.batch(); ++b) {
    EXPECT_TRUE(std::equal(batch.o.begin() + b * s.q_len * row, batch.o.begin() + (b + 1) * s.q_len * row,
                           o.begin() + b * (s.q_len * row + gap)));
    EXPECT_TRUE(all_equal(std::vector<float>(o.begin() + (b + 1) * (s.q_len * row + gap) - gap,
                                             o.begin() + (b + 1) * (s.q_len * row + gap)), sentinel));
  }
}

TEST(PagedTopk, BitwiseIdenticalAcrossBackendsAndThreadCounts) {
  PagedShape s{{5000, 999}, 2, 8, 2, 64, 0, 16};
  PagedBatch<float> batch(s, 71);
  const TopkLists lists(s, 2048, 72);
  for (index_t splits : {0, 3}) {
    PagedOptions opt;  // automatic split: the 2048-key lists are cut
    opt.num_splits = splits;
    expect_same_bits_on_every_backend(batch, opt, [&](const PagedOptions& o) { run_topk(batch, lists, o); },
                                      " num_splits " + std::to_string(splits));
  }
}

TEST(PagedTopk, IoCountsExactlyTheSelectedRows) {
  PagedShape s{{700, 30}, 2, 8, 2, 64, 48, 16};
  PagedBatch<float> batch(s, 81);
  const TopkLists lists(s, 100, 82);  // sequence 1: 30 keys and 70 -1
  index_t selected = 0;
  for (std::int32_t key : lists.idx) selected += key >= 0;
  IoCounts io;
  PagedOptions opt;
  opt.num_splits = 1;
  opt.io_counts = &io;
  run_topk(batch, lists, opt);
  const auto f = sizeof(float);
  const std::uint64_t q_bytes = batch.q.size() * f;
  EXPECT_EQ(io.bytes_read, q_bytes + static_cast<std::uint64_t>(selected * s.heads_kv * (s.head_dim + s.dv())) * f);
  EXPECT_EQ(io.bytes_written, (batch.o.size() + batch.lse.size()) * f);
}

TEST(PagedTopk, Bf16CacheWithinTwiceANaiveBf16Error) {
  for (const index_t heads_kv : {8, 1}) {  // 1: 32 rows per group, the packed path's bf16 pair tiles
    PagedShape s{{1000, 77}, 1, 32, heads_kv, 128, 0, 16};
    PagedBatch<bf16> batch(s, 91);
    const TopkLists lists(s, 127, 92);
    run_topk(batch, lists);
    const auto widen = [](auto first, auto last) {
      std::vector<float> y;
      for (; first != last; ++first) y.push_back(to_float(*first));
      return y;
    };
    for (index_t b = 0; b < s.batch(); ++b) {  // the reference and the naive bf16 attention over the bf16 values
      const index_t len = s.k_lens[static_cast<std::size_t>(b)], n = s.heads_q * s.head_dim;
      const auto qf = widen(batch.q.begin() + b * n, batch.q.begin() + (b + 1) * n);
      const auto kf = widen(batch.k_seq[static_cast<std::size_t>(b)].begin(), batch.k_seq[static_cast<std::size_t>(b)].end());
      const auto vf = widen(batch.v_seq[static_cast<std::size_t>(b)].begin(), batch.v_seq[static_cast<std::size_t>(b)].end());
      const auto q = make_bshd<const float>(qf.data(), 1, 1, s.heads_q, s.head_dim);
      const auto k = make_bshd<const float>(kf.data(), 1, len, s.heads_kv, s.head_dim);
      const auto v = make_bshd<const float>(vf.data(), 1, len, s.heads_kv, s.head_dim);
      const TopkMask mask(s, lists, b, {});
      const auto ref = reference::attention(q, k, v, mask.opt);
      std::vector<float> naive_o(static_cast<std::size_t>(n)), naive_lse(static_cast<std::size_t>(s.heads_q));
      naive_same_precision<bf16>(q, k, v, mask.opt, make_bshd(naive_o.data(), 1, 1, s.heads_q, s.head_dim),
                                 make_lse(naive_lse.data(), 1, s.heads_q, 1));
      auto o_b = batch.o_of(b);
      auto lse_b = batch.lse_of(b);
      const Deviation kernel = compare_to_reference(ref, make_bshd<const float>(o_b.data(), 1, 1, s.heads_q, s.dv()),
                                                    make_lse(lse_b.data(), 1, s.heads_q, 1));
      const Deviation naive = compare_to_reference(ref, make_bshd<const float>(naive_o.data(), 1, 1, s.heads_q, s.dv()),
                                                   make_lse(naive_lse.data(), 1, s.heads_q, 1));
      EXPECT_TRUE(kernel.problem.empty()) << kernel.problem;
      EXPECT_LE(kernel.o, 2.0 * naive.o + 1e-5) << "heads_kv " << heads_kv << " naive " << naive.o;
      EXPECT_LE(kernel.lse, 2.0 * naive.lse + 1e-5) << "heads_kv " << heads_kv << " naive " << naive.lse;
    }
  }
}

TEST(PagedTopk, Int8CacheScalesFollowTheSelectedKeysPages) {
  // int8 pools with a scale per (page, K/V head); the reference sees the dequantized values.
  // Hkv 3: K and V read in place, 3 K/V heads per item; Hkv 1: 24 rows, the packed path.
  for (const index_t heads_kv : {3, 1}) {
  PagedShape s{{400, 70}, 1, 24, heads_kv, 64, 0, 16};
  PagedBatch<float> batch(s, 101);
  const index_t rows = s.heads_kv * s.head_dim;
  std::vector<std::int8_t> k8(batch.k_pool.size()), v8(batch.v_pool.size());
  std::vector<float> ks(static_cast<std::size_t>(batch.num_pages * s.heads_kv)), vs(ks.size());
  for (std::size_t i = 0; i < ks.size(); ++i) ks[i] = 1.0f / 32 * (1 + i % 3), vs[i] = 1.0f / 64 * (1 + i % 5);
  const auto quantize_pool = [&](std::vector<float, LineAlignedAllocator<float>>& pool, std::vector<std::int8_t>& out,
                                 const std::vector<float>& scales) {
    for (std::size_t x = 0; x < pool.size(); ++x) {
      const std::size_t page = x / static_cast<std::size_t>(s.page_size * rows), head = x / s.head_dim % s.heads_kv;
      const float scale = scales[page * s.heads_kv + head];
      const float q = std::isnan(pool[x]) ? 127.0f : std::clamp(std::round(pool[x] / scale), -127.0f, 127.0f);
      out[x] = static_cast<std::int8_t>(q);
      pool[x] = q * scale;  // the float pool and the sequences' copies hold the dequantized values
    }
  };
  quantize_pool(batch.k_pool, k8, ks);
  quantize_pool(batch.v_pool, v8, vs);
  for (index_t b = 0; b < s.batch(); ++b)
    for (index_t r = 0; r < s.k_lens[static_cast<std::size_t>(b)]; ++r) {
      const index_t page = batch.table[static_cast<std::size_t>(b * batch.max_pages + r / s.page_size)];
      const std::size_t at = static_cast<std::size_t>((page * s.page_size + r % s.page_size) * rows);
      std::copy_n(&batch.k_pool[at], rows, &batch.k_seq[static_cast<std::size_t>(b)][static_cast<std::size_t>(r * rows)]);
      std::copy_n(&batch.v_pool[at], rows, &batch.v_seq[static_cast<std::size_t>(b)][static_cast<std::size_t>(r * rows)]);
    }
  const TopkLists lists(s, 90, 102);
  for (index_t splits : {1, 3}) {
    PagedOptions opt;
    opt.num_splits = splits;
    opt.k_scale = {ks.data(), {batch.num_pages, s.heads_kv}, {s.heads_kv, 1}};
    opt.v_scale = {vs.data(), {batch.num_pages, s.heads_kv}, {s.heads_kv, 1}};
    batch.reset_outputs();
    forward_paged_topk(batch.q_view(), make_bshd<const std::int8_t>(k8.data(), batch.num_pages, s.page_size, s.heads_kv, s.head_dim),
                       make_bshd<const std::int8_t>(v8.data(), batch.num_pages, s.page_size, s.heads_kv, s.dv()),
                       batch.block_table(), batch.seqlens, lists.view(), batch.o_view(), batch.lse_view(), opt);
    SCOPED_TRACE("num_splits " + std::to_string(splits) + " heads_kv " + std::to_string(heads_kv));
    expect_close(topk_deviation(batch, lists, {}), 1e-4);
  }
  }
}

TEST(PagedTopk, BadIndicesAndUnsupportedOptionsAreRejectedWithNothingWritten) {
  PagedShape s{{50, 20}, 2, 4, 2, 32, 0, 16};
  PagedBatch<float> batch(s, 111);
  const auto expect_rejected = [&](const TopkLists& lists, const PagedOptions& opt, const std::string& name) {
    batch.reset_outputs();
    try {
      run_topk(batch, lists, opt);
      ADD_FAILURE() << "no exception for " << name;
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), name) << e.what();
    }
    EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel)) << name;
  };
  const TopkLists good(s, 16, 112);
  for (std::int32_t bad : {20, 1000, -2}) {
    TopkLists lists = good;
    lists.idx[static_cast<std::size_t>(2 * 2 * 16 - 3)] = bad;  // sequence 1 (20 keys), last row
    expect_rejected(lists, {}, "topk_indices");
  }
  const float slopes[4] = {1, 1, 1, 1};
  PagedOptions alibi;
  alibi.alibi_slopes = slopes;
  expect_rejected(good, alibi, "alibi_slopes");
  std::vector<float> table(64, 1.0f);
  PagedOptions rotary;
  rotary.rotary.cos = {table.data(), {4, 16}, {16, 1}};
  rotary.rotary.sin = rotary.rotary.cos;
  expect_rejected(good, rotary, "rotary");
  batch.reset_outputs();
  EXPECT_THROW(forward_paged_topk(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                  make_topk_indices(good.idx.data(), 1, 2, 16), batch.o_view(), batch.lse_view()),
               invalid_argument);
  EXPECT_THROW(forward_paged_topk(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                  make_topk_indices(good.idx.data(), 2, 1, 16), batch.o_view(), batch.lse_view()),
               invalid_argument);
  EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel));
  // O over the indices it is computed from (valid ones, copied into O's buffer): an output
  // overlapping an input, as forward_paged rejects O over its block table (issue #42 item 7).
  ASSERT_GE(batch.o.size() * sizeof(float), good.idx.size() * sizeof(std::int32_t));
  std::memcpy(batch.o.data(), good.idx.data(), good.idx.size() * sizeof(std::int32_t));
  const std::vector<float> o_before = batch.o;
  const auto in_o = make_topk_indices(reinterpret_cast<const std::int32_t*>(batch.o.data()), 2, s.q_len, 16);
  EXPECT_THROW_NAMING(forward_paged_topk(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(),
                                         batch.seqlens, in_o, batch.o_view(), batch.lse_view()),
                      "o");
  EXPECT_EQ(std::memcmp(batch.o.data(), o_before.data(), o_before.size() * sizeof(float)), 0);
}

// ---- Plans -------------------------------------------------------------------------------

/// Top-k lists of packed query rows: row r of sequence b (cu_q[b] <= r < cu_q[b + 1]) picks
/// `k` keys of [0, k_lens[b]) at random (repeats allowed), each -1 with probability 1/4.
std::vector<std::int32_t> packed_lists(const std::vector<std::int32_t>& cu_q, const std::vector<index_t>& k_lens,
                                       index_t k, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> idx;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    std::uniform_int_distribution<std::int32_t> key(0, static_cast<std::int32_t>(k_lens[b]) - 1);
    for (index_t r = cu_q[b]; r < cu_q[b + 1]; ++r)
      for (index_t j = 0; j < k; ++j) idx.push_back(rng() % 4 == 0 ? -1 : key(rng));
  }
  return idx;
}

template <class T>
PagedPlan plan_topk(PagedBatch<T>& batch, const TopkLists& lists, const PagedOptions& options = {}) {
  return plan_forward_paged_topk(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                 lists.view(), batch.o_view(), batch.lse_view(), options);
}

template <class T>
void run_topk(const PagedPlan& plan, PagedBatch<T>& batch, const TopkLists& lists, const PagedOptions& options = {}) {
  forward_paged_topk(plan, batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                     lists.view(), batch.o_view(), batch.lse_view(), options);
}

// plan_forward_paged_topk and forward_paged_topk(plan, ...): the unplanned call's bits, over
// sequences of 1, 17 and 127 keys with 3 causal query rows each (some rows see no key), with
// and without split-KV; planning writes nothing. The plan of one layer's lists serves
// another layer's that keep as many keys per row (no causal mask: min(127, length) each).
TEST(PagedTopk, PlanGivesTheUnplannedCallsBits) {
  PagedShape s{{1, 17, 127}, 3, 4, 2, 40, 24, 16};
  PagedBatch<float> batch(s, 81);
  const TopkLists lists(s, 127, 82);
  for (index_t splits : {0, 3}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedOptions opt;
    opt.num_splits = splits;
    opt.causal = true;
    batch.reset_outputs();
    run_topk(batch, lists, opt);
    const std::vector<float> want_o = batch.o, want_lse = batch.lse;
    batch.reset_outputs();
    const PagedPlan plan = plan_topk(batch, lists, opt);
    EXPECT_EQ(plan.keys_per_split() > 0, splits == 3);  // 3: sequence 2's rows in chunks of 64 keys
    EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel));
    run_topk(plan, batch, lists, opt);
    EXPECT_TRUE(bitwise_equal(batch.o, want_o));
    EXPECT_TRUE(bitwise_equal(batch.lse, want_lse));
  }
  const TopkLists next_layer(s, 127, 83);
  const PagedPlan plan = plan_topk(batch, lists);
  batch.reset_outputs();
  run_topk(batch, next_layer);
  const std::vector<float> want_o = batch.o, want_lse = batch.lse;
  batch.reset_outputs();
  run_topk(plan, batch, next_layer);
  EXPECT_TRUE(bitwise_equal(batch.o, want_o));
  EXPECT_TRUE(bitwise_equal(batch.lse, want_lse));
}

// The varlen form: query rows 1, 17 and 127 over 1, 17 and 127 keys (causal: square), lists
// of 127 entries with -1 and repeats, with and without split-KV.
TEST(PagedTopk, VarlenPlanGivesTheUnplannedCallsBits) {
  PagedShape s{{1, 17, 127}, 1, 4, 2, 40, 24, 16};
  PagedBatch<float> batch(s, 91);
  const std::vector<std::int32_t> cu{0, 1, 18, 145};
  const index_t total = 145, topk = 127;
  std::vector<float> q(static_cast<std::size_t>(total * s.heads_q * s.head_dim));
  std::mt19937_64 rng(92);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  const std::vector<std::int32_t> idx = packed_lists(cu, s.k_lens, topk, 93);
  std::vector<float> o, lse;
  const auto call = [&](const PagedPlan* plan, const PagedOptions& opt) {
    o.assign(static_cast<std::size_t>(total * s.heads_q * s.dv()), sentinel);
    lse.assign(static_cast<std::size_t>(total * s.heads_q), sentinel);
    const auto qv = make_thd<const float>(q.data(), total, s.heads_q, s.head_dim);
    const auto iv = make_packed_topk_indices(idx.data(), total, topk);
    const auto ov = make_thd(o.data(), total, s.heads_q, s.dv());
    const auto lv = make_packed_lse(lse.data(), s.heads_q, total);
    if (plan)
      forward_paged_topk_varlen(*plan, qv, batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens, iv,
                                ov, lv, cu, opt);
    else
      forward_paged_topk_varlen(qv, batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens, iv, ov, lv,
                                cu, opt);
  };
  for (index_t splits : {0, 3}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedOptions opt;
    opt.num_splits = splits;
    opt.causal = true;
    call(nullptr, opt);
    const std::vector<float> want_o = o, want_lse = lse;
    o.assign(o.size(), sentinel);
    lse.assign(lse.size(), sentinel);
    const PagedPlan plan = plan_forward_paged_topk_varlen(
        make_thd<const float>(q.data(), total, s.heads_q, s.head_dim), batch.k_cache(), batch.v_cache(),
        batch.block_table(), batch.seqlens, make_packed_topk_indices(idx.data(), total, topk),
        make_thd(o.data(), total, s.heads_q, s.dv()), make_packed_lse(lse.data(), s.heads_q, total), cu, opt);
    EXPECT_EQ(plan.keys_per_split() > 0, splits == 3);
    EXPECT_TRUE(all_equal(o, sentinel) && all_equal(lse, sentinel));
    call(&plan, opt);
    EXPECT_TRUE(bitwise_equal(o, want_o));
    EXPECT_TRUE(bitwise_equal(lse, want_lse));
  }
}

// A plan used with a call it was not made for throws invalid_argument naming "plan" and
// writes nothing: lists whose rows keep other counts, other options, a forward_paged plan of
// the same batch; the varlen form likewise. The planner checks the call's arguments.
TEST(PagedTopk, PlanOfAnotherCallIsRejectedWithNothingWritten) {
  PagedShape s{{1, 17, 127}, 3, 4, 2, 40, 24, 16};
  PagedBatch<float> batch(s, 101);
  const TopkLists lists(s, 17, 102);
  const PagedPlan plan = plan_topk(batch, lists);
  const auto expect_rejected = [&](auto&& call, const std::string& name) {
    batch.reset_outputs();
    EXPECT_THROW_NAMING(call(), name);
    EXPECT_TRUE(all_equal(batch.o, sentinel) && all_equal(batch.lse, sentinel)) << name;
  };
  TopkLists shorter = lists;
  for (std::size_t j = 0; j < shorter.idx.size(); ++j)
    if (shorter.idx[j] >= 0) {
      shorter.idx[j] = -1;  // one row keeps one key fewer
      break;
    }
  expect_rejected([&] { run_topk(plan, batch, shorter); }, "plan");
  PagedOptions split;
  split.num_splits = 2;
  expect_rejected([&] { run_topk(plan, batch, lists, split); }, "plan");
  const PagedPlan dense = plan_forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(),
                                             batch.seqlens, batch.o_view(), batch.lse_view());
  expect_rejected([&] { run_topk(dense, batch, lists); }, "plan");
  TopkLists bad = lists;
  bad.idx.back() = 127;  // sequence 2 has 127 keys
  expect_rejected([&] { plan_topk(batch, bad); }, "topk_indices");
  // Varlen: the same rows packed, with the lists of one row shortened.
  const index_t total = s.batch() * s.q_len;
  const std::vector<std::int32_t> cu{0, 3, 6, 9};
  const auto run_varlen = [&](const PagedPlan& p, const TopkLists& l) {
    forward_paged_topk_varlen(p, make_thd<const float>(batch.q.data(), total, s.heads_q, s.head_dim),
                              batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                              make_packed_topk_indices(l.idx.data(), total, l.k),
                              make_thd(batch.o.data(), total, s.heads_q, s.dv()),
                              make_packed_lse(batch.lse.data(), s.heads_q, total), cu);
  };
  const PagedPlan packed = plan_forward_paged_topk_varlen(
      make_thd<const float>(batch.q.data(), total, s.heads_q, s.head_dim), batch.k_cache(), batch.v_cache(),
      batch.block_table(), batch.seqlens, make_packed_topk_indices(lists.idx.data(), total, lists.k),
      make_thd(batch.o.data(), total, s.heads_q, s.dv()), make_packed_lse(batch.lse.data(), s.heads_q, total), cu);
  expect_rejected([&] { run_varlen(packed, shorter); }, "plan");
  batch.reset_outputs();
  run_varlen(packed, lists);  // the call it was made for
  EXPECT_FALSE(all_equal(batch.o, sentinel));
}

}  // namespace
}  // namespace tileattn::test
