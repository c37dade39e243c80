// tileattn/topk.hpp: top-k sparse attention over a paged KV cache (DeepSeek V3.2's sparse
// attention, FlashMLA's sparse decode, FlashAttention-4's topk_gather_kv): each query row
// attends only to the keys an indexer selected for it, read through the block table.
//
//   // topk_indices [batch, seqlen_q, topk] int32: query (b, i)'s keys as cache positions
//   // of sequence b, -1 for none; shared by all the heads of the row.
//   tileattn::forward_paged_topk(q, k_pool, v_pool, table, seqlens,
//                                tileattn::make_topk_indices(idx, B, 1, 2048), o, lse);
//
// Semantics: forward_paged()'s, with query row (b, i)'s keys those its topk_indices row
// lists, each at its own cache position (what a dense call over the whole sequence with a
// mask keeping exactly those keys computes):
//  - -1 is padding (no key), as FlashMLA and DeepSeek use it, so topk may exceed a
//    sequence's length; any other entry must be a key of the sequence, in
//    [0, cache_seqlens[b]), else invalid_argument names topk_indices. A row whose entries
//    are all -1 (or all masked) sees no key: O = 0, LSE = -inf, as a dense masked row.
//  - A duplicate is attended twice, as a gather reads it (FlashMLA): its weight doubles.
//  - causal, the sliding window and attention_chunk keep their dense meaning at the keys'
//    original positions: a selected key the row could not see densely is dropped (masked).
//    softcap, sinks, softmax_scale, 8-bit caches with their per-page scales, split-KV,
//    batch_invariant and LSE work as in forward_paged. ALiBi, bias, mask and rotary are
//    rejected (naming the option): they need the key's place in a dense row.
//  - Deterministic: the same bits for every backend and thread count (and, the split-KV
//    chunking depending on the lists' lengths only, for every tiling of the batch).
// Prefix-once attention does not apply (PagedOptions::shared_prefix is ignored).
//
// Plan and run (paged.hpp's split): plan_forward_paged_topk(_varlen) takes the call's
// arguments up to the options and returns the plan forward_paged_topk(_varlen)(plan, ...)
// reuses, checked against the call. A plan depends on how many keys each row keeps (its
// entries that are not -1 and that causal, the window and the chunk leave), not on which:
// one plan serves the layers of a step whose rows keep as many keys each.
//
// How: the selected keys of one row form a compact list (indices checked, -1 and masked
// keys dropped: O(batch x seqlen_q x topk) ints, the size of topk_indices). Each query
// row becomes one sequence of a varlen paged call whose keys are its list, read by the
// forward loop through a gathered K/V source (kernels/gathered_kv.hpp): the loop, tile
// loads (which count exactly the selected rows' bytes), split-KV and merges are
// forward_paged's. A work item is one query row x one K/V group's heads, since rows of one
// sequence select different keys (seqlen_q > 1: verify, chunked prefill).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "tileattn/detail/topk_checks.hpp"
#include "tileattn/kernels/gathered_kv.hpp"
#include "tileattn/paged.hpp"

