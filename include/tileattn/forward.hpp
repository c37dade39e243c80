// tileattn/forward.hpp: the public forward pass: tileattn::forward() over strided views and
// tileattn::forward_varlen() over packed variable-length batches.
//
//   std::vector<float> q(B*N*H*D), k(B*N*Hkv*D), v(B*N*Hkv*D), o(B*N*H*D), lse(B*H*N);
//   tileattn::ForwardOptions opts;
//   opts.causal = true;        // bottom-right aligned, as FlashAttention >= 2.1
//   opts.window_left = 4096;   // sliding window (Mistral)
//   tileattn::forward(tileattn::make_bshd(q.data(), B, N, H, D),
//                     tileattn::make_bshd(k.data(), B, N, Hkv, D),   // GQA: H % Hkv == 0
//                     tileattn::make_bshd(v.data(), B, N, Hkv, D),
//                     tileattn::make_bshd(o.data(), B, N, H, D),
//                     tileattn::make_lse(lse.data(), B, H, N), opts);
//
// Every argument is checked before anything runs: a bad one throws
// tileattn::invalid_argument naming it, and nothing is written.
#pragma once

#include <cmath>
#include <type_traits>

#include "tileattn/call_plan.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/detail/forward_checks.hpp"
#include "tileattn/detail/rotary_checks.hpp"
#include "tileattn/kernels/forward.hpp"
#include "tileattn/kernels/tile_plan.hpp"

