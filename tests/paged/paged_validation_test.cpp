// tests/paged/paged_validation_test.cpp: argument checking of the paged forward (paged.hpp,
// detail/paged_checks.hpp): every bad argument of forward_paged, plan_forward_paged, forward_paged
// with a plan and forward_paged_varlen throws tileattn::invalid_argument naming it, and
// nothing is written (O and LSE keep their sentinels; the pools, the block table and
// cache_seqlens are bitwise unchanged). Then the valid edge cases: an empty pool, empty
// sequences, rows that see no key, page_size 1, a block table without columns, garbage in
// the table's unused entries, and bf16/fp16 batches against the contiguous forward.
#include <gtest/gtest.h>

#include <climits>
#include <functional>
#include <limits>
#include <tuple>

#include "support/paged_support.hpp"

namespace tileattn::test {
namespace {

/// Every element of `v` holds the bits of T(sentinel) (a call wrote nothing).
template <class T>
bool all_sentinel(const std::vector<T>& v) {
  const T s = T(sentinel);
  return std::all_of(v.begin(), v.end(), [&](const T& x) { return std::memcmp(&x, &s, sizeof(T)) == 0; });
}

template <class V>
bool same_bits(const V& a, const V& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

// ---- forward_paged / plan_forward_paged / forward_paged(plan) -------------------------------------

enum class Entry { forward, plan, planned };

const char* to_string(Entry e) {
  switch (e) {
    case Entry::forward: return "forward_paged";
    case Entry::plan: return "plan_forward_paged";
    case Entry::planned: return "forward_paged_with_plan";
  }
  return "unknown";
}

/// A valid paged call (3 sequences of 20, 0 and 37 keys in pages of 8; 3 queries each;
/// 4 query heads over 2 K/V heads; head_dim 16) whose arguments a test then breaks. The
/// block table and cache_seqlens sit at the start of larger int32 buffers so that O or the
/// LSE can be pointed at them (an aliasing case) without a missed check writing past them.
struct Call {
  static constexpr index_t B = 3, q_len = 3;
  PagedBatch<float> batch;
  std::vector<std::int32_t> table_store, seqlens_store;
  std::vector<float> slopes, sinks;
  std::vector<float> gapped;  // see gapped_o
  TensorView<const float> q, k_cache, v_cache;
  BlockTableView table;
  std::span<const std::int32_t> seqlens;
  TensorView<float> o;
  LseView lse;
  PagedOptions opts;

  Call() : batch(PagedShape{{20, 0, 37}, q_len, 4, 2, 16, 0, 8, 2}, 21) {
    const std::size_t o_size = batch.o.size() + batch.lse.size();
    table_store.assign(batch.table.size() + o_size, 0);
    std::copy(batch.table.begin(), batch.table.end(), table_store.begin());
    seqlens_store.assign(batch.seqlens.size() + 1 + o_size, 0);
    std::copy(batch.seqlens.begin(), batch.seqlens.end(), seqlens_store.begin());
    q = batch.q_view();
    k_cache = batch.k_cache();
    v_cache = batch.v_cache();
    table = make_block_table(table_store.data(), B, batch.max_pages);
    seqlens = std::span<const std::int32_t>(seqlens_store.data(), B);
    o = batch.o_view();
    lse = batch.lse_view();
  }

  /// O in `gapped`, with a gap of 8 floats after each [heads, head_dim] row: an input put
  /// into a gap lies inside O's address range, but no element of O is written there.
  TensorView<float> gapped_o() {
    const index_t H = batch.shape.heads_q, D = batch.shape.head_dim, row = H * D + 8;
    gapped.assign(static_cast<std::size_t>(B * q_len * row), sentinel);
    return {gapped.data(), {B, q_len, H, D}, {q_len * row, row, D, 1}};
  }
  /// The first gap of gapped_o (8 floats).
  float* first_gap() { return gapped.data() + batch.shape.heads_q * batch.shape.head_dim; }

  /// `pool`'s elements copied into `store` two floats apart: the same pool with its head
  /// vectors strided (head_dim stride 2), which the kernels read through tiles, not in place.
  static TensorView<const float> spread(const TensorView<const float>& pool, std::vector<float>& store) {
    const auto& n = pool.shape;
    store.assign(static_cast<std::size_t>(2 * n[0] * n[1] * n[2] * n[3]), sentinel);
    const TensorView<float> out{store.data(), n, {2 * n[1] * n[2] * n[3], 2 * n[2] * n[3], 2 * n[3], 2}};
    for (index_t a = 0; a < n[0]; ++a)
      for (index_t b = 0; b < n[1]; ++b)
        for (index_t c = 0; c < n[2]; ++c)
          for (index_t d = 0; d < n[3]; ++d) out(a, b, c, d) = pool(a, b, c, d);
    return out;
  }
  std::vector<float> spread_k, spread_v;  // the pools of spread()

  std::int32_t& table_at(index_t b, index_t j) { return table_store[static_cast<std::size_t>(b * batch.max_pages + j)]; }
  std::int32_t& seqlen(index_t b) { return seqlens_store[static_cast<std::size_t>(b)]; }
  float* o_buffer() { return batch.o.data(); }

  void run(Entry entry, const PagedPlan* plan) {
    switch (entry) {
      case Entry::forward: forward_paged(q, k_cache, v_cache, table, seqlens, o, lse, opts); break;
      case Entry::plan: (void)plan_forward_paged(q, k_cache, v_cache, table, seqlens, o, lse, opts); break;
      case Entry::planned: forward_paged(*plan, q, k_cache, v_cache, table, seqlens, o, lse, opts); break;
    }
  }
};

/// Runs `call`, expecting invalid_argument (budget_error when `budget`) whose parameter()
/// is exactly `parameter`, then checks that nothing was written.
template <class Run>
void expect_rejected(Call& c, Run&& run, const std::string& parameter, bool budget = false) {
  const auto k_pool = c.batch.k_pool, v_pool = c.batch.v_pool;
  const auto q = c.batch.q;
  const auto table = c.table_store, seqlens = c.seqlens_store;
  const auto gapped = c.gapped;
  try {
    run();
    ADD_FAILURE() << "the call was accepted; expected an error naming \"" << parameter << "\"";
  } catch (const budget_error& e) {
    EXPECT_TRUE(budget) << "unexpected budget_error: " << e.what();
    EXPECT_EQ(e.parameter(), parameter) << e.what();
  } catch (const invalid_argument& e) {
    EXPECT_FALSE(budget) << "expected budget_error, got invalid_argument: " << e.what();
    EXPECT_EQ(e.parameter(), parameter) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("tileattn: " + e.parameter() + ": ", 0), 0u) << e.what();
  }
  EXPECT_TRUE(all_sentinel(c.batch.o)) << "O was written before the error";
  EXPECT_TRUE(all_sentinel(c.batch.lse)) << "LSE was written before the error";
  EXPECT_TRUE(same_bits(k_pool, c.batch.k_pool)) << "k_cache changed";
  EXPECT_TRUE(same_bits(v_pool, c.batch.v_pool)) << "v_cache changed";
  EXPECT_TRUE(same_bits(q, c.batch.q)) << "q changed";
  EXPECT_TRUE(same_bits(table, c.table_store)) << "the block table changed";
  EXPECT_TRUE(same_bits(seqlens, c.seqlens_store)) << "cache_seqlens changed";
  EXPECT_TRUE(same_bits(gapped, c.gapped)) << "O (in the gapped buffer) was written before the error";
}

struct BadCase {
  std::string name;
  std::function<void(Call&)> mutate;
  std::string parameter;
  bool budget = false;
  std::string planned_parameter = {};  // what forward_paged(plan, ...) names, when not `parameter`
};

std::vector<BadCase> bad_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      // block table entries the call reads (sequence 0: 20 keys in pages [0, 3); sequence 2:
      // 37 keys in pages [0, 5)), out of the pool
      {"table_entry_negative", [](Call& c) { c.table_at(0, 0) = -1; }, "block_table"},
      {"table_entry_int_min", [](Call& c) { c.table_at(2, 1) = INT_MIN; }, "block_table"},
      {"table_entry_num_pages", [](Call& c) { c.table_at(2, 4) = static_cast<std::int32_t>(c.batch.num_pages); }, "block_table"},
      {"table_last_partial_page", [](Call& c) { c.table_at(0, 2) = static_cast<std::int32_t>(c.batch.num_pages); }, "block_table"},
      {"seqlen_reaches_a_poisoned_padding_page", [](Call& c) { c.seqlen(0) = 25; }, "block_table"},
      {"empty_sequence_grows_into_its_poisoned_row", [](Call& c) { c.seqlen(1) = 1; }, "block_table"},
      // cache_seqlens
      {"seqlen_beyond_the_table", [](Call& c) { c.seqlen(2) = static_cast<std::int32_t>(c.batch.max_pages * 8 + 1); }, "cache_seqlens"},
      {"seqlen_int_max", [](Call& c) { c.seqlen(0) = INT_MAX; }, "cache_seqlens"},
      {"seqlen_negative", [](Call& c) { c.seqlen(1) = -1; }, "cache_seqlens"},
      {"seqlen_int_min", [](Call& c) { c.seqlen(2) = INT_MIN; }, "cache_seqlens"},
      {"seqlens_too_few", [](Call& c) { c.seqlens = c.seqlens.first(2); }, "cache_seqlens"},
      {"seqlens_too_many", [](Call& c) { c.seqlens = {c.seqlens_store.data(), 4}; }, "cache_seqlens"},
      {"seqlens_empty", [](Call& c) { c.seqlens = {}; }, "cache_seqlens"},
      // page pools
      {"page_size_0", [](Call& c) { c.k_cache.shape[1] = c.v_cache.shape[1] = 0; }, "k_cache.shape[1] (page_size)"},
      {"heads_kv_0", [](Call& c) { c.k_cache.shape[2] = c.v_cache.shape[2] = 0; }, "k_cache.shape[2] (heads_kv)"},
      {"pools_num_pages_differ", [](Call& c) { c.v_cache.shape[0] -= 1; }, "v_cache.shape[0] (num_pages)"},
      {"pools_page_size_differs", [](Call& c) { c.v_cache.shape[1] = 4; }, "v_cache.shape[1] (page_size)"},
      {"pools_heads_kv_differ", [](Call& c) { c.v_cache.shape[2] = 1; }, "v_cache.shape[2] (heads_kv)"},
      {"k_cache_head_dim_above_max", [](Call& c) { c.k_cache.shape[3] = max_head_dim + 1; }, "head_dim"},
      // queries and outputs against the pools
      {"heads_q_not_a_multiple_of_heads_kv", [](Call& c) { c.q.shape[2] = c.o.shape[2] = 3; }, "k_cache.shape[2] (heads_kv)"},
      {"q_head_dim_differs_from_k_cache", [](Call& c) { c.q.shape[3] = 8; }, "q.shape[3] (head_dim)"},
      {"o_head_dim_differs_from_v_cache", [](Call& c) { c.o.shape[3] = 8; }, "o.shape[3] (head_dim_v)"},
      {"o_batch", [](Call& c) { c.o.shape[0] = 2; }, "o.shape[0] (batch)"},
      {"o_seqlen", [](Call& c) { c.o.shape[1] = 2; }, "o.shape[1] (seqlen)"},
      {"o_heads", [](Call& c) { c.o.shape[2] = 2; }, "o.shape[2] (heads)"},
      {"q_seqlen_0", [](Call& c) { c.q.shape[1] = c.o.shape[1] = 0; }, "q.shape[1] (seqlen)"},
      {"table_batch_smaller", [](Call& c) { c.table.shape[0] = 2; }, "block_table.shape[0] (batch)"},
      {"table_batch_larger", [](Call& c) { c.q.shape[0] = c.o.shape[0] = c.lse.shape[0] = 2; }, "block_table.shape[0] (batch)"},
      // null data
      {"null_q", [](Call& c) { c.q.data = nullptr; }, "q"},
      {"null_k_cache", [](Call& c) { c.k_cache.data = nullptr; }, "k_cache"},
      {"null_v_cache", [](Call& c) { c.v_cache.data = nullptr; }, "v_cache"},
      {"null_o", [](Call& c) { c.o.data = nullptr; }, "o"},
      {"null_block_table", [](Call& c) { c.table.data = nullptr; }, "block_table"},
      // negative strides
      {"negative_k_cache_page_stride", [](Call& c) { c.k_cache.stride[0] = -c.k_cache.stride[0]; }, "k_cache.stride[0] (num_pages)"},
      {"negative_v_cache_row_stride", [](Call& c) { c.v_cache.stride[1] = -c.v_cache.stride[1]; }, "v_cache.stride[1] (page_size)"},
      {"negative_table_stride", [](Call& c) { c.table.stride[1] = -1; }, "block_table.stride[1] (max_pages)"},
      {"negative_q_head_dim_stride", [](Call& c) { c.q.stride[3] = -1; }, "q.stride[3] (head_dim)"},
      {"negative_o_batch_stride", [](Call& c) { c.o.stride[0] = -c.o.stride[0]; }, "o.stride[0] (batch)"},
      {"negative_lse_stride", [](Call& c) { c.lse.stride[2] = -1; }, "lse.stride[2] (seqlen_q)"},
      // lse shape
      {"lse_batch", [](Call& c) { c.lse.shape[0] = 2; }, "lse.shape[0] (batch)"},
      {"lse_heads", [](Call& c) { c.lse.shape[1] = 2; }, "lse.shape[1] (heads)"},
      {"lse_seqlen", [](Call& c) { c.lse.shape[2] = 4; }, "lse.shape[2] (seqlen_q)"},
      // aliasing: outputs against inputs, each other and themselves
      {"o_is_q", [](Call& c) { c.o.data = const_cast<float*>(c.q.data); }, "o"},
      {"o_inside_k_cache", [](Call& c) { c.o.data = c.batch.k_pool.data() + 5; }, "o"},
      {"o_inside_v_cache", [](Call& c) { c.o.data = c.batch.v_pool.data() + 100; }, "o"},
      {"o_on_block_table", [](Call& c) { c.o.data = reinterpret_cast<float*>(c.table_store.data() + 1); }, "o"},
      {"o_on_cache_seqlens", [](Call& c) { c.o.data = reinterpret_cast<float*>(c.seqlens_store.data()); }, "o"},
      {"o_zero_head_stride", [](Call& c) { c.o.stride[2] = 0; }, "o.stride"},
      {"lse_inside_o", [](Call& c) { c.lse.data = c.o_buffer() + 7; }, "lse"},
      {"lse_on_q", [](Call& c) { c.lse.data = const_cast<float*>(c.q.data); }, "lse"},
      {"lse_on_block_table", [](Call& c) { c.lse.data = reinterpret_cast<float*>(c.table_store.data()); }, "lse"},
      {"lse_on_cache_seqlens", [](Call& c) { c.lse.data = reinterpret_cast<float*>(c.seqlens_store.data() + 2); }, "lse"},
      {"lse_zero_stride", [](Call& c) { c.lse.stride[2] = 0; }, "lse.stride"},
      // inputs read while O is written, inside O's address range (in a gap between rows).
      // The bias is checked; ALiBi slopes and sinks are not (a header gap, reported; the
      // contiguous forward's check_output has the same gap).
      {"o_around_alibi_slopes",
       [](Call& c) {
         c.o = c.gapped_o();
         std::fill_n(c.first_gap(), 4, 0.1f);
         c.opts.alibi_slopes = std::span<const float>(c.first_gap(), 4);
       },
       "o"},
      {"o_around_sinks",
       [](Call& c) {
         c.o = c.gapped_o();
         std::fill_n(c.first_gap(), 4, 0.5f);
         c.opts.sinks = std::span<const float>(c.first_gap(), 4);
       },
       "o"},
      {"o_around_bias",
       [](Call& c) {
         c.o = c.gapped_o();
         std::fill_n(c.first_gap(), 8, 0.0f);  // [1, 1, 3, 37] of zeros, all strides 0: one float
         c.opts.bias = {c.first_gap(), {1, 1, 3, 37}, {0, 0, 0, 0}};
       },
       "o"},
      // options
      {"num_splits_negative", [](Call& c) { c.opts.num_splits = -1; }, "num_splits"},
      {"window_left_below_minus_1", [](Call& c) { c.opts.window_left = -2; }, "window_left"},
      {"window_right_below_minus_1", [](Call& c) { c.opts.window_right = -3; }, "window_right"},
      {"softcap_negative", [](Call& c) { c.opts.softcap = -1.0f; }, "softcap"},
      {"softcap_nan", [=](Call& c) { c.opts.softcap = nan; }, "softcap"},
      {"scale_nan", [=](Call& c) { c.opts.softmax_scale = nan; }, "softmax_scale"},
      {"scale_zero", [](Call& c) { c.opts.softmax_scale = 0.0f; }, "softmax_scale"},
      {"alibi_3_slopes", [](Call& c) { c.slopes.assign(3, 0.1f); c.opts.alibi_slopes = c.slopes; }, "alibi_slopes"},
      {"alibi_13_slopes", [](Call& c) { c.slopes.assign(13, 0.1f); c.opts.alibi_slopes = c.slopes; }, "alibi_slopes"},
      {"alibi_nan_slope", [=](Call& c) { c.slopes.assign(4, nan); c.opts.alibi_slopes = c.slopes; }, "alibi_slopes"},
      {"sinks_3", [](Call& c) { c.sinks.assign(3, 0.5f); c.opts.sinks = c.sinks; }, "sinks"},
      {"sinks_5", [](Call& c) { c.sinks.assign(5, 0.5f); c.opts.sinks = c.sinks; }, "sinks"},
      {"bias_seqlen_k_not_the_longest_sequence",  // [1, 1, 3, 38]: the longest sequence has 37 keys
       [](Call& c) { c.slopes.assign(3 * 38, 0.0f); c.opts.bias = {c.slopes.data(), {1, 1, 3, 38}, {0, 0, 38, 1}}; },
       "bias.shape[3] (seqlen_k)"},
      {"threads_negative", [](Call& c) { c.opts.execution.num_threads = -1; }, "num_threads"},
      {"threads_above_max", [](Call& c) { c.opts.execution.num_threads = max_threads + 1; }, "num_threads"},
      {"budget_above_max", [](Call& c) { c.opts.sram_budget_bytes = max_sram_budget_bytes + 1; }, "sram_budget_bytes"},
      // a budget no tile fits: the planner's budget_error; a plan made before has its tiles
      // already, and the budget is part of what it was made for
      {"budget_64_bytes", [](Call& c) { c.opts.sram_budget_bytes = 64; }, "sram_budget_bytes", true, "plan"},
  };
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class PagedRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(PagedRejects, NamesTheParameterAndWritesNothing) {
  for (Entry entry : {Entry::forward, Entry::plan, Entry::planned}) {
    SCOPED_TRACE(to_string(entry));
    Call c;
    // forward_paged(plan, ...) checks every argument before the plan: the plan is valid.
    const PagedPlan plan = plan_forward_paged(c.q, c.k_cache, c.v_cache, c.table, c.seqlens, c.o, c.lse, c.opts);
    GetParam().mutate(c);
    const BadCase& bad = GetParam();
    if (entry == Entry::planned && !bad.planned_parameter.empty())
      expect_rejected(c, [&] { c.run(entry, &plan); }, bad.planned_parameter);
    else
      expect_rejected(c, [&] { c.run(entry, &plan); }, bad.parameter, bad.budget);
  }
}

INSTANTIATE_TEST_SUITE_P(BadArguments, PagedRejects, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(PagedValidation, TheUnbrokenCallRunsOnEveryEntryPoint) {
  Call c;
  c.run(Entry::forward, nullptr);
  const auto o = c.batch.o;
  const auto lse = c.batch.lse;
  const PagedPlan plan = plan_forward_paged(c.q, c.k_cache, c.v_cache, c.table, c.seqlens, c.o, c.lse, c.opts);
  c.batch.reset_outputs();
  c.run(Entry::planned, &plan);
  EXPECT_TRUE(same_bits(o, c.batch.o));
  EXPECT_TRUE(same_bits(lse, c.batch.lse));
  const Deviation d = c.batch.against_reference(c.opts);
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  EXPECT_LE(d.o, forward_o_tolerance);
  EXPECT_LE(d.lse, forward_lse_tolerance);
}

TEST(PagedValidation, PlanMustMatchTheCall) {
  const auto changes = std::vector<std::pair<std::string, std::function<void(Call&)>>>{
      {"other cache_seqlens", [](Call& c) { c.seqlen(2) = 36; }},
      {"a sequence grown within its pages", [](Call& c) { c.seqlen(0) = 24; }},
      {"other num_splits", [](Call& c) { c.opts.num_splits = 2; }},
      {"causal", [](Call& c) { c.opts.causal = true; }},
      {"top-left alignment", [](Call& c) { c.opts.alignment = MaskAlignment::top_left; }},
      {"window", [](Call& c) { c.opts.window_left = 5; }},
      {"shorter queries", [](Call& c) { c.q.shape[1] = c.o.shape[1] = c.lse.shape[2] = 2; }},
      {"other SRAM budget", [](Call& c) { c.opts.sram_budget_bytes = 200000; }},
      // A plan decides which items read K and V in place, which needs unit head_dim strides.
      {"K's head vectors strided", [](Call& c) { c.k_cache = Call::spread(c.k_cache, c.spread_k); }},
      {"V's head vectors strided", [](Call& c) { c.v_cache = Call::spread(c.v_cache, c.spread_v); }},
  };
  for (const auto& [what, change] : changes) {
    SCOPED_TRACE(what);
    Call c;
    const PagedPlan plan = plan_forward_paged(c.q, c.k_cache, c.v_cache, c.table, c.seqlens, c.o, c.lse, c.opts);
    change(c);
    c.run(Entry::plan, nullptr);  // the changed call itself is valid
    expect_rejected(c, [&] { c.run(Entry::planned, &plan); }, "plan");
  }
}

TEST(PagedValidation, GarbageInUnusedTableEntriesIsNeverRead) {
  for (index_t splits : {1, 3}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    Call c;
    c.opts.num_splits = splits;
    c.run(Entry::forward, nullptr);
    const auto o = c.batch.o;
    const auto lse = c.batch.lse;
    // Past each sequence's pages (sequence 0 uses 3 of 6 columns, 1 none, 2 five).
    for (index_t j = 3; j < c.batch.max_pages; ++j) c.table_at(0, j) = j % 2 ? -1 : INT_MIN;
    for (index_t j = 0; j < c.batch.max_pages; ++j) c.table_at(1, j) = j % 2 ? INT_MAX : -7;
    c.table_at(2, c.batch.max_pages - 1) = static_cast<std::int32_t>(c.batch.num_pages);
    c.batch.reset_outputs();
    c.run(Entry::forward, nullptr);
    EXPECT_TRUE(same_bits(o, c.batch.o));
    EXPECT_TRUE(same_bits(lse, c.batch.lse));
  }
}

// ---- forward_paged_varlen ------------------------------------------------------------------

/// A valid varlen paged call: sequences of 2, 0 and 4 queries (packed, 6 rows) against 20,
/// 5 and 37 keys.
struct VarlenCall {
  static constexpr index_t B = 3, total = 6;
  PagedBatch<float> batch;  // its q and o hold total rows as [1, 6, H, D]
  std::vector<std::int32_t> cu{0, 2, 2, 6};
  const std::int32_t* cu_at = nullptr;  // when set, the call reads cu.size() entries from here
  std::vector<float> gapped;            // an output with gaps between rows (Call::gapped_o)
  PackedView<const float> q;
  TensorView<const float> k_cache, v_cache;
  BlockTableView table;
  PackedView<float> o;
  PackedLseView lse;
  PagedOptions opts;

  VarlenCall() : batch(PagedShape{{20, 5, 37}, 2, 4, 2, 16, 0, 8, 2}, 22) {
    const index_t H = batch.shape.heads_q, D = batch.shape.head_dim;  // 3 x 2 = 6 rows of q and o
    q = make_thd<const float>(batch.q.data(), total, H, D);
    o = make_thd(batch.o.data(), total, H, D);
    lse = make_packed_lse(batch.lse.data(), H, total);
    k_cache = batch.k_cache();
    v_cache = batch.v_cache();
    table = batch.block_table();
  }

  void run() {
    const std::span<const std::int32_t> cu_seqlens_q = cu_at ? std::span(cu_at, cu.size()) : std::span<const std::int32_t>(cu);
    forward_paged_varlen(q, k_cache, v_cache, table, batch.seqlens, o, lse, cu_seqlens_q, opts);
  }

  /// cu_seqlens_q inside the first gap of an output laid out with a gap of 8 floats after
  /// each of its `rows` rows of `row` floats; returns the buffer's start.
  float* cu_in_gap(index_t rows, index_t row) {
    gapped.assign(static_cast<std::size_t>(rows * (row + 8)), sentinel);
    std::memcpy(gapped.data() + row, cu.data(), cu.size() * sizeof(std::int32_t));
    cu_at = reinterpret_cast<const std::int32_t*>(gapped.data() + row);
    return gapped.data();
  }
};

void expect_rejected(VarlenCall& c, const std::string& parameter) {
  const auto k_pool = c.batch.k_pool, v_pool = c.batch.v_pool;
  const auto gapped = c.gapped;
  try {
    c.run();
    ADD_FAILURE() << "forward_paged_varlen accepted the call; expected an error naming \"" << parameter << "\"";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
  }
  EXPECT_TRUE(all_sentinel(c.batch.o)) << "O was written before the error";
  EXPECT_TRUE(all_sentinel(c.batch.lse)) << "LSE was written before the error";
  EXPECT_TRUE(same_bits(k_pool, c.batch.k_pool) && same_bits(v_pool, c.batch.v_pool)) << "a pool changed";
  EXPECT_TRUE(same_bits(gapped, c.gapped)) << "the gapped output or cu_seqlens_q was written";
}

struct VarlenBadCase {
  std::string name;
  std::function<void(VarlenCall&)> mutate;
  std::string parameter;
};

std::vector<VarlenBadCase> varlen_bad_cases() {
  return {
      {"cu_empty", [](VarlenCall& c) { c.cu.clear(); }, "cu_seqlens_q"},
      {"cu_one_entry", [](VarlenCall& c) { c.cu = {0}; }, "cu_seqlens_q"},
      {"cu_decreasing", [](VarlenCall& c) { c.cu = {0, 3, 2, 6}; }, "cu_seqlens_q"},
      {"cu_not_from_0", [](VarlenCall& c) { c.cu = {1, 2, 2, 6}; }, "cu_seqlens_q"},
      {"cu_past_total", [](VarlenCall& c) { c.cu = {0, 2, 2, 7}; }, "cu_seqlens_q"},
      {"cu_negative_start", [](VarlenCall& c) { c.cu = {-1, 2, 2, 6}; }, "cu_seqlens_q"},
      // issue 27, N4: the longest length was computed before the check (INT32_MAX - -2 overflowed)
      {"cu_negative_then_int32_max", [](VarlenCall& c) { c.cu = {0, -2, INT_MAX, 6}; }, "cu_seqlens_q"},
      {"cu_one_sequence_less_than_the_table", [](VarlenCall& c) { c.cu = {0, 2, 6}; }, "block_table.shape[0] (batch)"},
      {"seqlen_beyond_the_table", [](VarlenCall& c) { c.batch.seqlens[1] = 1000; }, "cache_seqlens"},
      {"table_entry_out_of_pool", [](VarlenCall& c) { c.batch.table[0] = -1; }, "block_table"},
      {"num_splits_negative", [](VarlenCall& c) { c.opts.num_splits = -2; }, "num_splits"},
      {"o_is_q", [](VarlenCall& c) { c.o.data = const_cast<float*>(c.q.data); }, "o"},
      {"lse_inside_o", [](VarlenCall& c) { c.lse.data = c.batch.o.data(); }, "lse"},
      // cu_seqlens_q is read while O is written, as cache_seqlens is (which is checked);
      // it is not (a header gap, reported)
      {"o_around_cu_seqlens_q",
       [](VarlenCall& c) {
         const index_t row = c.o.shape[1] * c.o.shape[2];
         c.o = {c.cu_in_gap(c.total, row), c.o.shape, {row + 8, c.o.shape[2], 1}};
       },
       "o"},
      {"lse_around_cu_seqlens_q",
       [](VarlenCall& c) {
         const index_t heads = c.lse.shape[0];
         c.lse = {c.cu_in_gap(heads, c.total), c.lse.shape, {c.total + 8, 1}};
       },
       "lse"},
      {"null_q", [](VarlenCall& c) { c.q.data = nullptr; }, "q"},
      {"null_o", [](VarlenCall& c) { c.o.data = nullptr; }, "o"},
      // The packed views' own extents and strides are named in the packed layout, as
      // forward_varlen's; their match against the caches (head_dim) is checked on the
      // [1, total, heads, head_dim] view they are unpacked to.
      {"o_total", [](VarlenCall& c) { c.o.shape[0] = 5; }, "o.shape[0] (total)"},
      {"q_head_dim", [](VarlenCall& c) { c.q.shape[2] = 8; }, "q.shape[3] (head_dim)"},
      {"negative_q_total_stride", [](VarlenCall& c) { c.q.stride[0] = -c.q.stride[0]; }, "q.stride[0] (total)"},
      {"lse_heads", [](VarlenCall& c) { c.lse.shape[0] = 3; }, "lse.shape[0] (heads)"},
      {"lse_total", [](VarlenCall& c) { c.lse.shape[1] = 5; }, "lse.shape[1] (total_q)"},
  };
}

void PrintTo(const VarlenBadCase& c, std::ostream* os) { *os << c.name; }

class PagedVarlenRejects : public ::testing::TestWithParam<VarlenBadCase> {};

TEST_P(PagedVarlenRejects, NamesTheParameterAndWritesNothing) {
  VarlenCall c;
  GetParam().mutate(c);
  expect_rejected(c, GetParam().parameter);
}

INSTANTIATE_TEST_SUITE_P(BadArguments, PagedVarlenRejects, ::testing::ValuesIn(varlen_bad_cases()),
                         [](const ::testing::TestParamInfo<VarlenBadCase>& info) { return info.param.name; });

TEST(PagedVarlen, EqualsTheFixedLengthCallBitwiseAndAllowsEmptyQuerySets) {
  VarlenCall c;
  c.opts.causal = true;
  // Fixed-length: every sequence has 2 queries (cu = {0, 2, 4, 6}).
  c.cu = {0, 2, 4, 6};
  c.run();
  const auto varlen_o = c.batch.o;
  const auto varlen_lse = c.batch.lse;  // [H, total]
  c.batch.reset_outputs();
  c.batch.run(c.opts);
  EXPECT_TRUE(same_bits(varlen_o, c.batch.o));
  const index_t H = c.batch.shape.heads_q;
  bool lse_equal = true;
  for (index_t b = 0; b < 3; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < 2; ++i)
        lse_equal &= std::memcmp(&varlen_lse[static_cast<std::size_t>(h * 6 + b * 2 + i)],
                                 &c.batch.lse[static_cast<std::size_t>((b * H + h) * 2 + i)], sizeof(float)) == 0;
  EXPECT_TRUE(lse_equal);
  // Every sequence without queries (total_q 0) is valid and writes nothing.
  c.batch.reset_outputs();
  c.cu = {0, 0, 0, 0};
  c.q.shape[0] = c.o.shape[0] = 0;
  c.lse = {};
  EXPECT_NO_THROW(c.run());
  EXPECT_TRUE(all_sentinel(c.batch.o));
}

/// Found by this suite: q and o may have total_q 0, but an LSE of [heads, 0] is rejected
/// ("lse.shape[2] (seqlen_q): must be > 0"), so a caller that wants the LSE must special-case
/// a step without queries.
TEST(PagedVarlen, NoQueriesTakesAnEmptyLse) {
  VarlenCall c;
  c.cu = {0, 0, 0, 0};
  c.q.shape[0] = c.o.shape[0] = 0;
  c.lse = make_packed_lse(c.batch.lse.data(), c.batch.shape.heads_q, 0);
  EXPECT_NO_THROW(c.run());
  EXPECT_TRUE(all_sentinel(c.batch.o));
  EXPECT_TRUE(all_sentinel(c.batch.lse));
}

// ---- Valid edge cases -------------------------------------------------------------------------

bool is_minus_inf(float x) { return std::isinf(x) && x < 0; }

TEST(PagedEdgeCases, EmptyPoolAndNoKeys) {
  const index_t B = 2, Sq = 3, H = 4, Hkv = 2, D = 16, P = 8;
  const float pool_storage[1] = {0.0f};  // a pool of 0 pages still has a data pointer
  const TensorView<const float> k_cache{pool_storage, {0, P, Hkv, D}, {P * Hkv * D, Hkv * D, D, 1}};
  const TensorView<const float> v_cache = k_cache;
  std::vector<float> q(static_cast<std::size_t>(B * Sq * H * D), 0.5f);
  const std::vector<std::int32_t> seqlens(B, 0);
  for (index_t max_pages : {0, 1, 4}) {
    const std::vector<std::int32_t> table(static_cast<std::size_t>(B * std::max<index_t>(max_pages, 1)), -3);  // never read
    for (bool causal : {false, true})
      for (index_t splits : {0, 1, 3}) {
        SCOPED_TRACE("max_pages " + std::to_string(max_pages) + ", causal " + std::to_string(causal) +
                     ", num_splits " + std::to_string(splits));
        std::vector<float> o(q.size(), sentinel), lse(static_cast<std::size_t>(B * H * Sq), sentinel);
        PagedOptions opt;
        opt.causal = causal;
        opt.num_splits = splits;
        forward_paged(make_bshd<const float>(q.data(), B, Sq, H, D), k_cache, v_cache,
                      make_block_table(table.data(), B, max_pages), seqlens, make_bshd(o.data(), B, Sq, H, D),
                      make_lse(lse.data(), B, H, Sq), opt);
        EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; }));
        EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), is_minus_inf));
      }
  }
}

