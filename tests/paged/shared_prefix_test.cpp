// tests/paged/shared_prefix_test.cpp: prefix-once attention (PagedOptions::shared_prefix,
// kernels/shared_prefix.hpp). Batches whose block tables share prefix pages, made by hand
// (groups of different sizes, sequences that share nothing, a sequence ending inside the
// shared pages, members whose keys are all shared, page sizes that do not divide the key
// tile) and by KvCache::fork and share_prefix; decode, causal verify and varlen batches
// mixing both; GQA; fp32, bf16 and an int8 cache. The plan must find exactly the expected
// groups, the results must match the
// double reference (bf16: FlashAttention's rule against a naive bf16 implementation) and
// the per-sequence path (shared_prefix = false) within rounding, give the same bits on
// every backend and thread count, and read each group's shared pages once per K/V head
// (exact IO counts). Options under which a row's keys may not be split at the prefix fall
// back to the per-sequence path; a plan whose groups the call's table no longer shares
// throws "plan".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/naive_same_precision.hpp"
#include "support/test_support.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

/// A sequence of a hand-made batch: k_len keys, q_len queries; its first shared_pages
/// table entries are those of sequence `parent` (an earlier one), and so are its keys there.
struct SeqSpec {
  index_t k_len;
  index_t q_len = 1;
  index_t parent = -1;
  index_t shared_pages = 0;
};

constexpr float int8_scale = 1.0f / 16;

/// A paged batch with shared pages (SeqSpec): queries packed [total_q, heads_q, d] (which is
/// [B, q_len, heads_q, d] when every q_len is equal), K/V in page pools of KV (int8: per
/// tensor scale 1/16), unused rows and table entries poisoned; float copies hold exactly the
/// stored values.
template <class T, class KV = T>
struct SharedBatch {
  std::vector<SeqSpec> specs;
  index_t page_size, heads_q, heads_kv, d;
  index_t max_pages = 0, num_pages = 0;
  std::vector<std::int32_t> cu_q{0}, table, seqlens;
  std::vector<float> qf;                    // [total_q, heads_q, d]
  std::vector<std::vector<float>> kf, vf;   // per sequence [k_len, heads_kv, d]
  std::vector<T> q;
  std::vector<KV, LineAlignedAllocator<KV>> k_pool, v_pool;
  float k_scale = int8_scale, v_scale = int8_scale;