namespace tileattn {

/// topk_indices: [batch, seqlen_q, topk] int32 cache positions (-1: none), any non-negative strides.
using TopkIndicesView = StridedView<const std::int32_t, 3>;
/// The varlen form: [total_q, topk], row r for packed query row r.
using PackedTopkIndicesView = StridedView<const std::int32_t, 2>;

inline TopkIndicesView make_topk_indices(const std::int32_t* data, index_t batch, index_t seqlen_q, index_t topk) {
  return {data, {batch, seqlen_q, topk}, {seqlen_q * topk, topk, 1}};
}
inline PackedTopkIndicesView make_packed_topk_indices(const std::int32_t* data, index_t total_q, index_t topk) {
  return {data, {total_q, topk}, {topk, 1}};
}

namespace detail {

/// forward_paged_topk's element types: forward_paged's but for 4-bit blocks, which it does not take
/// yet. Returns whether they are.
template <class Q, class K, class V, class O>
constexpr bool check_topk_element_types() {
  if constexpr (block_pool_type<std::remove_const_t<K>>) {
    static_assert(!block_pool_type<std::remove_const_t<K>>,
                  "tileattn: forward_paged_topk takes float, bf16, fp16 or 8-bit K/V pools; 4-bit ones (q4_0_block, mxfp4_block, nvfp4_block) are not supported yet");
    return false;
  } else {
    return check_element_types<Q, K, V, O>();
  }
}

/// A [batch, seqlen, ...] view's first two dimensions as one of batch x seqlen rows (the
/// leading extent 1), where the strides allow it.
template <class T>
std::optional<TensorView<T>> as_rows(const TensorView<T>& v) {
  index_t stride = v.stride[1];
  if (v.shape[1] == 1) stride = v.stride[0];
  else if (v.shape[0] != 1 && v.stride[0] != v.shape[1] * v.stride[1]) return std::nullopt;
  return TensorView<T>{v.data, {1, v.shape[0] * v.shape[1], v.shape[2], v.shape[3]}, {0, stride, v.stride[2], v.stride[3]}};
}
/// The same for an LSE [batch, heads, seqlen_q]: [1, heads, batch x seqlen_q].
inline std::optional<LseView> as_rows(const LseView& v) {
  index_t stride = v.stride[2];
  if (v.shape[2] == 1) stride = v.stride[0];
  else if (v.shape[0] != 1 && v.stride[0] != v.shape[2] * v.stride[2]) return std::nullopt;
  return LseView{v.data, {1, v.shape[1], v.shape[0] * v.shape[2]}, {0, v.stride[1], stride}};
}

/// Copies a [B, S, H, D] view (or a [B, H, S] LSE) element by element.
template <class A, class B>
void copy_elements(const TensorView<A>& from, const TensorView<B>& to) {
  for (index_t b = 0; b < from.shape[0]; ++b)
    for (index_t i = 0; i < from.shape[1]; ++i)
      for (index_t h = 0; h < from.shape[2]; ++h)
        for (index_t c = 0; c < from.shape[3]; ++c) to(b, i, h, c) = from(b, i, h, c);
}

/// p, the checked params of a top-k call, as its run reads them: each query row of `rows`
/// one sequence of a varlen call whose keys are the row's kept list (the run points
/// p.gathered at them), the causal mask, window and chunk already applied to the lists.
template <class T, class KV>
ForwardParams<T, KV> rows_params(ForwardParams<T, KV> p, const TopkRows& rows) {
  ScoreOptions positionless;  // causal, window and chunk were applied to the lists
  positionless.softcap = p.softcap;
  positionless.sinks = p.sinks;
  static_cast<ScoreOptions&>(p) = positionless;
  p.cu_seqlens_q = rows.cu_rows.data();
  p.num_sequences = rows.rows();
  p.cache_seqlens = rows.counts.data();
  return p;
}

/// The plan of the top-k call of checked params p over `rows`: forward_paged's planner over
/// the rows as sequences, so it depends on the lists' lengths, not on which keys they hold.
template <class T, class KV>
PagedPlan topk_plan(const ForwardParams<T, KV>& p, const TopkRows& rows, const PagedOptions& options) {
  return kernels::make_paged_plan_scored(rows_params(p, rows), rows.rows() > 0 ? 1 : 0, rows.longest, options,
                                         ops::BuiltinScores{});
}

/// Runs the top-k call of p (checked; q, o and lse as [1, rows, ...] views of the rows of
/// `rows`) on `plan` (topk_plan's; checked against the call when the caller gave it): the
/// rows as sequences of a varlen call over their gathered keys.
template <class T, class KV>
void run_topk(const ForwardParams<T, KV>& call, const TopkRows& rows, const PagedPlan& plan,
              const PagedOptions& options, PlanOrigin origin) {
  ForwardParams<T, KV> p = rows_params(call, rows);
  const ops::BuiltinScores scores;
  if (origin == PlanOrigin::caller) kernels::check_paged_plan(p, plan, options, scores.key_tile_limit(), false);
  if (rows.rows() == 0) return;  // (planned all the same: a budget that fits no tile throws, as forward_paged's)
  const GatheredKeys keys = rows.keys();
  p.gathered = &keys;
  const std::vector<float> accum = partial_states_for(p, plan);
  if (options.io_counts) {
    *options.io_counts = kernels::run_forward<CountingIo, kernels::GatheredPagedKv>(p, plan.tiles(), plan.work(),
                                                                                   options.execution, scores);
  } else {
    kernels::run_forward<NoIoCounting, kernels::GatheredPagedKv>(p, plan.tiles(), plan.work(), options.execution,
                                                                 scores);
  }
}

/// forward_paged_topk of checked params p (fixed-length queries) on `plan` (run_topk's): the
/// rows of p's views as one [1, batch x seqlen_q] batch, staged through packed copies where
/// their strides cannot be read so (copies outside the IO counters).
template <class T, class KV>
void run_topk_rows(ForwardParams<T, KV> p, const TopkRows& rows, const PagedPlan& plan, const PagedOptions& options,
                   PlanOrigin origin) {
  const TensorView<const T> q = p.q;
  const TensorView<T> o = p.o;
  const LseView lse = p.lse;
  const index_t B = q.shape[0], S = q.shape[1], H = q.shape[2];
  std::vector<T> q_stage, o_stage;
  std::vector<float> lse_stage;
  if (auto rows_q = as_rows(q)) {
    p.q = *rows_q;
  } else {
    q_stage.resize(static_cast<std::size_t>(B * S * H * q.shape[3]));
    copy_elements(q, make_bshd(q_stage.data(), B, S, H, q.shape[3]));
    p.q = make_bshd<const T>(q_stage.data(), 1, B * S, H, q.shape[3]);
  }
  const auto rows_o = as_rows(o);
  if (rows_o) {
    p.o = *rows_o;
  } else {
    o_stage.resize(static_cast<std::size_t>(B * S * H * o.shape[3]));
    p.o = make_bshd(o_stage.data(), 1, B * S, H, o.shape[3]);
  }
  const auto rows_lse = lse.data ? as_rows(lse) : std::optional<LseView>{LseView{}};
  if (rows_lse) {
    p.lse = *rows_lse;
  } else {
    lse_stage.resize(static_cast<std::size_t>(B * S * H));
    p.lse = LseView{lse_stage.data(), {1, H, B * S}, {0, B * S, 1}};  // [1, heads, rows]
  }
  run_topk(p, rows, plan, options, origin);
  if (!rows_o) copy_elements(make_bshd<const T>(o_stage.data(), B, S, H, o.shape[3]), o);
  if (!rows_lse)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < S; ++i) lse(b, h, i) = lse_stage[static_cast<std::size_t>(h * B * S + b * S + i)];
}

/// The checks of a top-k call beyond its paged call's (p: that call's checked params):
/// topk_indices [batch, seqlen_q, topk] (packed: [1, total_q, topk]) against the queries and
/// apart from the outputs, each entry in range; returns the rows it selects.
template <class T, class KV>
TopkRows checked_topk_rows(const ForwardParams<T, KV>& p, const StridedView<const std::int32_t, 3>& topk_indices,
                           index_t batch, index_t seqlen_q) {
  check_topk_shape(topk_indices, batch, seqlen_q);
  check_topk_apart(p, topk_indices);
  return topk_rows(p, topk_indices);
}

/// A top-k call's checked params and the rows its lists select.
template <class T, class KV>
struct TopkCall {
  ForwardParams<T, KV> params;
  TopkRows rows;
};

/// Every check of forward_paged_topk (and of its plan): the options, the paged call's
/// arguments, topk_indices [batch, seqlen_q, topk].
template <class T, class KV, class Q, class K, class V, class O>
TopkCall<T, KV> topk_call(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                          BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                          TopkIndicesView topk_indices, const TensorView<O>& o, LseView lse,
                          const PagedOptions& options) {
  check_topk_options(options);
  const auto call = paged_call<T, KV>(q, {}, k_cache, v_cache, block_table, cache_seqlens, o, lse, options);
  TopkRows rows = checked_topk_rows(call.params, topk_indices, q.shape[dim::batch], q.shape[dim::seqlen]);
  return {call.params, std::move(rows)};
}

/// Every check of forward_paged_topk_varlen (and of its plan): topk_indices [total_q, topk].
template <class T, class KV, class Q, class K, class V, class O>
TopkCall<T, KV> topk_varlen_call(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                                 BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                                 PackedTopkIndicesView topk_indices, const PackedView<O>& o, PackedLseView lse,
                                 std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options) {
  check_topk_options(options);
  const auto call =
      paged_varlen_call<T, KV>(q, cu_seqlens_q, k_cache, v_cache, block_table, cache_seqlens, o, lse, options);
  TopkRows rows = checked_topk_rows(call.params, topk_indices.with_leading(), 1, q.shape[0]);
  return {call.params, std::move(rows)};
}

}  // namespace detail