// Issue 27, N4: num_splits = INT64_MAX overflowed in longest + num_splits - 1; it cuts as
// any count above the longest sequence's keys does (one key tile per chunk).
TEST(PagedEdgeCases, NumSplitsInt64Max) {
  PagedBatch<float> batch(PagedShape{{300, 0, 700}, 1, 4, 2, 16, 0, 8, 2}, 23);
  const auto plan = [&](index_t splits) {
    PagedOptions opt;
    opt.num_splits = splits;
    opt.sram_budget_bytes = 24 * 1024;  // key tiles well below 700 keys
    return std::pair{plan_forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), batch.block_table(), batch.seqlens,
                                batch.o_view(), batch.lse_view(), opt), opt};
  };
  const auto [huge, huge_opt] = plan(std::numeric_limits<index_t>::max());
  const auto [many, many_opt] = plan(index_t{1} << 40);
  EXPECT_GT(many.keys_per_split(), 0);
  EXPECT_EQ(huge.keys_per_split(), many.keys_per_split());
  batch.run(huge_opt);
  const auto o = batch.o;
  batch.reset_outputs();
  batch.run(many_opt);
  EXPECT_TRUE(same_bits(o, batch.o));
}

// Issue 27, N4: a pool of no pages may have any page size; (len + page_size - 1) overflowed
// at INT64_MAX. A sequence with keys needs a page the pool does not have.
TEST(PagedEdgeCases, EmptyPoolOfTheLargestPageSize) {
  const index_t B = 2, H = 4, Hkv = 2, D = 16, max = std::numeric_limits<index_t>::max();
  const std::vector<float> storage(static_cast<std::size_t>(Hkv * D), 0.0f);
  const TensorView<const float> pool{storage.data(), {0, max, Hkv, D}, {0, 0, D, 1}};
  std::vector<float> q(static_cast<std::size_t>(B * H * D), 0.5f), o(q.size(), sentinel);
  std::vector<float> lse(static_cast<std::size_t>(B * H), sentinel);
  const std::vector<std::int32_t> table(static_cast<std::size_t>(B), 0);
  const auto run = [&](std::vector<std::int32_t> seqlens, index_t columns) {
    forward_paged(make_bshd<const float>(q.data(), B, 1, H, D), pool, pool,
                  BlockTableView{table.data(), {B, columns}, {columns, 1}}, seqlens, make_bshd(o.data(), B, 1, H, D),
                  make_lse(lse.data(), B, H, 1));
  };
  run({0, 0}, 0);
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), is_minus_inf));
  std::fill(o.begin(), o.end(), sentinel);
  for (const auto& [seqlens, columns, parameter] :
       {std::tuple{std::vector<std::int32_t>{0, 5}, index_t{0}, "cache_seqlens"},
        std::tuple{std::vector<std::int32_t>{INT_MAX, 0}, index_t{0}, "cache_seqlens"},
        std::tuple{std::vector<std::int32_t>{0, 5}, index_t{1}, "block_table"}}) {
    try {
      run(seqlens, columns);
      ADD_FAILURE() << "accepted " << seqlens[0] << ", " << seqlens[1] << " keys";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), parameter) << e.what();
    }
    EXPECT_TRUE(all_sentinel(o));
  }
}

