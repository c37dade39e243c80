// tileattn/flex.hpp: flexible attention (PyTorch FlexAttention's semantics): forward and
// backward with a user score_mod and mask_mod compiled into the kernels' score step, and a
// block mask that skips empty blocks and mask evaluation in full ones. No code generator:
// the functors are template arguments, inlined into the tile loop.
//
//   // a custom mod in a few lines: causal, plus a per-head bias that grows with distance
//   auto mask = tileattn::flex::causal{};
//   auto bias = tileattn::flex::with_grad{
//       [&](float s, tileattn::index_t, tileattn::index_t h, tileattn::index_t i, tileattn::index_t j) {
//         return s - slope[h] * float(i - j); },
//       [](float, tileattn::index_t, tileattn::index_t, tileattn::index_t, tileattn::index_t) { return 1.0f; }};
//   auto blocks = tileattn::create_block_mask(mask, 1, 1, N, N);   // once, reused by every layer
//   tileattn::forward_flex(q, k, v, o, lse, bias, blocks);
//   tileattn::backward_flex(q, k, v, o, lse, dout, dq, dk, dv, bias, blocks);
//
// The mask argument is a mask_mod (evaluated on every score) or a BlockMask (flex/block_mask.hpp;
// its mask_mod evaluated only in partial blocks). Every ForwardOptions option still applies,
// before the functors: softcap, bias and ALiBi, then score_mod, then the window, causal and
// boolean masks, then the mask_mod (flex/scores.hpp; docs/flex.md). Views, storage types
// (float, bf16, fp16; 8-bit K/V with scales), GQA, LSE and errors are forward()'s and
// backward()'s. forward_paged_flex (and its varlen form) does the same over a paged KV
// cache (paged.hpp), e.g. a speculative verify step under a draft tree's mask
// (flex/tree_mask.hpp), and plans as forward_paged does: plan_forward_paged_flex(_varlen)
// takes the call's arguments up to the options, and forward_paged_flex(_varlen)(plan, ...)
// reuses the plan, checked against the call.
#pragma once

#include <type_traits>

#include "tileattn/backward.hpp"
#include "tileattn/flex/block_mask.hpp"
#include "tileattn/flex/mods.hpp"
#include "tileattn/flex/scores.hpp"
#include "tileattn/flex/tree_mask.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/paged.hpp"

namespace tileattn {

namespace detail {
template <class M>
struct block_mask_of : std::false_type {};
template <class M>
struct block_mask_of<BlockMask<M>> : std::true_type {
  using mask_mod = M;
};

/// The mask_mod of a mask argument: itself, or a block mask's.
template <class Mask>
struct mask_mod_type {
  using type = Mask;
};
template <class M>
struct mask_mod_type<BlockMask<M>> {
  using type = M;
};

template <class ScoreMod, class Mask>
auto flex_scores(const ScoreMod& score_mod, const Mask& mask) {
  if constexpr (block_mask_of<Mask>::value) {
    return ops::FlexScores<ScoreMod, typename mask_mod_type<Mask>::type>{&score_mod, &mask.mask_mod(), &mask.kinds()};
  } else {
    return ops::FlexScores<ScoreMod, Mask>{&score_mod, &mask, nullptr};
  }
}

/// Each check returns whether it passed, as check_element_types (forward.hpp).
template <class ScoreMod, class Mask>
constexpr bool check_flex_types() {
  static_assert(score_mod_function<ScoreMod>,
                "tileattn: a score_mod must be callable as float(float score, index_t b, index_t h, index_t q_idx, "
                "index_t kv_idx) (tileattn::flex::no_score_mod for none; flex/mods.hpp)");
  static_assert(mask_mod_function<typename mask_mod_type<Mask>::type>,
                "tileattn: the mask must be a tileattn::BlockMask or callable as bool(index_t b, index_t h, "
                "index_t q_idx, index_t kv_idx) (tileattn::flex::no_mask for none; flex/mods.hpp)");
  return score_mod_function<ScoreMod> && mask_mod_function<typename mask_mod_type<Mask>::type>;
}

template <class ScoreMod>
constexpr bool check_flex_grad() {
  static_assert(score_mod_with_grad<ScoreMod>,
                "tileattn: backward_flex needs the derivative of the score_mod: give it a member "
                "grad(score, b, h, q_idx, kv_idx) returning d score_mod / d score, or pair it with its "
                "derivative: tileattn::flex::with_grad{score_mod, derivative}");
  return score_mod_with_grad<ScoreMod>;
}
}  // namespace detail

/// forward() with a score_mod and a mask (a mask_mod or a BlockMask): O and, when lse.data
/// is set, the log-sum-exp, under FlexAttention's semantics (flex/mods.hpp).
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_flex(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v, const TensorView<O>& o,
                  LseView lse, const ScoreMod& score_mod, const Mask& mask, const ForwardOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>())
    detail::forward_scored<O, std::remove_const_t<K>>(q, k, v, o, lse, options, detail::flex_scores(score_mod, mask));
}

