// tileattn/paged.hpp: attention over a paged KV cache (FlashAttention's
// flash_attn_with_kvcache with a block_table; vLLM's PagedAttention), its plan/run split,
// and merge_states (merge_states.hpp), which combines partial results over disjoint keys.
//
//   // K/V pools [num_pages, page_size, heads_kv, head_dim]; block_table [batch, max_pages];
//   // cache_seqlens[b] keys in sequence b, the new tokens included.
//   tileattn::forward_paged(tileattn::make_bshd(q, B, 1, Hq, D),        // one token: decoding
//                           k_pool, v_pool, table, seqlens,
//                           tileattn::make_bshd(o, B, 1, Hq, D), tileattn::make_lse(lse, B, Hq, 1));
//
// Semantics are forward()'s with sequence b's keys read through its block table: seqlen_q
// > 1 (chunked prefill, speculative verify) is causal bottom-right aligned per sequence
// when options.causal; window, ALiBi, softcap, sinks, bias and mask as in the forward (a
// bias or mask is [B or 1, H or 1, seqlen_q, max cache_seqlens]). GQA reads each K/V page
// once per group of query heads. Split-KV (flash-decoding): when the batch has too few
// (sequence, K/V head) pairs to occupy many workers, long sequences are cut into key chunks
// whose partial results are merged exactly; the chunking depends on the batch's shape only,
// so every thread count gives the same bits (PagedOptions::num_splits chooses it), and in
// batch-invariant mode on each sequence's own length only (ForwardOptions::batch_invariant).
//
// Prefix-once attention (FlashInfer's cascade): sequences whose block tables start with the
// same pages (KvCache::fork, share_prefix) have those keys attended once per group, with
// all the members' query rows in one product, and merged exactly with each sequence's own
// keys (kernels/shared_prefix.hpp). The plan finds the groups from the table's page ids
// (PagedOptions::shared_prefix, shared_prefix_min_keys).
//
// A PagedPlan (plan_forward_paged) holds the tile plan, the chunking and the work list of a batch
// shape; forward_paged(plan, ...) reuses it, e.g. across the layers of one decode step. The
// planner is kernels/paged_plan.hpp's; this header checks the calls, plans and runs them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tileattn/detail/paged_checks.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/kernels/forward.hpp"
#include "tileattn/kernels/merge.hpp"
#include "tileattn/kernels/paged_plan.hpp"
#include "tileattn/kernels/shared_prefix.hpp"
#include "tileattn/merge_states.hpp"
#include "tileattn/ops/hadamard.hpp"
#include "tileattn/kernels/work_list.hpp"