  SharedBatch(std::vector<SeqSpec> s, index_t ps, index_t hq, index_t hkv, index_t dim, std::uint64_t seed)
      : specs(std::move(s)), page_size(ps), heads_q(hq), heads_kv(hkv), d(dim) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const auto stored = [&](float x) {
      if constexpr (std::is_same_v<KV, std::int8_t>) return std::clamp(std::round(x / int8_scale), -127.0f, 127.0f) * int8_scale;
      else return to_float(from_float<KV>(x));
    };
    for (SeqSpec& sp : specs) {
      const index_t pages = (sp.k_len + ps - 1) / ps;
      sp.shared_pages = std::min(sp.shared_pages, pages);  // a short sequence holds fewer
      max_pages = std::max(max_pages, pages);
      num_pages += pages - sp.shared_pages;
    }
    max_pages += 1;  // a poisoned padding column
    num_pages += 2;  // spare pages, poisoned
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    table.assign(static_cast<std::size_t>(batch() * max_pages), std::int32_t{1} << 30);
    const std::size_t row = static_cast<std::size_t>(heads_kv * d);
    const KV poison = [] {
      if constexpr (std::is_same_v<KV, std::int8_t>) return std::int8_t{127};
      else return from_float<KV>(std::numeric_limits<float>::quiet_NaN());
    }();
    k_pool.assign(static_cast<std::size_t>(num_pages * ps) * row, poison);
    v_pool = k_pool;
    std::size_t next = 0;
    for (index_t b = 0; b < batch(); ++b) {
      const SeqSpec& sp = specs[static_cast<std::size_t>(b)];
      auto& k = kf.emplace_back(static_cast<std::size_t>(sp.k_len) * row);
      auto& v = vf.emplace_back(k.size());
      const index_t inherited = std::min(sp.k_len, sp.shared_pages * ps);
      if (sp.parent >= 0) {
        const auto& parent = specs[static_cast<std::size_t>(sp.parent)];
        EXPECT_LE(inherited, parent.k_len) << "a child reads rows its parent never wrote";
        for (index_t j = 0; j < sp.shared_pages; ++j)
          table[static_cast<std::size_t>(b * max_pages + j)] = table[static_cast<std::size_t>(sp.parent * max_pages + j)];
        std::copy_n(kf[static_cast<std::size_t>(sp.parent)].begin(), static_cast<std::size_t>(inherited) * row, k.begin());
        std::copy_n(vf[static_cast<std::size_t>(sp.parent)].begin(), static_cast<std::size_t>(inherited) * row, v.begin());
      }
      for (std::size_t i = static_cast<std::size_t>(inherited) * row; i < k.size(); ++i) {
        k[i] = stored(normal(rng));
        v[i] = stored(normal(rng));
      }
      for (index_t j = sp.shared_pages; j * ps < sp.k_len; ++j) table[static_cast<std::size_t>(b * max_pages + j)] = order[next++];
      for (index_t r = inherited; r < sp.k_len; ++r) {  // the shared rows are the parent's, in its pages
        const auto page = static_cast<std::size_t>(table[static_cast<std::size_t>(b * max_pages + r / ps)]);
        const std::size_t at = (page * static_cast<std::size_t>(ps) + static_cast<std::size_t>(r % ps)) * row;
        for (std::size_t c = 0; c < row; ++c) {
          k_pool[at + c] = store(k[static_cast<std::size_t>(r) * row + c], k_scale);
          v_pool[at + c] = store(v[static_cast<std::size_t>(r) * row + c], v_scale);
        }
      }
      seqlens.push_back(static_cast<std::int32_t>(sp.k_len));
      cu_q.push_back(static_cast<std::int32_t>(cu_q.back() + sp.q_len));
    }
    qf.resize(static_cast<std::size_t>(cu_q.back() * heads_q * d));
    for (float& x : qf) {
      x = to_float(from_float<T>(normal(rng)));
      q.push_back(from_float<T>(x));
    }
  }

  static KV store(float x, float scale) {
    if constexpr (std::is_same_v<KV, std::int8_t>) return static_cast<std::int8_t>(std::round(x / scale));
    else return from_float<KV>(x);
  }

  index_t batch() const { return static_cast<index_t>(specs.size()); }
  index_t total_q() const { return cu_q.back(); }
  index_t q_len(index_t b) const { return specs[static_cast<std::size_t>(b)].q_len; }
  bool fixed_length() const {
    return std::all_of(specs.begin(), specs.end(), [&](const SeqSpec& s) { return s.q_len == specs[0].q_len; });
  }

  PagedOptions options() const {
    PagedOptions opt;
    opt.causal = true;
    opt.shared_prefix_min_keys = 32;
    if constexpr (std::is_same_v<KV, std::int8_t>) {
      opt.k_scale = per_tensor_scale(&k_scale);
      opt.v_scale = per_tensor_scale(&v_scale);
    }
    return opt;
  }

  TensorView<const KV> pool(const std::vector<KV, LineAlignedAllocator<KV>>& p) const {
    return make_bshd(p.data(), num_pages, page_size, heads_kv, d);
  }
  BlockTableView block_table() const { return make_block_table(table.data(), batch(), max_pages); }

  struct Result {
    std::vector<float> o, lse;  // o [total_q, heads_q, d]; lse [B, heads_q, q_len] or [heads_q, total_q] (varlen)
  };

  /// forward_paged (every q_len equal) or forward_paged_varlen, with `plan` if given.
  Result run(const PagedOptions& opt, const PagedPlan* plan = nullptr, std::vector<T>* o_out = nullptr) const {
    std::vector<T> o(q.size(), from_float<T>(sentinel));
    Result r{{}, std::vector<float>(static_cast<std::size_t>(total_q() * heads_q), sentinel)};
    if (fixed_length()) {
      const index_t B = batch(), n = q_len(0);
      const auto qv = make_bshd(q.data(), B, n, heads_q, d);
      const auto ov = make_bshd(o.data(), B, n, heads_q, d);
      const auto lv = make_lse(r.lse.data(), B, heads_q, n);
      if (plan) forward_paged(*plan, qv, pool(k_pool), pool(v_pool), block_table(), seqlens, ov, lv, opt);
      else forward_paged(qv, pool(k_pool), pool(v_pool), block_table(), seqlens, ov, lv, opt);
    } else {
      const auto qv = make_thd(q.data(), total_q(), heads_q, d);
      const auto ov = make_thd(o.data(), total_q(), heads_q, d);
      const auto lv = make_packed_lse(r.lse.data(), heads_q, total_q());
      if (plan) forward_paged_varlen(*plan, qv, pool(k_pool), pool(v_pool), block_table(), seqlens, ov, lv, cu_q, opt);
      else forward_paged_varlen(qv, pool(k_pool), pool(v_pool), block_table(), seqlens, ov, lv, cu_q, opt);
    }
    for (const T& x : o) r.o.push_back(to_float(x));
    if (o_out) *o_out = o;
    return r;
  }

  PagedPlan plan(const PagedOptions& opt) const {
    std::vector<T> o(q.size());
    std::vector<float> lse(static_cast<std::size_t>(total_q() * heads_q));
    if (fixed_length()) {
      const index_t B = batch(), n = q_len(0);
      return plan_forward_paged(make_bshd(q.data(), B, n, heads_q, d), pool(k_pool), pool(v_pool), block_table(),
                                seqlens, make_bshd(o.data(), B, n, heads_q, d), make_lse(lse.data(), B, heads_q, n), opt);
    }
    return plan_forward_paged_varlen(make_thd(q.data(), total_q(), heads_q, d), pool(k_pool), pool(v_pool),
                                     block_table(), seqlens, make_thd(o.data(), total_q(), heads_q, d),
                                     make_packed_lse(lse.data(), heads_q, total_q()), cu_q, opt);
  }

  /// Sequence b's queries, K, V (stored values) as [1, len, heads, d] float views.
  TensorView<const float> q_of(index_t b) const {
    return make_bshd(qf.data() + cu_q[static_cast<std::size_t>(b)] * heads_q * d, 1, q_len(b), heads_q, d);
  }
  TensorView<const float> k_of(index_t b) const {
    return make_bshd(kf[static_cast<std::size_t>(b)].data(), 1, specs[static_cast<std::size_t>(b)].k_len, heads_kv, d);
  }
  TensorView<const float> v_of(index_t b) const {
    return make_bshd(vf[static_cast<std::size_t>(b)].data(), 1, specs[static_cast<std::size_t>(b)].k_len, heads_kv, d);
  }
  /// Sequence b's rows of a result's O and LSE.
  TensorView<const float> o_of(const Result& r, index_t b) const {
    return make_bshd(r.o.data() + cu_q[static_cast<std::size_t>(b)] * heads_q * d, 1, q_len(b), heads_q, d);
  }
  LseView lse_of(Result& r, index_t b) const {
    if (fixed_length()) return make_lse(r.lse.data() + b * heads_q * q_len(b), 1, heads_q, q_len(b));
    return {r.lse.data() + cu_q[static_cast<std::size_t>(b)], {1, heads_q, q_len(b)}, {0, total_q(), 1}};
  }

  /// The largest deviation of a result from the double reference over every sequence.
  Deviation against_reference(Result r, const PagedOptions& opt) const {
    Deviation worst;
    for (index_t b = 0; b < batch(); ++b) {
      reference::Options ref_opt = reference::Options::from(opt);
      ref_opt.batch_index = b;
      const Deviation dev =
          compare_to_reference(reference::attention(q_of(b), k_of(b), v_of(b), ref_opt), o_of(r, b), lse_of(r, b));
      worst.o = std::max(worst.o, dev.o);
      worst.lse = std::max(worst.lse, dev.lse);
      if (worst.problem.empty() && !dev.problem.empty()) worst.problem = "sequence " + std::to_string(b) + ": " + dev.problem;
    }
    return worst;
  }

  /// The largest O deviation from the double reference of a naive implementation in T
  /// (S and P rounded to T: FlashAttention's accuracy rule's yardstick).
  double naive_error(const PagedOptions& opt) const {
    double worst = 0;
    for (index_t b = 0; b < batch(); ++b) {
      reference::Options ref_opt = reference::Options::from(opt);
      ref_opt.batch_index = b;
      std::vector<float> o(static_cast<std::size_t>(q_len(b) * heads_q * d)), lse(static_cast<std::size_t>(heads_q * q_len(b)));
      naive_same_precision<T>(q_of(b), k_of(b), v_of(b), ref_opt, make_bshd(o.data(), 1, q_len(b), heads_q, d),
                              make_lse(lse.data(), 1, heads_q, q_len(b)));
      const Deviation dev = compare_to_reference(reference::attention(q_of(b), k_of(b), v_of(b), ref_opt),
                                                 make_bshd<const float>(o.data(), 1, q_len(b), heads_q, d),
                                                 make_lse(lse.data(), 1, heads_q, q_len(b)));
      worst = std::max(worst, dev.o);
    }
    return worst;
  }
};