namespace tileattn {

/// Packed variable-length tensors: [total_tokens, heads, head_dim].
template <class T>
using PackedView = StridedView<T, 3>;
/// Variable-length log-sum-exp: [heads, total_q] (FlashAttention's varlen layout).
using PackedLseView = StridedView<float, 2>;

template <class T>
PackedView<T> make_thd(T* data, index_t total, index_t heads, index_t head_dim) {
  return {data, {total, heads, head_dim}, {heads * head_dim, head_dim, 1}};
}
inline PackedLseView make_packed_lse(float* data, index_t heads, index_t total) {
  return {data, {heads, total}, {total, 1}};
}

/// A forward call's plan (plan_forward): the tiles chosen for its shapes, budget and thread
/// count. forward(plan, ...) reuses it for every call with the same shapes and options
/// (checked: a call it was not made for throws tileattn::invalid_argument naming "plan").
using ForwardPlan = CallPlan<PlanShape, TilePlan, plan_forward_tiles>;

namespace detail {
/// The planner's view of a call on q, k, v: `sequences` sequences of at most max_seqlen_q
/// queries and max_seqlen_k keys (the views' own for fixed-length batches).
template <class T, class K, class V>
PlanShape plan_shape(const TensorView<T>& q, const TensorView<K>& k, const TensorView<V>& v,
                     index_t sequences, index_t max_seqlen_q, index_t max_seqlen_k) {
  const index_t heads_kv = std::max<index_t>(k.shape[dim::heads], 1);
  return {q.shape[dim::head_dim], v.shape[dim::head_dim], max_seqlen_q,        max_seqlen_k,
          q.shape[dim::heads] / heads_kv, sequences * heads_kv, kernels::tile_operands_for<std::remove_const_t<T>>()};
}

/// One storage type for Q and O, one for K and V: Q's, or an 8-bit type with scales (Q/K/V
/// may be const or not; O may not). Returns whether they are, so that an entry point can
/// skip the kernels when they are not (`if constexpr`): the failed static_assert is then the
/// only error, not the first of ~300 lines from inside the kernels (issue 28).
template <class Q, class K, class V, class O>
constexpr bool check_element_types() {
  using T = std::remove_const_t<Q>;
  using KV = std::remove_const_t<K>;
  static_assert(storage_type<T>,
                "tileattn: Q, K, V and O must hold float, tileattn::bf16 or tileattn::fp16; view a "
                "buffer of Eigen::bfloat16, Eigen::half, std::bfloat16_t or std::uint16_t through "
                "tileattn::reinterpret_view<tileattn::bf16 or fp16>(view), or use tileattn/eigen.hpp");
  static_assert(std::is_same_v<T, O>, "tileattn: O must have Q's element type (and must not be const)");
  static_assert(std::is_same_v<KV, std::remove_const_t<V>>, "tileattn: K and V must have the same element type");
  static_assert(std::is_same_v<T, KV> || quantized_type<KV>,
                "tileattn: K and V must have Q's element type, or an 8-bit one with scales "
                "(tileattn::fp8_e4m3, fp8_e5m2 or std::int8_t: core/quantized_types.hpp)");
  return storage_type<T> && std::is_same_v<T, O> && std::is_same_v<KV, std::remove_const_t<V>> &&
         (std::is_same_v<T, KV> || quantized_type<KV>);
}
}  // namespace detail

namespace detail {
inline ForwardPlan::Signature forward_signature(const PlanShape& shape, const ForwardOptions& options) {
  const PlanShape planned = planned_shape(shape, options);
  return {planned, effective_sram_budget(options, least_forward_budget(planned)), worker_count(options.execution)};
}
}  // namespace detail

/// The plan forward(plan, q, k, v, ...) reuses: made from the views' shapes and the options
/// (the data are not read).
template <class Q, class K, class V>
ForwardPlan plan_forward(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
                         const ForwardOptions& options = {}) {
  const PlanShape shape =
      detail::plan_shape(q, k, v, q.shape[dim::batch], q.shape[dim::seqlen], k.shape[dim::seqlen]);
  return ForwardPlan(detail::forward_signature(shape, options));
}

namespace detail {

inline float default_scale(const ForwardOptions& options, index_t head_dim) {
  return options.softmax_scale.value_or(
      head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(head_dim)) : 1.0f);
}

template <class T, class KV>
ForwardParams<T, KV> make_params(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                                 TensorView<T> o, LseView lse, const ForwardOptions& opt) {
  ForwardParams<T, KV> p;
  static_cast<ScoreOptions&>(p) = opt;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.softmax_scale = default_scale(opt, q.shape[dim::head_dim]);
  p.rotary = opt.rotary;
  return p;
}

inline void check_budget(const ForwardOptions& options) {
  TILEATTN_REQUIRE(options.sram_budget_bytes <= max_sram_budget_bytes, "sram_budget_bytes",
          "must be at most " + std::to_string(max_sram_budget_bytes) + " (1 GiB; 0: the per-core cache), got " +
              std::to_string(options.sram_budget_bytes));
}

/// The tiles of a checked call: the given plan's, checked against the call, or planned now.
inline TilePlan call_tiles(const PlanShape& shape, const ForwardOptions& options, const ForwardPlan* given) {
  return ForwardPlan::tiles_for(forward_signature(shape, options), given, "plan_forward");
}

/// Checks what the score source needs (a flex call's block mask), plans (or checks the
/// caller's plan) and runs.
template <class T, class KV, class Scores>
void run(const ForwardParams<T, KV>& p, index_t max_seqlen_q, index_t max_seqlen_k,
         const ForwardOptions& options, const Scores& scores, const ForwardPlan* given = nullptr) {
  scores.check(p, max_seqlen_q, max_seqlen_k);
  PlanShape shape = plan_shape(p.q, p.k, p.v, p.batch(), max_seqlen_q, max_seqlen_k);
  shape.key_tile_limit = scores.key_tile_limit();
  const TilePlan plan = call_tiles(shape, options, given);
  if (options.io_counts) {
    *options.io_counts = kernels::run_forward<CountingIo>(p, plan, options.execution, scores);
  } else {
    kernels::run_forward<NoIoCounting>(p, plan, options.execution, scores);
  }
}

template <class T>
StridedView<T, 4> unpack(const PackedView<T>& v) {
  return v.with_leading();
}

/// The checks every forward-family call (forward, varlen, flex, paged) makes once its params
/// and sequences are set, in one order: the 8-bit scales (`scales_of` names their leading
/// dimension, e.g. "batch" or "num_pages", of extent `scales_extent`), the options against
/// `sequences` sequences of at most max_seqlen_q / max_seqlen_k, the budget, aliasing
/// (every output against every input and index array), and the rotary tables and positions.
template <class T, class KV>
void check_call(ForwardParams<T, KV>& p, const ForwardOptions& options, const char* scales_of, index_t scales_extent,
                index_t sequences, index_t max_seqlen_q, index_t max_seqlen_k) {
  set_kv_scales(p, options, scales_of, scales_extent);
  check_options(p, sequences, max_seqlen_q, max_seqlen_k, options.execution);
  check_budget(options);
  check_aliasing(p);
  check_rotary(p);
}

/// Every check forward() makes of its arguments, and the params they give (also how
/// distributed/ring.hpp validates a rank's shard before any transfer).
template <class T, class KV>
ForwardParams<T, KV> checked_params(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                                    TensorView<T> o, LseView lse, const ForwardOptions& options) {
  check_qkvo(q, k, v, o, padded_layout);
  check_lse(lse, {q.shape[dim::batch], q.shape[dim::heads], q.shape[dim::seqlen]}, lse_dims);
  ForwardParams<T, KV> p = make_params(q, k, v, o, lse, options);
  check_call(p, options, "batch", q.shape[dim::batch], p.batch(), q.shape[dim::seqlen], k.shape[dim::seqlen]);
  return p;
}

/// forward() with the score modifiers of `scores` (ops::BuiltinScores: the options'; flex.hpp:
/// a score_mod and mask_mod besides).
template <class T, class KV, class Scores>
void forward_scored(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v, TensorView<T> o,
                    LseView lse, const ForwardOptions& options, const Scores& scores,
                    const ForwardPlan* plan = nullptr) {
  const ForwardParams<T, KV> p = checked_params(q, k, v, o, lse, options);
  run(p, q.shape[dim::seqlen], k.shape[dim::seqlen], options, scores, plan);
}

/// forward() with its types resolved; plan: the caller's (nullptr: planned here).
template <class T, class KV = T>
void forward(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v, TensorView<T> o,
             LseView lse, const ForwardOptions& options, const ForwardPlan* plan = nullptr) {
  forward_scored(q, k, v, o, lse, options, ops::BuiltinScores{}, plan);
}

/// Checks a packed batch's sequences against the packed row counts (total_q, total_k) and
/// points p at them (the forward's and the backward's varlen entry points).
template <class T, class KV>
void set_sequences(ForwardParams<T, KV>& p, const VarlenSequences& seqs, index_t total_q, index_t total_k) {
  TILEATTN_REQUIRE(!seqs.cu_seqlens_q.empty(), "cu_seqlens_q", "is empty (needs batch + 1 entries)");
  const index_t batch = static_cast<index_t>(seqs.cu_seqlens_q.size()) - 1;
  TILEATTN_REQUIRE(batch >= 1, "cu_seqlens_q", "needs at least 2 entries (batch >= 1)");
  TILEATTN_REQUIRE(seqs.max_seqlen_q >= 0, "max_seqlen_q", "must be >= 0");
  TILEATTN_REQUIRE(seqs.max_seqlen_k >= 0, "max_seqlen_k", "must be >= 0");
  check_cu_seqlens(seqs.cu_seqlens_q, "cu_seqlens_q", batch, total_q, seqs.max_seqlen_q, "max_seqlen_q");
  check_cu_seqlens(seqs.cu_seqlens_k, "cu_seqlens_k", batch, total_k, seqs.max_seqlen_k, "max_seqlen_k");
  p.cu_seqlens_q = seqs.cu_seqlens_q.data();
  p.cu_seqlens_k = seqs.cu_seqlens_k.data();
  p.num_sequences = batch;
}

template <class T, class KV, class Scores>
void forward_varlen_scored(PackedView<const T> q, PackedView<const KV> k, PackedView<const KV> v,
                           PackedView<T> o, PackedLseView lse, const VarlenSequences& seqs,
                           const ForwardOptions& options, const Scores& scores) {
  check_qkvo(q, k, v, o, packed_layout);
  check_lse(lse, {q.shape[1], q.shape[0]}, packed_lse_dims);
  ForwardParams<T, KV> p = make_params(unpack(q), unpack(k), unpack(v), unpack(o), lse.with_leading(), options);
  set_sequences(p, seqs, q.shape[0], k.shape[0]);
  check_call(p, options, "batch", p.num_sequences, p.num_sequences, seqs.max_seqlen_q, seqs.max_seqlen_k);
  run(p, seqs.max_seqlen_q, seqs.max_seqlen_k, options, scores);
}

template <class T, class KV = T>
void forward_varlen(PackedView<const T> q, PackedView<const KV> k, PackedView<const KV> v,
                    PackedView<T> o, PackedLseView lse, const VarlenSequences& seqs,
                    const ForwardOptions& options) {
  forward_varlen_scored(q, k, v, o, lse, seqs, options, ops::BuiltinScores{});
}

}  // namespace detail