TEST(PagedEdgeCases, NoTableColumnsOnlyWhenEveryLengthIsZero) {
  PagedBatch<float> batch(PagedShape{{0, 0}, 2, 4, 2, 16, 0, 8, 2}, 3);
  const BlockTableView no_columns{batch.table.data(), {2, 0}, {0, 1}};
  forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), no_columns, batch.seqlens, batch.o_view(),
                batch.lse_view());
  EXPECT_TRUE(std::all_of(batch.o.begin(), batch.o.end(), [](float x) { return x == 0.0f; }));
  EXPECT_TRUE(std::all_of(batch.lse.begin(), batch.lse.end(), is_minus_inf));
  batch.reset_outputs();
  batch.seqlens[1] = 1;
  try {
    forward_paged(batch.q_view(), batch.k_cache(), batch.v_cache(), no_columns, batch.seqlens, batch.o_view(),
                  batch.lse_view());
    ADD_FAILURE() << "a key without a table column was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "cache_seqlens");
  }
  EXPECT_TRUE(all_sentinel(batch.o));
  EXPECT_TRUE(all_sentinel(batch.lse));
}

void expect_matches_reference(const PagedBatch<float>& batch, const PagedOptions& opt) {
  const Deviation d = batch.against_reference(opt);
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  EXPECT_LE(d.o, forward_o_tolerance);
  EXPECT_LE(d.lse, forward_lse_tolerance);
}