/// The groups of a plan as member lists.
std::vector<std::vector<index_t>> groups_of(const PagedPlan& plan) {
  std::vector<std::vector<index_t>> out;
  if (const auto* shared = plan.shared_prefix())
    for (const auto& g : shared->groups) out.push_back(g.members);
  return out;
}

using Groups = std::vector<std::vector<index_t>>;

/// The hand-made batch (page_size 16): sequences 0, 1, 2 and 8 share 30 pages (8 ends
/// exactly there), 3 shares only 12 of them (joins them at min_keys 32, cut off at 256), 4,
/// 5 and 6 share 18 pages of which 6 holds only 17.5 (it ends inside the shared pages), 7
/// shares nothing.
std::vector<SeqSpec> hand_made(index_t q_len) {
  return {{700, q_len}, {600, q_len, 0, 30}, {530, q_len, 0, 30}, {400, q_len, 0, 12}, {300, q_len},
          {350, q_len, 4, 18}, {280, q_len, 4, 18}, {100, q_len}, {480, q_len, 0, 30}};
}

/// The per-sequence path and prefix-once on one batch: the expected groups, each within
/// rounding of the other and both of the reference. bf16: naive is batch.naive_error(opt)
/// (the same for every num_splits and threshold: callers compute it once).
template <class T, class KV>
void check_against_per_sequence(const SharedBatch<T, KV>& batch, PagedOptions opt, const Groups& expected,
                                double naive = 0) {
  const PagedPlan plan = batch.plan(opt);
  EXPECT_EQ(groups_of(plan), expected);
  if (const auto* shared = plan.shared_prefix())
    for (const auto& g : shared->groups) {
      EXPECT_EQ(g.keys, g.pages * batch.page_size) << "whole pages, whatever the key tile";
      EXPECT_GE(g.keys, opt.shared_prefix_min_keys);
    }
  const auto once = batch.run(opt);
  const auto planned = batch.run(opt, &plan);
  EXPECT_TRUE(bitwise_equal(once.o, planned.o) && bitwise_equal(once.lse, planned.lse)) << "planned and direct calls";
  PagedOptions per_sequence = opt;
  per_sequence.shared_prefix = false;
  EXPECT_EQ(batch.plan(per_sequence).shared_prefix(), nullptr);
  const auto each = batch.run(per_sequence);
  double o_diff = 0, lse_diff = 0;
  for (std::size_t i = 0; i < once.o.size(); ++i)
    o_diff = std::max<double>(o_diff, std::abs(once.o[i] - each.o[i]));
  for (std::size_t i = 0; i < once.lse.size(); ++i)
    lse_diff = std::max<double>(lse_diff, std::abs(once.lse[i] - each.lse[i]));
  if constexpr (std::is_same_v<T, bf16>) {
    // FlashAttention's rule: within 2e-5 + 2x the error of a naive bf16 implementation
    EXPECT_GT(naive, 0) << "the caller passes batch.naive_error(opt)";
    const Deviation dev = batch.against_reference(once, opt);
    EXPECT_TRUE(dev.problem.empty()) << dev.problem;
    EXPECT_LE(dev.o, 2e-5 + 2 * naive);
    EXPECT_LE(dev.lse, forward_lse_tolerance);
    EXPECT_LE(o_diff, 2e-5 + 2 * naive);
  } else {
    const Deviation dev = batch.against_reference(once, opt);
    EXPECT_TRUE(dev.problem.empty()) << dev.problem;
    EXPECT_LE(dev.o, forward_o_tolerance);
    EXPECT_LE(dev.lse, forward_lse_tolerance);
    EXPECT_LE(o_diff, 2e-6) << "prefix-once against per sequence";
  }
  EXPECT_LE(lse_diff, 4e-6) << "prefix-once against per sequence";
}