/// forward_paged(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, options) with
/// query row (b, i) attending only the keys topk_indices[b, i, :] lists (cache positions of
/// sequence b, -1 for none; the file comment gives the semantics). Every argument is checked
/// first: a bad one throws tileattn::invalid_argument naming it, and nothing is written.
template <class Q, class K, class V, class O>
void forward_paged_topk(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                        BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                        TopkIndicesView topk_indices, const TensorView<O>& o, LseView lse,
                        const PagedOptions& options = {}) {
  if constexpr (detail::check_topk_element_types<Q, K, V, O>()) {
    const auto [params, rows] = detail::topk_call<O, std::remove_const_t<K>>(
        q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, options);
    detail::run_topk_rows(params, rows, detail::topk_plan(params, rows, options), options,
                          detail::PlanOrigin::this_call);
  }
}

/// forward_paged_topk() without the log-sum-exp output.
template <class Q, class K, class V, class O>
void forward_paged_topk(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                        BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                        TopkIndicesView topk_indices, const TensorView<O>& o, const PagedOptions& options = {}) {
  forward_paged_topk(q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, LseView{}, options);
}

/// The plan forward_paged_topk(q, k_cache, v_cache, block_table, cache_seqlens, topk_indices,
/// ...) makes, for reuse across calls (the layers of a step) whose rows keep as many keys
/// each: it depends on each row's count of kept keys (entries not -1 that the causal mask,
/// window and chunk leave), not on which keys. Checks every argument as the call would;
/// reads topk_indices, cache_seqlens and the block table, not the data.
template <class Q, class K, class V, class O>
PagedPlan plan_forward_paged_topk(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                                  BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                                  TopkIndicesView topk_indices, const TensorView<O>& o, LseView lse,
                                  const PagedOptions& options = {}) {
  detail::check_topk_element_types<Q, K, V, O>();
  const auto [params, rows] = detail::topk_call<O, std::remove_const_t<K>>(
      q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, options);
  return detail::topk_plan(params, rows, options);
}