TEST(PagedEdgeCases, EmptySequencesMixedWithOthers) {
  for (index_t splits : {0, 1, 4}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedBatch<float> batch(PagedShape{{0, 50, 0, 7, 1, 0}, 2, 6, 3, 24, 0, 4, 3}, 5);
    PagedOptions opt;
    opt.num_splits = splits;
    batch.run(opt);
    expect_matches_reference(batch, opt);
    for (index_t b : {0, 2, 5}) {
      const auto o = batch.o_of(b);
      const auto lse = batch.lse_of(b);
      EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; })) << "sequence " << b;
      EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), is_minus_inf)) << "sequence " << b;
    }
  }
}

TEST(PagedEdgeCases, MoreQueriesThanKeysWithCausal) {
  // Bottom-right causal: with 3 keys and 6 queries the first 3 queries see nothing.
  for (index_t splits : {0, 1, 2}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedBatch<float> batch(PagedShape{{3, 10, 0}, 6, 4, 2, 16, 0, 2, 1}, 6);
    PagedOptions opt;
    opt.causal = true;
    opt.num_splits = splits;
    batch.run(opt);
    expect_matches_reference(batch, opt);
    const auto lse = batch.lse_of(0);  // [heads, q_len]
    const auto o = batch.o_of(0);      // [q_len, heads, d]
    for (index_t h = 0; h < 4; ++h)
      for (index_t i = 0; i < 6; ++i) {
        EXPECT_EQ(is_minus_inf(lse[static_cast<std::size_t>(h * 6 + i)]), i < 3) << "head " << h << " query " << i;
        if (i < 3) {
          for (index_t c = 0; c < 16; ++c) EXPECT_EQ(o[static_cast<std::size_t>((i * 4 + h) * 16 + c)], 0.0f);
        }
      }
  }
}