template <class T, class KV>
void check_hand_made() {
  for (index_t q_len : {1, 4}) {
    SCOPED_TRACE("q_len " + std::to_string(q_len));
    const SharedBatch<T, KV> batch(hand_made(q_len), 16, 8, 2, 64, 3 + static_cast<std::uint64_t>(q_len));
    PagedOptions opt = batch.options();
    const double naive = std::is_same_v<T, bf16> ? batch.naive_error(opt) : 0.0;
    check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}}, naive);
    opt.shared_prefix_min_keys = 256;  // sequence 3 shares 192 keys: alone
    check_against_per_sequence(batch, opt, {{0, 1, 2, 8}, {4, 5, 6}}, naive);
    opt.shared_prefix_min_keys = 32;
    opt.num_splits = 3;  // split-KV in the prefix pass and in the sequences' own keys
    check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}}, naive);
  }
}

TEST(SharedPrefix, Fp32HandMadeTablesDecodeAndVerify) { check_hand_made<float, float>(); }
TEST(SharedPrefix, Bf16HandMadeTablesDecodeAndVerify) { check_hand_made<bf16, bf16>(); }
TEST(SharedPrefix, Int8CacheHandMadeTablesDecodeAndVerify) { check_hand_made<float, std::int8_t>(); }

/// The groups come from the page ids alone: the same under every key tile the micro-kernel
/// sets choose (bf16 panels of 128 keys on AVX-512 BF16, 512 on AMX: forced here through
/// detail::panel_keys, so every machine plans both) and every SRAM budget, and the results
/// stay within the rule of the reference and the per-sequence path under each. Before the
/// members' own key tiles started right after the shared keys, the shared keys were cut to
/// a multiple of the key tile: AMX's 512-key panels left the hand-made batch no group.
template <class T, class KV>
void check_groups_independent_of_key_tile() {
  for (index_t q_len : {1, 4}) {
    const SharedBatch<T, KV> batch(hand_made(q_len), 16, 8, 2, 64, 40 + static_cast<std::uint64_t>(q_len));
    const double naive = std::is_same_v<T, bf16> ? batch.naive_error(batch.options()) : 0.0;
    for (index_t panel : {0, 128, 512})
      for (bool small : {false, true}) {
        detail::panel_keys = panel;
        // small: 32 packed rows beside the key tiles of this panel width
        const std::size_t budget = small ? rows_budget_for<T, KV>(32, 64) : 0;
        SCOPED_TRACE("q_len " + std::to_string(q_len) + ", panel_keys " + std::to_string(panel) + ", budget " +
                     std::to_string(budget));
        PagedOptions opt = batch.options();
        opt.sram_budget_bytes = budget;
        check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}}, naive);
        detail::panel_keys = 0;
      }
  }
}