/// forward_flex() without the log-sum-exp output.
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
  requires score_mod_function<ScoreMod>
void forward_flex(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v, const TensorView<O>& o,
                  const ScoreMod& score_mod, const Mask& mask, const ForwardOptions& options = {}) {
  forward_flex(q, k, v, o, LseView{}, score_mod, mask, options);
}

/// forward_flex() over packed variable-length batches (forward_varlen()'s layout): b is the
/// sequence, q_idx and kv_idx count from its start; a block mask covers [batch or 1, heads
/// or 1, max_seqlen_q, max_seqlen_k].
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_flex_varlen(const PackedView<Q>& q, const PackedView<K>& k, const PackedView<V>& v,
                         const PackedView<O>& o, PackedLseView lse, const VarlenSequences& seqs,
                         const ScoreMod& score_mod, const Mask& mask, const ForwardOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>())
    detail::forward_varlen_scored<O, std::remove_const_t<K>>(q, k, v, o, lse, seqs, options,
                                                             detail::flex_scores(score_mod, mask));
}

namespace detail {
/// The plan of a checked paged call (forward_paged's checks) with `scores`, after the block
/// mask's checks against the batch: the block size caps the key tile, and the mask's empty
/// blocks order the work (estimates only: any mask of that block size runs on it).
template <class T, class KV, class Scores>
PagedPlan paged_flex_plan(const PagedCall<T, KV>& call, const PagedOptions& options, const Scores& scores) {
  scores.check(call.params, call.longest_q, call.longest_k);
  return kernels::make_paged_plan_scored(call.params, call.longest_q, call.longest_k, options, scores);
}

/// Runs a checked paged call with `scores` on its own plan.
template <class T, class KV, class Scores>
void run_paged_flex(const PagedCall<T, KV>& call, const PagedOptions& options, const Scores& scores) {
  run_paged_scored(call.params, paged_flex_plan(call, options, scores), options, scores, PlanOrigin::this_call);
}

/// The same on a plan from plan_forward_paged_flex(_varlen), checked against the call after
/// the block mask.
template <class T, class KV, class Scores>
void run_paged_flex(const PagedCall<T, KV>& call, const PagedPlan& plan, const PagedOptions& options,
                    const Scores& scores) {
  scores.check(call.params, call.longest_q, call.longest_k);
  run_paged_scored(call.params, plan, options, scores, PlanOrigin::caller);
}
}  // namespace detail