namespace tileattn {

/// block_table: [batch, max_pages_per_sequence] page ids (int32), any non-negative strides.
using BlockTableView = StridedView<const std::int32_t, 2>;

inline BlockTableView make_block_table(const std::int32_t* data, index_t batch, index_t max_pages) {
  return {data, {batch, max_pages}, {max_pages, 1}};
}

namespace detail {

/// forward_paged's element types: check_element_types', or K and V in a 4-bit block type,
/// plain or hadamard_rotated (core/block_quantized_types.hpp), which only the paged kernels
/// read. Returns whether they are.
template <class Q, class K, class V, class O>
constexpr bool check_paged_element_types() {
  using KV = std::remove_const_t<K>;
  if constexpr (block_pool_type<KV>) {
    using T = std::remove_const_t<Q>;
    static_assert(storage_type<T>, "tileattn: Q and O must hold float, tileattn::bf16 or tileattn::fp16");
    static_assert(std::is_same_v<T, O>, "tileattn: O must have Q's element type (and must not be const)");
    static_assert(std::is_same_v<KV, std::remove_const_t<V>>, "tileattn: K and V must have the same element type");
    return storage_type<T> && std::is_same_v<T, O> && std::is_same_v<KV, std::remove_const_t<V>>;
  } else {
    return check_element_types<Q, K, V, O>();
  }
}

/// Whether a run checks its plan against the call: a plan the caller passed in must have been
/// made for this call (kernels::check_paged_plan); one the call made itself was, and is not
/// checked again (one signature per call).
enum class PlanOrigin { caller, this_call };

/// Points p at a buffer of the plan's partial states (split-KV chunks, prefix-once), which
/// it returns: the buffer must outlive the run.
template <class T, class KV>
std::vector<float> partial_states_for(ForwardParams<T, KV>& p, const PagedPlan& plan) {
  std::vector<float> accum(static_cast<std::size_t>(plan.partial_rows() * (p.head_dim_v() + 2)));
  p.o_accum = accum.data();
  p.max_accum = p.o_accum + plan.partial_rows() * p.head_dim_v();
  p.sum_accum = p.max_accum + plan.partial_rows();
  return accum;
}

/// Runs a checked paged call on `plan` with the score modifiers of `scores` (no prefix-once
/// groups: a flex or top-k call, or a built-in one whose plan has none).
template <class T, class KV, class Scores>
void run_paged_scored(ForwardParams<T, KV> p, const PagedPlan& plan, const PagedOptions& options,
                      const Scores& scores, PlanOrigin origin) {
  if (origin == PlanOrigin::caller) kernels::check_paged_plan(p, plan, options, scores.key_tile_limit(), false);
  const std::vector<float> accum = partial_states_for(p, plan);
  const auto& work = plan.work();
  if (options.io_counts) {
    *options.io_counts =
        kernels::run_forward<CountingIo, kernels::PagedKv>(p, plan.tiles(), work, options.execution, scores);
  } else {
    kernels::run_forward<NoIoCounting, kernels::PagedKv>(p, plan.tiles(), work, options.execution, scores);
  }
}

/// A built-in call: run_paged_scored's, or with prefix-once groups the prefix pass and the
/// batch's items together (kernels::run_shared_prefix), after the same checks.
template <class T, class KV>
void run_paged(ForwardParams<T, KV> p, const PagedPlan& plan, const PagedOptions& options, PlanOrigin origin) {
  const kernels::SharedPrefixPlan* shared = plan.shared_prefix();
  if (!shared) return run_paged_scored(std::move(p), plan, options, ops::BuiltinScores{}, origin);
  if (origin == PlanOrigin::caller)
    kernels::check_paged_plan(p, plan, options, ops::BuiltinScores{}.key_tile_limit(), true);
  const std::vector<float> accum = partial_states_for(p, plan);
  if (options.io_counts) {
    *options.io_counts = kernels::run_shared_prefix<CountingIo>(p, plan.tiles(), plan.work(), *shared, options.execution);
  } else {
    kernels::run_shared_prefix<NoIoCounting>(p, plan.tiles(), plan.work(), *shared, options.execution);
  }
}

/// Checks a paged call and resolves its params; returns {params, longest q, longest k}.
template <class T, class KV>
struct PagedCall {
  ForwardParams<T, KV> params;
  index_t longest_q = 0, longest_k = 0;
};

template <class T, class KV>
PagedCall<T, KV> paged_call(TensorView<const T> q, std::span<const std::int32_t> cu_seqlens_q,
                        TensorView<const KV> k_cache, TensorView<const KV> v_cache, BlockTableView block_table,
                        std::span<const std::int32_t> cache_seqlens, TensorView<T> o, LseView lse,
                        const PagedOptions& options) {
  const bool varlen = !cu_seqlens_q.empty();
  check_page_pools(k_cache, v_cache);
  check_paged_queries(q, o, k_cache, v_cache, varlen);
  TILEATTN_REQUIRE(options.num_splits >= 0, "num_splits", "must be >= 0 (0: automatic), got " + std::to_string(options.num_splits));
  TILEATTN_REQUIRE(options.shared_prefix_min_keys >= 1, "shared_prefix_min_keys",
                   "must be >= 1, got " + std::to_string(options.shared_prefix_min_keys));
  TILEATTN_REQUIRE(!options.batch_invariant || options.num_splits <= 1, "num_splits",
                   "must be 0 or 1 with batch_invariant (n > 1 chunks by the batch's longest sequence), got " +
                       std::to_string(options.num_splits));
  PagedCall<T, KV> call{make_params(q, k_cache, v_cache, o, lse, options)};
  ForwardParams<T, KV>& p = call.params;
  index_t batch = q.shape[dim::batch];
  call.longest_q = q.shape[dim::seqlen];
  if (varlen) {
    batch = static_cast<index_t>(cu_seqlens_q.size()) - 1;
    TILEATTN_REQUIRE(batch >= 1, "cu_seqlens_q", "needs at least 2 entries (batch >= 1)");
    call.longest_q =
        check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", batch, q.shape[dim::seqlen], q.shape[dim::seqlen], "cu_seqlens_q");
    p.cu_seqlens_q = cu_seqlens_q.data();
    p.num_sequences = batch;  // the packed LSE was checked by paged_varlen_call
  } else {
    check_lse(lse, {batch, q.shape[dim::heads], q.shape[dim::seqlen]}, lse_dims);
  }
  call.longest_k = check_block_table(block_table, cache_seqlens, batch, k_cache.shape[dim::batch],
                                     k_cache.shape[dim::seqlen]);
  p.block_table = block_table;
  p.cache_seqlens = cache_seqlens.data();
  check_call(p, options, "num_pages", k_cache.shape[dim::batch], batch, call.longest_q, call.longest_k);
  return call;
}

/// The element type the kernels read from pools of K: hadamard_rotated<B>'s B, else K's own.
template <class K>
using kernel_kv_t = stored_block_t<std::remove_const_t<K>>;

/// A pool as the kernels read it: pools of hadamard_rotated<B> as the B they store.
template <class K>
TensorView<const kernel_kv_t<K>> kernel_pool(const TensorView<K>& pool) {
  return reinterpret_view<kernel_kv_t<K>>(TensorView<const K>(pool));
}

/// A call over pools of K, checked (paged_call, or `varlen_call` for packed queries): over
/// pools of hadamard_rotated<B> the pools' head dims must be powers of two, and the kernels
/// rotate Q as it loads and O as it stores (p.hadamard). The rotation comes from the pools'
/// type alone: no option can contradict it.
template <class K, class T>
PagedCall<T, kernel_kv_t<K>> pool_typed_call(PagedCall<T, kernel_kv_t<K>> call) {
  if constexpr (is_hadamard_rotated<std::remove_const_t<K>>) {
    for (const auto& [d, name] : {std::pair{call.params.head_dim(), "k_cache"}, std::pair{call.params.head_dim_v(), "v_cache"}})
      TILEATTN_REQUIRE(ops::hadamard_length(d), name,
                       std::string("holds ") + kv_type_name<std::remove_const_t<K>>() +
                           " blocks, whose rows need a power-of-two head dim, got " + std::to_string(d));
    call.params.hadamard = true;
  }
  return call;
}

}  // namespace detail

/// The plan forward_paged(q, k_cache, v_cache, block_table, cache_seqlens, ...) makes for
/// this batch (checks every argument as the call would; the data are not read).
template <class Q, class K, class V, class O>
PagedPlan plan_forward_paged(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                             BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                             const TensorView<O>& o, LseView lse, const PagedOptions& options = {}) {
  detail::check_paged_element_types<Q, K, V, O>();
  const auto call = detail::pool_typed_call<K>(detail::paged_call<O, detail::kernel_kv_t<K>>(
        q, {}, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table, cache_seqlens,
        o, lse, options));
  return kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
}

/// forward() of q [batch, seqlen_q, heads_q, head_dim] against the paged K/V of each
/// sequence: k_cache, v_cache [num_pages, page_size, heads_kv, head_dim(_v)], sequence b's
/// cache_seqlens[b] keys in pages block_table[b, 0], [b, 1], ...; o like q with head_dim_v,
/// lse [batch, heads_q, seqlen_q] (optional). Every argument is checked first: a bad one
/// throws tileattn::invalid_argument naming it, and nothing is written.
template <class Q, class K, class V, class O>
void forward_paged(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                   BlockTableView block_table, std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o,
                   LseView lse, const PagedOptions& options = {}) {
  if constexpr (detail::check_paged_element_types<Q, K, V, O>()) {
    const auto call = detail::pool_typed_call<K>(detail::paged_call<O, detail::kernel_kv_t<K>>(
        q, {}, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table, cache_seqlens,
        o, lse, options));
    const PagedPlan plan = kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
    detail::run_paged(call.params, plan, options, detail::PlanOrigin::this_call);
  }
}

/// The same with a plan from plan_forward_paged (checked against the call).
template <class Q, class K, class V, class O>
void forward_paged(const PagedPlan& plan, const TensorView<Q>& q, const TensorView<K>& k_cache,
                   const TensorView<V>& v_cache, BlockTableView block_table,
                   std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o, LseView lse,
                   const PagedOptions& options = {}) {
  if constexpr (detail::check_paged_element_types<Q, K, V, O>()) {
    const auto call = detail::pool_typed_call<K>(detail::paged_call<O, detail::kernel_kv_t<K>>(
        q, {}, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table, cache_seqlens,
        o, lse, options));
    detail::run_paged(call.params, plan, options, detail::PlanOrigin::caller);
  }
}

/// forward_paged() without the log-sum-exp output.
template <class Q, class K, class V, class O>
void forward_paged(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                   BlockTableView block_table, std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o,
                   const PagedOptions& options = {}) {
  forward_paged(q, k_cache, v_cache, block_table, cache_seqlens, o, LseView{}, options);
}

namespace detail {
template <class T, class KV>
PagedCall<T, KV> paged_varlen_call(const PackedView<const T>& q, std::span<const std::int32_t> cu_seqlens_q,
                               const TensorView<const KV>& k_cache, const TensorView<const KV>& v_cache,
                               BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                               const PackedView<T>& o, const PackedLseView& lse, const PagedOptions& options) {
  TILEATTN_REQUIRE(!cu_seqlens_q.empty(), "cu_seqlens_q", "is empty (needs batch + 1 entries)");
  check_view(q, "q", packed_layout.names, {true, false, false});  // named in the packed layout
  check_view(o, "o", packed_layout.names, {true, false, false});
  for (std::size_t d = 0; d < 2; ++d) check_same_extent(q, "q", o, "o", d, packed_layout.names[d]);
  check_lse(lse, {q.shape[1], q.shape[0]}, packed_lse_dims);
  return paged_call<T, KV>(unpack(q), cu_seqlens_q, k_cache, v_cache, block_table, cache_seqlens, unpack(o),
                           lse.with_leading(), options);
}
}  // namespace detail

/// forward_paged() with queries of varying lengths (chunked prefill of several sequences,
/// speculative verify with different draft lengths, decoding mixed with either): q and o
/// packed [total_q, heads_q, head_dim] with sequence b's rows [cu_seqlens_q[b],
/// cu_seqlens_q[b + 1]); lse [heads_q, total_q] (optional: PackedLseView{}).
template <class Q, class K, class V, class O>
void forward_paged_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                          BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                          const PackedView<O>& o, PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                          const PagedOptions& options = {}) {
  if constexpr (detail::check_paged_element_types<Q, K, V, O>()) {
    const auto call = detail::pool_typed_call<K>(detail::paged_varlen_call<O, detail::kernel_kv_t<K>>(
        q, cu_seqlens_q, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table,
        cache_seqlens, o, lse, options));
    const PagedPlan plan = kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
    detail::run_paged(call.params, plan, options, detail::PlanOrigin::this_call);
  }
}