TEST(SharedPrefix, Bf16GroupsDoNotDependOnTheKeyTileOrTheBudget) { check_groups_independent_of_key_tile<bf16, bf16>(); }
TEST(SharedPrefix, Fp32GroupsDoNotDependOnTheKeyTileOrTheBudget) { check_groups_independent_of_key_tile<float, float>(); }

TEST(SharedPrefix, AForkOfFewerKeysThanAKeyTileIsGroupedAndShown) {
  // Two sequences forked after 96 keys (6 pages of 16), fewer than one key tile of every
  // micro-kernel set (128 and more): with shared_prefix_min_keys 64 they form one group of
  // 96 keys, which the public PagedPlan::shared_prefix_groups() shows.
  const std::vector<SeqSpec> specs{{300, 1}, {250, 1, 0, 6}, {90, 1}};
  const SharedBatch<bf16> batch(specs, 16, 8, 2, 64, 17);
  PagedOptions opt = batch.options();
  opt.shared_prefix_min_keys = 64;
  const PagedPlan plan = batch.plan(opt);
  const std::span<const SharedPrefixGroup> groups = plan.shared_prefix_groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].members, (std::vector<index_t>{0, 1}));
  EXPECT_EQ(groups[0].keys, 96);
  EXPECT_EQ(groups[0].pages, 6);
  check_against_per_sequence(batch, opt, {{0, 1}}, batch.naive_error(opt));
  opt.shared_prefix = false;
  EXPECT_TRUE(batch.plan(opt).shared_prefix_groups().empty());
}

TEST(SharedPrefix, VarlenMixesDecodeAndVerifyInOneGroup) {
  std::vector<SeqSpec> specs = hand_made(1);
  for (std::size_t b = 0; b < specs.size(); ++b) specs[b].q_len = static_cast<index_t>(1 + b % 3);  // 1, 2, 3 queries
  const SharedBatch<float> batch(specs, 16, 8, 2, 64, 21);
  check_against_per_sequence(batch, batch.options(), {{0, 1, 2, 3, 8}, {4, 5, 6}});
}

TEST(SharedPrefix, PageSizesThatSplitKeyTilesMhaAndMqa) {
  // page_size 5 and 7 against key tiles of 64 and more; MHA (group 1) and MQA (group 6)
  for (const auto [page, hq, hkv] : {std::array<index_t, 3>{5, 3, 3}, std::array<index_t, 3>{7, 6, 1}}) {
    SCOPED_TRACE("page_size " + std::to_string(page) + ", heads " + std::to_string(hq) + "/" + std::to_string(hkv));
    const std::vector<SeqSpec> specs{{500, 2}, {420, 2, 0, 60}, {333, 2, 0, 60}, {150, 2, 0, 20}};
    const SharedBatch<float> batch(specs, page, hq, hkv, 40, 5);
    check_against_per_sequence(batch, batch.options(), {{0, 1, 2, 3}});
  }
}

TEST(SharedPrefix, IdenticalTablesLeaveAMemberNoKeysOfItsOwn) {
  // Sequences 0 and 1 hold the same 32 pages and 512 keys: decoding (non-causal: every key
  // visible) the whole sequence is the shared prefix and each member's own chunk is empty;
  // 2 holds one more page.
  const std::vector<SeqSpec> specs{{512, 1}, {512, 1, 0, 32}, {520, 1, 0, 32}};
  const SharedBatch<float> batch(specs, 16, 8, 2, 64, 31);
  PagedOptions opt = batch.options();
  opt.causal = false;
  const PagedPlan plan = batch.plan(opt);
  ASSERT_NE(plan.shared_prefix(), nullptr);
  EXPECT_EQ(plan.shared_prefix()->groups[0].keys, 512);
  check_against_per_sequence(batch, opt, {{0, 1, 2}});
}

TEST(SharedPrefix, SinksCountOnceSoftcapAndWideChunksKeepTheGroups) {
  const float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f, 3.0f, 0.25f};
  const SharedBatch<float> batch(hand_made(2), 16, 8, 2, 64, 8);
  PagedOptions opt = batch.options();
  opt.sinks = sinks;
  opt.softcap = 2.5f;
  check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}});
  opt.attention_chunk = 1024;  // every key in one chunk
  check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}});
  opt.attention_chunk = 0;
  opt.window_left = 800;       // a window wider than every sequence
  check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}});
  opt.window_left = -1;
  opt.causal = false;          // every key visible to every row
  check_against_per_sequence(batch, opt, {{0, 1, 2, 3, 8}, {4, 5, 6}});
}