/// forward_paged_topk with a plan from plan_forward_paged_topk (checked against the call).
template <class Q, class K, class V, class O>
void forward_paged_topk(const PagedPlan& plan, const TensorView<Q>& q, const TensorView<K>& k_cache,
                        const TensorView<V>& v_cache, BlockTableView block_table,
                        std::span<const std::int32_t> cache_seqlens, TopkIndicesView topk_indices,
                        const TensorView<O>& o, LseView lse, const PagedOptions& options = {}) {
  if constexpr (detail::check_topk_element_types<Q, K, V, O>()) {
    const auto [params, rows] = detail::topk_call<O, std::remove_const_t<K>>(
        q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, options);
    detail::run_topk_rows(params, rows, plan, options, detail::PlanOrigin::caller);
  }
}

/// forward_paged_varlen() with packed query row r attending only the keys topk_indices[r, :]
/// lists (cache positions of its sequence, -1 for none): q and o [total_q, heads, dim],
/// lse [heads_q, total_q] (optional: PackedLseView{}), topk_indices [total_q, topk].
template <class Q, class K, class V, class O>
void forward_paged_topk_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                               BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                               PackedTopkIndicesView topk_indices, const PackedView<O>& o, PackedLseView lse,
                               std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  if constexpr (detail::check_topk_element_types<Q, K, V, O>()) {
    const auto [params, rows] = detail::topk_varlen_call<O, std::remove_const_t<K>>(
        q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, cu_seqlens_q, options);
    detail::run_topk(params, rows, detail::topk_plan(params, rows, options), options, detail::PlanOrigin::this_call);
  }
}

/// The plan forward_paged_topk_varlen makes (plan_forward_paged_topk's, for packed queries).
template <class Q, class K, class V, class O>
PagedPlan plan_forward_paged_topk_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache,
                                         const TensorView<V>& v_cache, BlockTableView block_table,
                                         std::span<const std::int32_t> cache_seqlens,
                                         PackedTopkIndicesView topk_indices, const PackedView<O>& o, PackedLseView lse,
                                         std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  detail::check_topk_element_types<Q, K, V, O>();
  const auto [params, rows] = detail::topk_varlen_call<O, std::remove_const_t<K>>(
      q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, cu_seqlens_q, options);
  return detail::topk_plan(params, rows, options);
}

/// forward_paged_topk_varlen with a plan from plan_forward_paged_topk_varlen (checked against
/// the call).
template <class Q, class K, class V, class O>
void forward_paged_topk_varlen(const PagedPlan& plan, const PackedView<Q>& q, const TensorView<K>& k_cache,
                               const TensorView<V>& v_cache, BlockTableView block_table,
                               std::span<const std::int32_t> cache_seqlens, PackedTopkIndicesView topk_indices,
                               const PackedView<O>& o, PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                               const PagedOptions& options = {}) {
  if constexpr (detail::check_topk_element_types<Q, K, V, O>()) {
    const auto [params, rows] = detail::topk_varlen_call<O, std::remove_const_t<K>>(
        q, k_cache, v_cache, block_table, cache_seqlens, topk_indices, o, lse, cu_seqlens_q, options);
    detail::run_topk(params, rows, plan, options, detail::PlanOrigin::caller);
  }
}

}  // namespace tileattn