/// O = softmax(scale * Q K^T, modified and masked as `options` says) V for every
/// (batch, query head), and, when lse.data is set, lse = log of each row's softmax
/// denominator (natural log; -inf for rows that see no key, NaN for rows that see a NaN
/// score). Query head h reads K/V head h / (heads_q / heads_kv). q and k have head_dim,
/// v and o head_dim_v (each in 1..max_head_dim; they may differ).
/// Q, K, V and O hold one storage type: float, bf16 or fp16 (core/half_types.hpp); S, the
/// softmax statistics and O accumulate in float, O is rounded once when stored, and the LSE
/// is float (docs/precision.md). K and V may instead be stored in 8 bits (fp8_e4m3,
/// fp8_e5m2, int8: core/quantized_types.hpp) with options.k_scale / v_scale
/// ([batch or 1, heads_kv or 1]): attention over K and V dequantized exactly (q * scale).
template <class Q, class K, class V, class O>
void forward(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
             const TensorView<O>& o, LseView lse, const ForwardOptions& options = {}) {
  if constexpr (detail::check_element_types<Q, K, V, O>())
    detail::forward<O, std::remove_const_t<K>>(q, k, v, o, lse, options);
}

/// forward() without the log-sum-exp output.
template <class Q, class K, class V, class O>
void forward(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
             const TensorView<O>& o, const ForwardOptions& options = {}) {
  forward(q, k, v, o, LseView{}, options);
}

