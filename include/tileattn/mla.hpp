// tileattn/mla.hpp: multi-head latent attention (MLA: DeepSeek V2, V3, R1) over a paged
// latent cache: decoding and chunked prefill in the absorbed form, where every query head
// attends the same latent rows.
//
//   // latent pool [num_pages, page_size, 1, 576]: per token kv_lora_rank 512 + 64 rotary
//   // dims; q [B, Sq, Hq, 576] (q_nope absorbed through W_UK, then q_pe); o [B, Sq, Hq, 512].
//   tileattn::forward_paged_mla(q, latent, table, seqlens, o, lse, options);
//   // then o through W_UV per head (the caller's GEMM).
//
// K is the latent row (head_dim = latent.shape[3]); V is its first head_dim_v = o.shape[3]
// columns, in the same buffer. The call is forward_paged's (paged.hpp: block table, split-KV,
// prefix-once, plan/run, causal bottom-right for seqlen_q > 1, window, softcap, sinks, ALiBi,
// bias, mask, LSE, bf16, fp32 and 8-bit latents with scales) with V as that view of K, and one
// difference in how it runs: each key tile of the latent is read from memory once, as K, and
// its V tile is made from the K tile already in SRAM (ops::values_from_keys: "load once, pack
// twice"; read in place, the V rows are the K rows). The latent's heads_kv is usually 1: a work
// item then holds every query head's rows (GQA folding, kernels/work_list.hpp) and reads each
// latent page once per group, where the same call through forward_paged (V a view of K) reads
// it twice. Both give the same bits (the V tile's values are the same).
//
// Why a function of its own rather than forward_paged recognising V as a column prefix of K:
// the caller says what the cache is (one latent pool, no V pool), the call checks it (head_dim_v
// <= head_dim, one scale view), and forward_paged keeps one meaning for its two pools, which may
// alias in other ways (docs/paged.md, "MLA").
//
// Not with rotary embedding: MLA's rotary dims are the latent's last ones, which
// RotaryOptions (the first rotary_dim features) cannot name; rotate q_pe and the latent's
// rotary part before the call (KvCache::write_latent stores the rows as given). 8-bit latents
// take their scales as options.k_scale (one per (page, latent head), as KvCache's), which
// scale V too; options.v_scale must be empty.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "tileattn/paged.hpp"