/// forward_paged() with a score_mod and a mask (a mask_mod or a BlockMask): q_idx counts the
/// sequence's queries and kv_idx its cache positions (0 .. cache_seqlens[b]); a block mask
/// covers [batch or 1, heads or 1, seqlen_q, max(cache_seqlens)], and its empty blocks'
/// pages are never read. A speculative verify step's tree mask: flex/tree_mask.hpp.
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_paged_flex(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                        BlockTableView block_table, std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o,
                        LseView lse, const ScoreMod& score_mod, const Mask& mask, const PagedOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>()) {
    const auto call = detail::paged_call<O, std::remove_const_t<K>>(q, {}, k_cache, v_cache, block_table, cache_seqlens,
                                                                    o, lse, options);
    detail::run_paged_flex(call, options, detail::flex_scores(score_mod, mask));
  }
}

/// The plan forward_paged_flex(q, k_cache, v_cache, block_table, cache_seqlens, o, lse,
/// score_mod, mask, ...) makes, for reuse across calls (the layers of a verify step): checks
/// every argument as the call would (the data are not read). Of the mask it keeps the key
/// block size of a BlockMask (none for a mask_mod), which the call's mask must have; which
/// blocks are empty only orders its work, so a call with any mask of that kind runs on it,
/// with the bits of its own plan.
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
PagedPlan plan_forward_paged_flex(const TensorView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                                  BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                                  const TensorView<O>& o, LseView lse, const ScoreMod& score_mod, const Mask& mask,
                                  const PagedOptions& options = {}) {
  detail::check_element_types<Q, K, V, O>();
  detail::check_flex_types<ScoreMod, Mask>();
  const auto call = detail::paged_call<O, std::remove_const_t<K>>(q, {}, k_cache, v_cache, block_table, cache_seqlens,
                                                                  o, lse, options);
  return detail::paged_flex_plan(call, options, detail::flex_scores(score_mod, mask));
}

/// forward_paged_flex with a plan from plan_forward_paged_flex (checked against the call).
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_paged_flex(const PagedPlan& plan, const TensorView<Q>& q, const TensorView<K>& k_cache,
                        const TensorView<V>& v_cache, BlockTableView block_table,
                        std::span<const std::int32_t> cache_seqlens, const TensorView<O>& o, LseView lse,
                        const ScoreMod& score_mod, const Mask& mask, const PagedOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>()) {
    const auto call = detail::paged_call<O, std::remove_const_t<K>>(q, {}, k_cache, v_cache, block_table, cache_seqlens,
                                                                    o, lse, options);
    detail::run_paged_flex(call, plan, options, detail::flex_scores(score_mod, mask));
  }
}

/// forward_paged_flex() with queries of varying lengths (forward_paged_varlen()'s layout): a
/// block mask covers [batch or 1, heads or 1, max query length, max(cache_seqlens)].
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_paged_flex_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                               BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                               const PackedView<O>& o, PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                               const ScoreMod& score_mod, const Mask& mask, const PagedOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>()) {
    const auto call = detail::paged_varlen_call<O, std::remove_const_t<K>>(q, cu_seqlens_q, k_cache, v_cache,
                                                                           block_table, cache_seqlens, o, lse, options);
    detail::run_paged_flex(call, options, detail::flex_scores(score_mod, mask));
  }
}

/// The plan forward_paged_flex_varlen makes (plan_forward_paged_flex's, for packed queries).
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
PagedPlan plan_forward_paged_flex_varlen(const PackedView<Q>& q, const TensorView<K>& k_cache,
                                         const TensorView<V>& v_cache, BlockTableView block_table,
                                         std::span<const std::int32_t> cache_seqlens, const PackedView<O>& o,
                                         PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                                         const ScoreMod& score_mod, const Mask& mask,
                                         const PagedOptions& options = {}) {
  detail::check_element_types<Q, K, V, O>();
  detail::check_flex_types<ScoreMod, Mask>();
  const auto call = detail::paged_varlen_call<O, std::remove_const_t<K>>(q, cu_seqlens_q, k_cache, v_cache,
                                                                         block_table, cache_seqlens, o, lse, options);
  return detail::paged_flex_plan(call, options, detail::flex_scores(score_mod, mask));
}