/// The plan forward_paged_varlen makes for this batch, for reuse across calls (layers).
template <class Q, class K, class V, class O>
PagedPlan plan_forward_paged_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                                    BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                                    const PackedView<O>& o, PackedLseView lse,
                                    std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  detail::check_paged_element_types<Q, K, V, O>();
  const auto call = detail::pool_typed_call<K>(detail::paged_varlen_call<O, detail::kernel_kv_t<K>>(
        q, cu_seqlens_q, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table,
        cache_seqlens, o, lse, options));
  return kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
}

/// forward_paged_varlen with a plan from plan_forward_paged_varlen (checked against the call).
template <class Q, class K, class V, class O>
void forward_paged_varlen(const PagedPlan& plan, const PackedView<Q>& q, const TensorView<K>& k_cache,
                          const TensorView<V>& v_cache, BlockTableView block_table,
                          std::span<const std::int32_t> cache_seqlens, const PackedView<O>& o, PackedLseView lse,
                          std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  if constexpr (detail::check_paged_element_types<Q, K, V, O>()) {
    const auto call = detail::pool_typed_call<K>(detail::paged_varlen_call<O, detail::kernel_kv_t<K>>(
        q, cu_seqlens_q, detail::kernel_pool(k_cache), detail::kernel_pool(v_cache), block_table,
        cache_seqlens, o, lse, options));
    detail::run_paged(call.params, plan, options, detail::PlanOrigin::caller);
  }
}

}  // namespace tileattn