namespace tileattn {

namespace detail {

/// forward_paged_mla's element types: forward_paged's but for 4-bit blocks, which it does not take
/// yet. Returns whether they are.
template <class Q, class L, class O>
constexpr bool check_mla_element_types() {
  if constexpr (block_pool_type<std::remove_const_t<L>>) {
    static_assert(!block_pool_type<std::remove_const_t<L>>,
                  "tileattn: forward_paged_mla takes float, bf16, fp16 or 8-bit latent caches; 4-bit ones (q4_0_block, mxfp4_block, nvfp4_block) are not supported yet");
    return false;
  } else {
    return check_element_types<Q, L, L, O>();
  }
}

/// V as the first o.shape[3] columns of the latent pool (same data, same strides), after
/// the checks that make it a view of the latent: the ones forward_paged's checks cannot
/// make of a V they are given.
template <class L, class O>
TensorView<L> latent_values(const TensorView<L>& latent_cache, const TensorView<O>& o, const PagedOptions& options) {
  TILEATTN_REQUIRE(latent_cache.shape[dim::head_dim] >= 1, "latent_cache",
                   "shape[3] (head_dim) must be >= 1, got " + std::to_string(latent_cache.shape[dim::head_dim]));
  TILEATTN_REQUIRE(o.shape[dim::head_dim] >= 1 && o.shape[dim::head_dim] <= latent_cache.shape[dim::head_dim],
                   "o", "shape[3] (head_dim_v, V's columns of the latent) must be in [1, latent head_dim = " +
                            std::to_string(latent_cache.shape[dim::head_dim]) + "], got " +
                            std::to_string(o.shape[dim::head_dim]));
  TILEATTN_REQUIRE(!options.rotary.enabled(), "rotary",
                   "is not supported by forward_paged_mla: MLA's rotary dims are the latent's last ones; rotate "
                   "q_pe and the latent's rotary part before the call");
  TILEATTN_REQUIRE(!options.v_scale.data, "v_scale",
                   "must be empty in forward_paged_mla: the latent's scales (k_scale) scale V too");
  TensorView<L> v = latent_cache;
  v.shape[dim::head_dim] = o.shape[dim::head_dim];
  return v;
}

/// forward_paged's options for a latent call: the latent's scales for K and V alike.
inline PagedOptions latent_options(const PagedOptions& options) {
  PagedOptions o = options;
  o.v_scale = options.k_scale;
  return o;
}

template <class Q, class L, class O>
PagedCall<std::remove_const_t<O>, std::remove_const_t<L>> mla_call(const TensorView<Q>& q, const TensorView<L>& latent,
                                                                   BlockTableView block_table,
                                                                   std::span<const std::int32_t> cache_seqlens,
                                                                   const TensorView<O>& o, LseView lse,
                                                                   const PagedOptions& options) {
  const TensorView<L> v = latent_values(latent, o, options);
  auto call = paged_call<O, std::remove_const_t<L>>(q, {}, latent, v, block_table, cache_seqlens, o, lse,
                                                    latent_options(options));
  call.params.v_in_k = true;
  return call;
}

template <class Q, class L, class O>
PagedCall<std::remove_const_t<O>, std::remove_const_t<L>> mla_varlen_call(
    const PackedView<Q>& q, const TensorView<L>& latent, BlockTableView block_table,
    std::span<const std::int32_t> cache_seqlens, const PackedView<O>& o, PackedLseView lse,
    std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options) {
  const TensorView<L> v = latent_values(latent, unpack(o), options);
  auto call = paged_varlen_call<O, std::remove_const_t<L>>(q, cu_seqlens_q, latent, v, block_table, cache_seqlens, o,
                                                           lse, latent_options(options));
  call.params.v_in_k = true;
  return call;
}

}  // namespace detail

/// Absorbed MLA over a paged latent cache: q [batch, seqlen_q, heads_q, head_dim] against
/// latent_cache [num_pages, page_size, heads_kv (usually 1), head_dim] as K and its first
/// head_dim_v = o.shape[3] columns as V; o [batch, seqlen_q, heads_q, head_dim_v], lse
/// [batch, heads_q, seqlen_q] (optional). The rest is forward_paged's; every argument is
/// checked first (a bad one throws tileattn::invalid_argument naming it; nothing is written).
template <class Q, class L, class O>
void forward_paged_mla(const TensorView<Q>& q, const TensorView<L>& latent_cache, BlockTableView block_table,
                       std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o, LseView lse,
                       const PagedOptions& options = {}) {
  if constexpr (detail::check_mla_element_types<Q, L, O>()) {
    const auto call = detail::mla_call(q, latent_cache, block_table, cache_seqlens, o, lse, options);
    const PagedPlan plan = kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
    detail::run_paged(call.params, plan, detail::latent_options(options), detail::PlanOrigin::this_call);
  }
}

/// forward_paged_mla() without the log-sum-exp output.
template <class Q, class L, class O>
void forward_paged_mla(const TensorView<Q>& q, const TensorView<L>& latent_cache, BlockTableView block_table,
                       std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o,
                       const PagedOptions& options = {}) {
  forward_paged_mla(q, latent_cache, block_table, cache_seqlens, o, LseView{}, options);
}

/// The plan forward_paged_mla makes for this batch, for reuse across the layers of a step.
template <class Q, class L, class O>
PagedPlan plan_forward_paged_mla(const TensorView<Q>& q, const TensorView<L>& latent_cache, BlockTableView block_table,
                                 std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o, LseView lse,
                                 const PagedOptions& options = {}) {
  detail::check_mla_element_types<Q, L, O>();
  const auto call = detail::mla_call(q, latent_cache, block_table, cache_seqlens, o, lse, options);
  return kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
}

/// forward_paged_mla with a plan from plan_forward_paged_mla (checked against the call).
template <class Q, class L, class O>
void forward_paged_mla(const PagedPlan& plan, const TensorView<Q>& q, const TensorView<L>& latent_cache,
                       BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                       const TensorView<O>& o, LseView lse, const PagedOptions& options = {}) {
  if constexpr (detail::check_mla_element_types<Q, L, O>()) {
    const auto call = detail::mla_call(q, latent_cache, block_table, cache_seqlens, o, lse, options);
    detail::run_paged(call.params, plan, detail::latent_options(options), detail::PlanOrigin::caller);
  }
}

/// forward_paged_mla with queries of varying lengths (forward_paged_varlen's packing): q
/// [total_q, heads_q, head_dim], o [total_q, heads_q, head_dim_v], lse [heads_q, total_q].
template <class Q, class L, class O>
void forward_paged_mla_varlen(const PackedView<Q>& q, const TensorView<L>& latent_cache, BlockTableView block_table,
                              std::span<const std::int32_t> cache_seqlens, const PackedView<O>& o, PackedLseView lse,
                              std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  if constexpr (detail::check_mla_element_types<Q, L, O>()) {
    const auto call =
        detail::mla_varlen_call(q, latent_cache, block_table, cache_seqlens, o, lse, cu_seqlens_q, options);
    const PagedPlan plan = kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
    detail::run_paged(call.params, plan, detail::latent_options(options), detail::PlanOrigin::this_call);
  }
}

/// The plan forward_paged_mla_varlen makes for this batch, for reuse across layers.
template <class Q, class L, class O>
PagedPlan plan_forward_paged_mla_varlen(const PackedView<Q>& q, const TensorView<L>& latent_cache,
                                        BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                                        const PackedView<O>& o, PackedLseView lse,
                                        std::span<const std::int32_t> cu_seqlens_q, const PagedOptions& options = {}) {
  detail::check_mla_element_types<Q, L, O>();
  const auto call = detail::mla_varlen_call(q, latent_cache, block_table, cache_seqlens, o, lse, cu_seqlens_q, options);
  return kernels::make_paged_plan(call.params, call.longest_q, call.longest_k, options);
}

/// forward_paged_mla_varlen with a plan from plan_forward_paged_mla_varlen (checked against the call).
template <class Q, class L, class O>
void forward_paged_mla_varlen(const PagedPlan& plan, const PackedView<Q>& q, const TensorView<L>& latent_cache,
                              BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                              const PackedView<O>& o, PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                              const PagedOptions& options = {}) {
  if constexpr (detail::check_mla_element_types<Q, L, O>()) {
    const auto call =
        detail::mla_varlen_call(q, latent_cache, block_table, cache_seqlens, o, lse, cu_seqlens_q, options);
    detail::run_paged(call.params, plan, detail::latent_options(options), detail::PlanOrigin::caller);
  }
}

}  // namespace tileattn