/// forward_paged_flex_varlen with a plan from plan_forward_paged_flex_varlen (checked against
/// the call).
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
void forward_paged_flex_varlen(const PagedPlan& plan, const PackedView<Q>& q, const TensorView<K>& k_cache,
                               const TensorView<V>& v_cache, BlockTableView block_table,
                               std::span<const std::int32_t> cache_seqlens, const PackedView<O>& o,
                               PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                               const ScoreMod& score_mod, const Mask& mask, const PagedOptions& options = {}) {
  constexpr bool types_ok = detail::check_element_types<Q, K, V, O>();
  if constexpr (types_ok && detail::check_flex_types<ScoreMod, Mask>()) {
    const auto call = detail::paged_varlen_call<O, std::remove_const_t<K>>(q, cu_seqlens_q, k_cache, v_cache,
                                                                           block_table, cache_seqlens, o, lse, options);
    detail::run_paged_flex(call, plan, options, detail::flex_scores(score_mod, mask));
  }
}

/// The name forward_paged_flex_varlen had before the suffixes took the API rule's order
/// ([_paged][_flex][_varlen], docs/api.md).
template <class Q, class K, class V, class O, class ScoreMod, class Mask>
[[deprecated("renamed forward_paged_flex_varlen (the API rule's suffix order, docs/api.md)")]]
void forward_paged_varlen_flex(const PackedView<Q>& q, const TensorView<K>& k_cache, const TensorView<V>& v_cache,
                               BlockTableView block_table, std::span<const std::int32_t> cache_seqlens,
                               const PackedView<O>& o, PackedLseView lse, std::span<const std::int32_t> cu_seqlens_q,
                               const ScoreMod& score_mod, const Mask& mask, const PagedOptions& options = {}) {
  forward_paged_flex_varlen(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, cu_seqlens_q, score_mod, mask,
                            options);
}

/// The gradients of a forward_flex() call (backward()'s contract): the same score_mod and
/// mask, which must give its derivative (member grad; flex::with_grad). Not with dbias
/// when the score_mod modifies scores.
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV, class ScoreMod, class Mask>
void backward_flex(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v, const TensorView<O>& o,
                   SavedLseView lse, const TensorView<DO>& dout, const TensorView<DQ>& dq, const TensorView<DK>& dk,
                   const TensorView<DV>& dv, const ScoreMod& score_mod, const Mask& mask,
                   const BackwardOptions& options = {}) {
  constexpr bool types_ok = detail::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>();
  constexpr bool mods_ok = detail::check_flex_types<ScoreMod, Mask>() && detail::check_flex_grad<ScoreMod>();
  if constexpr (types_ok && mods_ok)
    detail::backward_scored<DQ>(q, k, v, o, lse, dout, dq, dk, dv, options, detail::flex_scores(score_mod, mask));
}

/// backward_flex() over packed variable-length batches (backward_varlen()'s layout).
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV, class ScoreMod, class Mask>
void backward_flex_varlen(const PackedView<Q>& q, const PackedView<K>& k, const PackedView<V>& v,
                          const PackedView<O>& o, SavedPackedLseView lse, const PackedView<DO>& dout,
                          const PackedView<DQ>& dq, const PackedView<DK>& dk, const PackedView<DV>& dv,
                          const VarlenSequences& seqs, const ScoreMod& score_mod, const Mask& mask,
                          const BackwardOptions& options = {}) {
  constexpr bool types_ok = detail::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>();
  constexpr bool mods_ok = detail::check_flex_types<ScoreMod, Mask>() && detail::check_flex_grad<ScoreMod>();
  if constexpr (types_ok && mods_ok)
    detail::backward_varlen_scored<DQ>(q, k, v, o, lse, dout, dq, dk, dv, seqs, options,
                                       detail::flex_scores(score_mod, mask));
}

}  // namespace tileattn