// The explicit instantiations of the paged forward (forward.hpp says how they are used):
// the checks, the plan and the kernels of the forward_paged / forward_paged_varlen /
// plan_forward_paged(_varlen) calls with Q and O in T and the page pools in KV.
#define TILEATTN_INSTANTIATE_PAGED(KEYWORD, T, KV)                                                         \
  KEYWORD template tileattn::detail::PagedCall<T, KV> tileattn::detail::paged_call<T, KV>(                \
      tileattn::TensorView<const T>, std::span<const std::int32_t>, tileattn::TensorView<const KV>,      \
      tileattn::TensorView<const KV>, tileattn::BlockTableView, std::span<const std::int32_t>,           \
      tileattn::TensorView<T>, tileattn::LseView, const tileattn::PagedOptions&);                        \
  KEYWORD template tileattn::detail::PagedCall<T, KV> tileattn::detail::paged_varlen_call<T, KV>(         \
      const tileattn::PackedView<const T>&, std::span<const std::int32_t>,                              \
      const tileattn::TensorView<const KV>&, const tileattn::TensorView<const KV>&,                      \
      tileattn::BlockTableView, std::span<const std::int32_t>, const tileattn::PackedView<T>&,           \
      const tileattn::PackedLseView&, const tileattn::PagedOptions&);                                    \
  KEYWORD template tileattn::PagedPlan tileattn::kernels::make_paged_plan<T, KV>(                        \
      const tileattn::ForwardParams<T, KV>&, tileattn::index_t, tileattn::index_t,                       \
      const tileattn::PagedOptions&);                                                                    \
  KEYWORD template void tileattn::detail::run_paged<T, KV>(                                              \
      tileattn::ForwardParams<T, KV>, const tileattn::PagedPlan&, const tileattn::PagedOptions&,         \
      tileattn::detail::PlanOrigin);