TEST(PagedEdgeCases, PageSizeOne) {
  for (index_t splits : {0, 1, 3}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    PagedBatch<float> batch(PagedShape{{1, 5, 33, 0}, 3, 4, 1, 17, 0, 1, 4}, 7);
    PagedOptions opt;
    opt.causal = true;
    opt.num_splits = splits;
    batch.run(opt);
    expect_matches_reference(batch, opt);
  }
}

// ---- bf16 / fp16 against the contiguous forward --------------------------------------------

template <class T>
class PagedHalf : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(PagedHalf, HalfTypes);

TYPED_TEST(PagedHalf, UnsplitIsTheContiguousForwardBitwise) {
  using T = TypeParam;
  const PagedShape s{{300, 0, 77, 1}, 3, 8, 2, 64, 0, 16, 2};
  PagedBatch<T> batch(s, 8);
  PagedOptions opt;
  opt.causal = true;
  opt.num_splits = 1;
  batch.run(opt);
  // The same K/V, packed contiguously per sequence, through forward_varlen.
  std::vector<T> k_all, v_all;
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (index_t b = 0; b < s.batch(); ++b) {
    const auto bs = static_cast<std::size_t>(b);
    k_all.insert(k_all.end(), batch.k_seq[bs].begin(), batch.k_seq[bs].end());
    v_all.insert(v_all.end(), batch.v_seq[bs].begin(), batch.v_seq[bs].end());
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(s.q_len));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(s.k_lens[bs]));
  }
  std::vector<T> o(batch.o.size(), T(sentinel));
  std::vector<float> lse(batch.lse.size(), sentinel);  // [H, total_q]
  forward_varlen(make_thd<const T>(batch.q.data(), cu_q.back(), s.heads_q, s.head_dim),
                 make_thd<const T>(k_all.data(), cu_k.back(), s.heads_kv, s.head_dim),
                 make_thd<const T>(v_all.data(), cu_k.back(), s.heads_kv, s.head_dim),
                 make_thd(o.data(), cu_q.back(), s.heads_q, s.head_dim),
                 make_packed_lse(lse.data(), s.heads_q, cu_q.back()),
                 VarlenSequences{cu_q, cu_k, s.q_len, batch.max_k}, opt);
  EXPECT_TRUE(same_bits(o, batch.o));
  std::size_t lse_differ = 0;
  for (index_t b = 0; b < s.batch(); ++b)
    for (index_t h = 0; h < s.heads_q; ++h)
      for (index_t i = 0; i < s.q_len; ++i)
        lse_differ += std::memcmp(&lse[static_cast<std::size_t>(h * cu_q.back() + b * s.q_len + i)],
                                  &batch.lse[static_cast<std::size_t>((b * s.heads_q + h) * s.q_len + i)],
                                  sizeof(float)) != 0;
  EXPECT_EQ(lse_differ, 0u);
  // Split: the same within a few ulps of T.
  const std::vector<T> unsplit = batch.o;
  const double ulp = std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10;  // T's machine epsilon
  for (index_t splits : {0, 2, 5}) {
    opt.num_splits = splits;
    batch.reset_outputs();
    batch.run(opt);
    double worst = 0.0;
    for (std::size_t i = 0; i < o.size(); ++i) {
      const double a = to_float(batch.o[i]), b = to_float(unsplit[i]);
      worst = std::max(worst, std::abs(a - b) / std::max(std::abs(b), 1.0));
    }
    EXPECT_LE(worst, 2 * ulp) << "num_splits " << splits;
  }
}

}  // namespace
}  // namespace tileattn::test