/// forward() with a plan from plan_forward (checked against the call).
template <class Q, class K, class V, class O>
void forward(const ForwardPlan& plan, const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
             const TensorView<O>& o, LseView lse, const ForwardOptions& options = {}) {
  if constexpr (detail::check_element_types<Q, K, V, O>()) {
    detail::forward<O, std::remove_const_t<K>>(q, k, v, o, lse, options, &plan);
  }
}

/// forward(plan, ...) without the log-sum-exp output.
template <class Q, class K, class V, class O>
void forward(const ForwardPlan& plan, const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
             const TensorView<O>& o, const ForwardOptions& options = {}) {
  forward(plan, q, k, v, o, LseView{}, options);
}

/// forward() over packed variable-length batches (FlashAttention's flash_attn_varlen_func):
/// q, o are [total_q, heads_q, head_dim], k, v [total_k, heads_kv, head_dim], lse
/// [heads_q, total_q] (optional). Causal, window and ALiBi align per sequence; a bias or
/// mask is [B or 1, H or 1, max_seqlen_q, max_seqlen_k], indexed from each sequence's start.
/// Empty sequences are allowed; a sequence with no keys gets O = 0, LSE = -inf.
template <class Q, class K, class V, class O>
void forward_varlen(const PackedView<Q>& q, const PackedView<K>& k, const PackedView<V>& v,
                    const PackedView<O>& o, PackedLseView lse, const VarlenSequences& seqs,
                    const ForwardOptions& options = {}) {
  if constexpr (detail::check_element_types<Q, K, V, O>())
    detail::forward_varlen<O, std::remove_const_t<K>>(q, k, v, o, lse, seqs, options);
}

}  // namespace tileattn

// The explicit instantiations of the forward for float, bf16 and fp16 (fmt's pattern): a
// program that compiles them once (CMake: TILEATTN_BUILD_INSTANTIATIONS=ON, target
// tileattn::instantiations, which defines TILEATTN_EXTERN_TEMPLATES for its users) has its
// other translation units skip instantiating and optimizing the kernels. Every TU, and the
// library, must then be compiled for the same target (-march): see arch/native.hpp.
#define TILEATTN_INSTANTIATE_FORWARD(KEYWORD, T)                                                    \
  KEYWORD template void tileattn::detail::forward<T>(                                              \
      tileattn::TensorView<const T>, tileattn::TensorView<const T>, tileattn::TensorView<const T>, \
      tileattn::TensorView<T>, tileattn::LseView, const tileattn::ForwardOptions&,                 \
      const tileattn::ForwardPlan*);                                                               \
  KEYWORD template void tileattn::detail::forward_varlen<T>(                                       \
      tileattn::PackedView<const T>, tileattn::PackedView<const T>, tileattn::PackedView<const T>, \
      tileattn::PackedView<T>, tileattn::PackedLseView, const tileattn::VarlenSequences&,          \
      const tileattn::ForwardOptions&);

#if defined(TILEATTN_EXTERN_TEMPLATES)
TILEATTN_INSTANTIATE_FORWARD(extern, float)
TILEATTN_INSTANTIATE_FORWARD(extern, tileattn::bf16)
TILEATTN_INSTANTIATE_FORWARD(extern, tileattn::fp16)
#endif