// The combinations tileattn::instantiations compiles (src/instantiations_paged.cpp): those
// that several of this project's translation units call, in the Release build and the
// sanitizer builds (float over float, int8, fp8_e4m3 and fp8_e5m2 pools; bf16 over bf16).
// The others (fp16 pools, bf16 Q over 8-bit pools) each have one caller in a build, or
// none in most: compiled once in the library they would cost every build that links it
// (TSan's, the fuzzers') more than they save. A call with another combination compiles
// its own copy, as without the library.
#define TILEATTN_INSTANTIATE_PAGED_COMMON(KEYWORD)                   \
  TILEATTN_INSTANTIATE_PAGED(KEYWORD, float, float)                  \
  TILEATTN_INSTANTIATE_PAGED(KEYWORD, float, std::int8_t)            \
  TILEATTN_INSTANTIATE_PAGED(KEYWORD, float, tileattn::fp8_e4m3)     \
  TILEATTN_INSTANTIATE_PAGED(KEYWORD, float, tileattn::fp8_e5m2)     \
  TILEATTN_INSTANTIATE_PAGED(KEYWORD, tileattn::bf16, tileattn::bf16)

#if defined(TILEATTN_EXTERN_TEMPLATES)
TILEATTN_INSTANTIATE_PAGED_COMMON(extern)
#endif