TEST(SharedPrefix, OptionsThatDependOnTheQueryPositionRunPerSequence) {
  const float slopes[8] = {0.25f, 0.5f, 0.125f, 0.0625f, 0.03f, 0.02f, 0.01f, 0.3f};
  const SharedBatch<float> batch(hand_made(1), 16, 8, 2, 64, 9);
  std::vector<float> bias(static_cast<std::size_t>(700), 0.5f);
  std::vector<char> mask_storage(700, 1);
  const auto variants = std::vector<std::pair<std::string, std::function<void(PagedOptions&)>>>{
      {"alibi", [&](PagedOptions& o) { o.alibi_slopes = slopes; }},
      {"bias", [&](PagedOptions& o) { o.bias = {bias.data(), {1, 1, 1, 700}, {0, 0, 0, 1}}; }},
      {"mask", [&](PagedOptions& o) { o.mask = {reinterpret_cast<const bool*>(mask_storage.data()), {1, 1, 1, 700}, {0, 0, 0, 1}}; }},
      {"batch_invariant", [](PagedOptions& o) { o.batch_invariant = true; }},
      {"shared_prefix false", [](PagedOptions& o) { o.shared_prefix = false; }},
  };
  for (const auto& [name, set] : variants) {
    SCOPED_TRACE(name);
    PagedOptions opt = batch.options();
    set(opt);
    EXPECT_EQ(batch.plan(opt).shared_prefix(), nullptr);
    const Deviation dev = batch.against_reference(batch.run(opt), opt);
    EXPECT_TRUE(dev.problem.empty()) << dev.problem;
    EXPECT_LE(dev.o, forward_o_tolerance);
  }
  // rotary embedding: the prefix pass would rotate the members' packed queries at its own
  // positions, so the whole call runs per sequence (identity tables: cos 1, sin 0)
  std::vector<float> cos_table(1024 * 32, 1.0f), sin_table(1024 * 32, 0.0f);
  PagedOptions rotated = batch.options();
  rotated.rotary.cos = {cos_table.data(), {1024, 32}, {32, 1}};
  rotated.rotary.sin = {sin_table.data(), {1024, 32}, {32, 1}};
  EXPECT_EQ(batch.plan(rotated).shared_prefix(), nullptr);
  const Deviation dev = batch.against_reference(batch.run(rotated), rotated);
  EXPECT_TRUE(dev.problem.empty()) << dev.problem;
  EXPECT_LE(dev.o, forward_o_tolerance);
  // a window or chunk that hides prefix keys from some rows: those sequences stay out
  PagedOptions opt = batch.options();
  opt.window_left = 200;
  EXPECT_EQ(batch.plan(opt).shared_prefix(), nullptr);
  opt.window_left = -1;
  opt.attention_chunk = 256;
  EXPECT_EQ(batch.plan(opt).shared_prefix(), nullptr);
  opt.attention_chunk = 0;
  opt.window_left = 590;  // sequences 0, 1 (700, 600 keys) lose key 0; 2, 3, 8 and 4, 5, 6 keep their groups
  check_against_per_sequence(batch, opt, {{2, 3, 8}, {4, 5, 6}});
}

TEST(SharedPrefix, BitwiseIdenticalAcrossBackendsAndThreadCounts) {
  const SharedBatch<float> batch(hand_made(1), 16, 8, 2, 64, 11);
  PagedOptions opt = batch.options();
  opt.execution = {Backend::serial, 1};
  ASSERT_NE(batch.plan(opt).shared_prefix(), nullptr);
  const auto first = batch.run(opt);
  for (Backend backend : compiled_backends())
    for (int threads : {1, 2, 3, 7})
      for (int repeat = 0; repeat < (backend == Backend::serial ? 1 : std::min(determinism_repeats(), 10)); ++repeat) {
        opt.execution = {backend, threads};
        const auto r = batch.run(opt);
        ASSERT_TRUE(bitwise_equal(r.o, first.o) && bitwise_equal(r.lse, first.lse))
            << to_string(backend) << " x " << threads << ", repeat " << repeat;
      }
}

TEST(SharedPrefix, ReadsTheSharedPagesOncePerGroupAndKvHead) {
  // Decode, no split-KV: each group's pass reads its shared keys' K/V once per K/V head and
  // its members' gathered queries (gathered once: read and written), writes a partial state
  // per row; each member reads its own keys and queries, writes a state; the merge reads
  // both states and writes O and the LSE. Sequence 7 runs alone, as without sharing.
  const SharedBatch<float> batch(hand_made(1), 16, 8, 2, 64, 12);
  PagedOptions opt = batch.options();
  opt.num_splits = 1;
  IoCounts io, io_each;
  opt.io_counts = &io;
  const PagedPlan plan = batch.plan(opt);
  ASSERT_NE(plan.shared_prefix(), nullptr);
  batch.run(opt);
  const std::uint64_t f = sizeof(float), hq = 8, hkv = 2, d = 64;
  const std::uint64_t kv_key = hkv * 2 * d * f, q_row = hq * d * f, state = hq * (d + 2) * f, out = hq * (d + 1) * f;
  std::uint64_t read = 0, written = 0, kv_once = 0, kv_each = 0;
  std::vector<index_t> prefix_keys(static_cast<std::size_t>(batch.batch()), 0);
  for (const auto& g : plan.shared_prefix()->groups) {
    const auto rows = static_cast<std::uint64_t>(g.members.size());
    read += static_cast<std::uint64_t>(g.keys) * kv_key + 2 * rows * q_row;  // K/V once; the gather's read and the pass's
    written += rows * q_row + rows * state;                                    // the gathered copy; the pass's states
    kv_once += static_cast<std::uint64_t>(g.keys) * kv_key;
    for (index_t b : g.members) prefix_keys[static_cast<std::size_t>(b)] = g.keys;
  }
  for (index_t b = 0; b < batch.batch(); ++b) {
    const auto own = static_cast<std::uint64_t>(batch.seqlens[static_cast<std::size_t>(b)] - prefix_keys[static_cast<std::size_t>(b)]);
    kv_each += static_cast<std::uint64_t>(batch.seqlens[static_cast<std::size_t>(b)]) * kv_key;
    kv_once += own * kv_key;
    read += own * kv_key + q_row;
    written += out;
    if (prefix_keys[static_cast<std::size_t>(b)] > 0) {
      written += state;    // its own keys' state
      read += 2 * state;   // the merge reads the prefix's and its own
    }
  }
  EXPECT_EQ(io.bytes_read, read);
  EXPECT_EQ(io.bytes_written, written);
  opt.shared_prefix = false;
  opt.io_counts = &io_each;
  batch.run(opt);
  EXPECT_EQ(io_each.bytes_read, kv_each + static_cast<std::uint64_t>(batch.batch()) * q_row);
  EXPECT_LT(kv_once, kv_each);
}

TEST(SharedPrefix, OnTheCacheManagerAfterForkAndSharePrefix) {
  // A 400-token prompt (page 16: 25 pages) forked three times, shared twice at 300 tokens
  // (18.75 pages: the partly shared page is copied on the first extend), each with its own
  // continuation, and a sequence of its own; decode and a 3-token causal verify.
  constexpr index_t hkv = 2, hq = 8, d = 32, page = 16;
  KvCache<float> cache({.num_layers = 1, .num_pages = 256, .page_size = page, .heads_kv = hkv, .head_dim = d});
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  std::map<SequenceId, std::vector<float>> k_model, v_model;
  const auto append = [&](SequenceId id, index_t n) {
    std::vector<float> k(static_cast<std::size_t>(n * hkv * d)), v(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    cache.append(id, make_bshd<const float>(k.data(), 1, n, hkv, d), make_bshd<const float>(v.data(), 1, n, hkv, d));
    k_model[id].insert(k_model[id].end(), k.begin(), k.end());
    v_model[id].insert(v_model[id].end(), v.begin(), v.end());
  };
  const auto adopt = [&](SequenceId id, SequenceId from, index_t tokens) {
    k_model[id].assign(k_model[from].begin(), k_model[from].begin() + tokens * hkv * d);
    v_model[id].assign(v_model[from].begin(), v_model[from].begin() + tokens * hkv * d);
  };
  const SequenceId prompt = cache.create();
  append(prompt, 400);
  std::vector<SequenceId> ids{prompt};
  for (int i = 0; i < 3; ++i) {
    const SequenceId child = cache.fork(prompt);
    adopt(child, prompt, 400);
    ids.push_back(child);
  }
  for (int i = 0; i < 2; ++i) {
    const SequenceId shared = cache.share_prefix(prompt, 300);
    adopt(shared, prompt, 300);
    ids.push_back(shared);
  }
  const SequenceId alone = cache.create();
  append(alone, 333);
  ids.push_back(alone);
  for (std::size_t i = 0; i < ids.size(); ++i) append(ids[i], static_cast<index_t>(17 + 40 * i));
  for (index_t q_len : {1, 3}) {
    SCOPED_TRACE("q_len " + std::to_string(q_len));
    const auto tables = cache.batch(ids);
    const auto b = static_cast<index_t>(ids.size());
    std::vector<float> q(static_cast<std::size_t>(b * q_len * hq * d));
    for (auto& x : q) x = normal(rng);
    PagedOptions opt;
    opt.causal = true;
    opt.shared_prefix_min_keys = 64;
    const auto qv = make_bshd<const float>(q.data(), b, q_len, hq, d);
    const auto run = [&](const PagedOptions& o, std::vector<float>& out, std::vector<float>& lse) {
      out.assign(q.size(), sentinel);
      lse.assign(static_cast<std::size_t>(b * hq * q_len), sentinel);
      forward_paged(qv, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(), tables.seqlens(),
                    make_bshd(out.data(), b, q_len, hq, d), make_lse(lse.data(), b, hq, q_len), o);
    };
    const PagedPlan plan = plan_forward_paged(qv, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(),
                                              tables.seqlens(), make_bshd(std::vector<float>(q.size()).data(), b, q_len, hq, d),
                                              LseView{}, opt);
    // one group: the prompt's 18 whole pages that every sharer holds (the forks share 25,
    // but one level of sharing takes what all share)
    ASSERT_EQ(groups_of(plan), (Groups{{0, 1, 2, 3, 4, 5}}));
    EXPECT_LE(plan.shared_prefix()->groups[0].keys, 18 * page);
    std::vector<float> o, lse, o_each, lse_each;
    run(opt, o, lse);
    PagedOptions each = opt;
    each.shared_prefix = false;
    run(each, o_each, lse_each);
    double diff = 0;
    for (std::size_t i = 0; i < o.size(); ++i) diff = std::max<double>(diff, std::abs(o[i] - o_each[i]));
    EXPECT_LE(diff, 2e-6);
    for (index_t s = 0; s < b; ++s) {
      const SequenceId id = ids[static_cast<std::size_t>(s)];
      const index_t len = cache.length(id);
      const auto ref = reference::attention(make_bshd<const float>(q.data() + s * q_len * hq * d, 1, q_len, hq, d),
                                            make_bshd<const float>(k_model[id].data(), 1, len, hkv, d),
                                            make_bshd<const float>(v_model[id].data(), 1, len, hkv, d),
                                            reference::Options::from(opt));
      const Deviation dev = compare_to_reference(ref, make_bshd<const float>(o.data() + s * q_len * hq * d, 1, q_len, hq, d),
                                                 make_lse(lse.data() + s * hq * q_len, 1, hq, q_len));
      EXPECT_TRUE(dev.problem.empty()) << dev.problem;
      EXPECT_LE(dev.o, forward_o_tolerance) << "sequence " << s;
      EXPECT_LE(dev.lse, forward_lse_tolerance) << "sequence " << s;
    }
  }
}

TEST(SharedPrefix, BadMinKeysAndAPlanWhoseTableNoLongerSharesThrowAndWriteNothing) {
  SharedBatch<float> batch(hand_made(1), 16, 8, 2, 64, 13);
  PagedOptions opt = batch.options();
  opt.shared_prefix_min_keys = 0;
  try {
    batch.run(opt);
    ADD_FAILURE() << "shared_prefix_min_keys 0 was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "shared_prefix_min_keys");
  }
  opt.shared_prefix_min_keys = 32;
  const PagedPlan plan = batch.plan(opt);
  ASSERT_NE(plan.shared_prefix(), nullptr);
  // sequence 5's page 3 copied to a spare page (as copy-on-write would): same keys, no longer shared
  std::vector<bool> used(static_cast<std::size_t>(batch.num_pages), false);
  for (std::int32_t page : batch.table)
    if (page < batch.num_pages) used[static_cast<std::size_t>(page)] = true;
  const auto spare = static_cast<std::int32_t>(std::find(used.begin(), used.end(), false) - used.begin());
  ASSERT_LT(spare, batch.num_pages);
  std::int32_t& entry = batch.table[static_cast<std::size_t>(5 * batch.max_pages + 3)];
  const auto page_elements = static_cast<std::size_t>(16 * 2 * 64);
  for (auto* pool : {&batch.k_pool, &batch.v_pool})
    std::copy_n(pool->begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(entry) * page_elements), page_elements,
                pool->begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(spare) * page_elements));
  entry = spare;
  std::vector<float> o(batch.q.size(), sentinel), lse(static_cast<std::size_t>(batch.batch() * 8), sentinel);
  try {
    forward_paged(plan, make_bshd(batch.q.data(), batch.batch(), 1, 8, 64), batch.pool(batch.k_pool),
                  batch.pool(batch.v_pool), batch.block_table(), batch.seqlens, make_bshd(o.data(), batch.batch(), 1, 8, 64),
                  make_lse(lse.data(), batch.batch(), 8, 1), opt);
    ADD_FAILURE() << "a plan whose groups the table no longer shares was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "plan");
  }
  EXPECT_TRUE(all_equal(o, sentinel) && all_equal(lse, sentinel)) << "nothing is written";
  // the direct call plans for the table it gets: 5 now shares 3 pages (48 keys, at least
  // shared_prefix_min_keys 32) with 4 and 6, so their group shares those, and the result is right
  const auto r = batch.run(opt);
  const Deviation dev = batch.against_reference(r, opt);
  EXPECT_TRUE(dev.problem.empty()) << dev.problem;
  EXPECT_LE(dev.o, forward_o_tolerance);
  const PagedPlan replanned = batch.plan(opt);
  EXPECT_EQ(groups_of(replanned), (Groups{{0, 1, 2, 3, 8}, {4, 5, 6}}));
  ASSERT_EQ(replanned.shared_prefix_groups().size(), 2u);
  EXPECT_EQ(replanned.shared_prefix_groups()[1].keys, 48);
  // with a minimum above 48 keys, 5 leaves the group and 4 and 6 keep their 18 pages
  opt.shared_prefix_min_keys = 64;
  EXPECT_EQ(groups_of(batch.plan(opt)), (Groups{{0, 1, 2, 3, 8}, {4, 6}}));
  const Deviation dev64 = batch.against_reference(batch.run(opt), opt);
  EXPECT_TRUE(dev64.problem.empty()) << dev64.problem;
  EXPECT_LE(dev64.o, forward_o_tolerance);
}

}  // namespace
}  // namespace tileattn::test
