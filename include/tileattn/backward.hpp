// tileattn/backward.hpp: the public backward pass: tileattn::backward() over strided views and
// tileattn::backward_varlen() over packed variable-length batches: dQ, dK, dV (and, when
// asked, d(sinks) and d(bias)) from the forward's inputs, its output O and log-sum-exp.
//
//   tileattn::ForwardOptions fwd;  fwd.causal = true;
//   tileattn::forward(q, k, v, o, lse, fwd);          // keep O and the LSE
//   ...                                               // the loss gives dO
//   tileattn::BackwardOptions bwd(fwd);  // the forward's options
//   tileattn::backward(q, k, v, o, lse, dout, dq, dk, dv, bwd);
//
// The options must be the forward's (the LSE is only valid for them). Gradients accumulate
// in fp32 and are rounded once when stored; they are bitwise identical for every backend,
// thread count and SRAM budget (docs/backward.md). Every argument is checked before
// anything runs: a bad one throws tileattn::invalid_argument naming it, and nothing is written.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>
#include <type_traits>

#include "tileattn/detail/backward_checks.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/kernels/backward.hpp"
#include "tileattn/kernels/backward_plan.hpp"

namespace tileattn {

/// The saved log-sum-exp the backward reads: [batch, heads_q, seqlen_q] (an LseView converts).
using SavedLseView = StridedView<const float, 3>;
/// The same for packed variable-length batches: [heads_q, total_q].
using SavedPackedLseView = StridedView<const float, 2>;

/// The tiles backward() chooses for a call of this shape with these options: the planner
/// itself, for inspection (plan_backward makes the plan a call reuses).
inline BackwardTilePlan backward_tiles(const BackwardShape& shape, const ForwardOptions& options = {}) {
  return plan_backward_tiles(detail::planned_shape(shape, options), effective_sram_budget(options),
                             worker_count(options.execution));
}

/// A backward call's plan (plan_backward), as ForwardPlan is the forward's: backward(plan,
/// ...) reuses it for every call with the same shapes and options (checked: "plan").
using BackwardPlan = CallPlan<BackwardShape, BackwardTilePlan, plan_backward_tiles>;

namespace detail {

/// The backward planner's view of a call on q, k, v (as plan_shape is the forward's):
/// `sequences` sequences of at most max_seqlen_q queries and max_seqlen_k keys; `slope`: the
/// modified score's slope takes a tile of its own.
template <class Q, class K, class V>
BackwardShape backward_shape(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
                             index_t sequences, index_t max_seqlen_q, index_t max_seqlen_k, bool slope) {
  return {q.shape[dim::head_dim], v.shape[dim::head_dim], max_seqlen_q, max_seqlen_k, sequences * k.shape[dim::heads],
          slope, kernels::tile_operands_for<std::remove_const_t<Q>>()};
}

template <class T>
BackwardParams<T> make_backward_params(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                       TensorView<const T> o, SavedLseView lse, TensorView<const T> dout,
                                       TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
                                       const BackwardOptions& opt) {
  BackwardParams<T> p;
  static_cast<ForwardParams<T>&>(p) = make_params(q, k, v, TensorView<T>{}, LseView{}, opt);
  p.out = o;
  p.saved_lse = lse;
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dsinks = opt.dsinks;
  p.dbias = opt.dbias;
  return p;
}

/// The saved LSE is required and must have the forward's extents `want`.
template <int R>
void check_saved_lse(const StridedView<const float, R>& lse,
                     const std::array<index_t, static_cast<std::size_t>(R)>& want,
                     const std::array<const char*, static_cast<std::size_t>(R)>& names) {
  TILEATTN_REQUIRE(lse.data != nullptr, "lse", "data is null (the backward needs the forward's log-sum-exp)");
  check_lse(StridedView<float, R>{const_cast<float*>(lse.data), lse.shape, lse.stride}, want, names);  // only read
}

/// The checks both entry points share once the params are built.
template <class T>
void check_backward_params(const BackwardParams<T>& p, index_t max_seqlen_q, index_t max_seqlen_k,
                           const BackwardOptions& options) {
  TILEATTN_REQUIRE(!options.rotary.enabled(), "rotary_cos",
                   "is not supported by the backward (it would need dQ and dK rotated back): rotate Q and K before "
                   "the forward and the backward (apply_rotary), and leave options.rotary unset");
  check_options(p, p.batch(), max_seqlen_q, max_seqlen_k, options.execution);
  check_budget(options);
  check_extra_gradients(p);
  check_backward_aliasing(p);
}

/// Every check backward() makes of its arguments, and the params they give (also how
/// distributed/ring.hpp validates a rank's shard before any transfer).
template <class T>
BackwardParams<T> checked_backward_params(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                          TensorView<const T> o, SavedLseView lse, TensorView<const T> dout,
                                          TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
                                          const BackwardOptions& options) {
  check_backward_views(q, k, v, o, dout, dq, dk, dv, padded_layout);
  check_saved_lse(lse, {q.shape[dim::batch], q.shape[dim::heads], q.shape[dim::seqlen]}, lse_dims);
  const BackwardParams<T> p = make_backward_params(q, k, v, o, lse, dout, dq, dk, dv, options);
  check_backward_params(p, q.shape[dim::seqlen], k.shape[dim::seqlen], options);
  return p;
}

/// |LSE| from which the backward recomputes P from the forward's row statistics rather than
/// from the saved float LSE. P's relative error from the LSE's rounding is about
/// |LSE| 2^-23 (the rounding and its conversion to log2 units): 3e-5 here, well inside
/// FlashAttention's rule (3 x a naive float backward + 2e-4), and 1e-3 at |LSE| 1e4, where
/// tests/kernels/backward_test.cpp (BackwardLargeScores) measured the rule broken 12 to
/// 14000x on integer inputs.
inline constexpr float exact_row_stats_lse = 256.0f;

/// Whether P may not be recomputed from this saved LSE: finite, at least
/// exact_row_stats_lse in magnitude.
inline bool large_lse(float lse) { return std::isfinite(lse) && std::abs(lse) >= exact_row_stats_lse; }

/// Whether some row's saved LSE is large_lse.
template <class T>
bool needs_row_stats(const BackwardParams<T>& p) {
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceRange seq = p.sequence(b);
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < seq.q_len; ++i) {
        if (large_lse(p.saved_lse(seq.view_batch, h, seq.q_start + i))) return true;
      }
  }
  return false;
}

/// The tiles of a forward that gives each row's final statistics (ring attention's chunk
/// pairs, distributed/ring.hpp, merged exactly): 64 keys and up to 64 query positions of one
/// head, whatever the budget. A row's sum takes its bits from where the key tiles start (the
/// online softmax rescales there), so a plan fixed by the shape alone keeps the bits the same
/// for every budget. Its working set (at most ~1.3 MB at head_dim 1024) may exceed a budget
/// set below it.
template <class T>
TilePlan row_stats_plan(const ForwardParams<T>& p, index_t max_seqlen_q) {
  constexpr index_t key_tile = 64, query_tile = 64;
  const index_t positions = std::clamp<index_t>(max_seqlen_q, 1, query_tile);
  const TileOperands operands = kernels::tile_operands_for<T>();
  const std::size_t bytes = forward_working_set_bytes(positions, key_tile, p.head_dim(), p.head_dim_v(), operands);
  return {positions, key_tile, 1, bytes, bytes, operands == TileOperands::bf16_panels};
}

/// The forward of f on row_stats_plan's tiles, its O into f.o (a scratch the caller gives),
/// each row's final statistics into f.row_max and f.row_sum; the IO it counted (none
/// unless count_io).
template <class T, class Scores>
IoCounts forward_row_stats(const ForwardParams<T>& f, index_t max_seqlen_q, const Execution& exec, bool count_io,
                           const Scores& scores) {
  const TilePlan plan = row_stats_plan(f, max_seqlen_q);
  if (count_io) return kernels::run_forward<CountingIo>(f, plan, exec, scores);
  kernels::run_forward<NoIoCounting>(f, plan, exec, scores);
  return {};
}

/// Every row's final statistics (max in log2 units and sum, the sink folded in) recomputed
/// with the backward's own scores (kernels::run_backward_row_stats, on the backward's
/// tiles), into max and sum ([batch, heads, seqlen] like the saved LSE): what the backward
/// takes P from where the saved LSE is too coarse. It costs one S = Q K^T product per tile
/// pair (about a fifth of a backward), only on calls with such rows.
template <class T, class Scores>
IoCounts backward_row_stats(const BackwardParams<T>& p, const BackwardTilePlan& plan, const BackwardOptions& options,
                            const Scores& scores, const LseView& max, const LseView& sum) {
  if (options.io_counts) return kernels::run_backward_row_stats<CountingIo>(p, plan, options.execution, max, sum, scores);
  kernels::run_backward_row_stats<NoIoCounting>(p, plan, options.execution, max, sum, scores);
  return {};
}

/// backward_row_stats into buffers of its own.
struct RecomputedRowStats {
  std::vector<float> max, sum;
  IoCounts io;
  kernels::SavedRowStats view() const {
    return {{max.data(), shape, stride}, {sum.data(), shape, stride}};
  }
  std::array<index_t, 3> shape{}, stride{};
};

template <class T, class Scores>
RecomputedRowStats recompute_row_stats(const BackwardParams<T>& p, const BackwardTilePlan& plan,
                                       const BackwardOptions& options, const Scores& scores) {
  const index_t batch = p.q.shape[dim::batch], seqlen = p.q.shape[dim::seqlen], heads = p.heads();
  const auto rows = static_cast<std::size_t>(batch * heads * seqlen);
  RecomputedRowStats r{std::vector<float>(rows), std::vector<float>(rows), {}, {batch, heads, seqlen},
                       {heads * seqlen, seqlen, 1}};
  r.io = backward_row_stats(p, plan, options, scores, {r.max.data(), r.shape, r.stride},
                            {r.sum.data(), r.shape, r.stride});
  return r;
}

inline BackwardPlan::Signature backward_signature(const BackwardShape& shape, const ForwardOptions& options) {
  return {planned_shape(shape, options), effective_sram_budget(options), worker_count(options.execution)};
}

/// The tiles of a checked call: the given plan's, checked against the call, or planned now.
inline BackwardTilePlan call_tiles(const BackwardShape& shape, const ForwardOptions& options,
                                   const BackwardPlan* given) {
  return BackwardPlan::tiles_for(backward_signature(shape, options), given, "plan_backward");
}

/// The checks both entry points share once the params are built, then the run with the
/// score modifiers of `scores` (ops::BuiltinScores, or flex.hpp's). Where a saved LSE is
/// large (needs_row_stats) and covers just these keys (wider == nullptr), P comes from the
/// forward's row statistics, recomputed. Ring attention's per-pair calls, whose LSE covers
/// keys on other ranks too, pass `wider`: the row statistics over all those keys (the
/// ring recomputes them where some LSE is large), or empty ones to use the saved LSE.
template <class T, class Scores>
void check_and_run_backward(const BackwardParams<T>& p, index_t max_seqlen_q, index_t max_seqlen_k,
                            const BackwardOptions& options, const Scores& scores,
                            const kernels::SavedRowStats* wider = nullptr, const BackwardPlan* given = nullptr) {
  check_backward_params(p, max_seqlen_q, max_seqlen_k, options);
  scores.check(p, max_seqlen_q, max_seqlen_k);
  const BackwardTilePlan plan =
      call_tiles(backward_shape(p.q, p.k, p.v, p.batch(), max_seqlen_q, max_seqlen_k, scores.has_slope(p.softcap)),
                 options, given);
  if (p.dbias.data) {  // zero first: keys a row never sees get no gradient
    const StridedView<float, 4>& g = p.dbias;
    for (index_t b = 0; b < g.shape[0]; ++b)
      for (index_t h = 0; h < g.shape[1]; ++h)
        for (index_t i = 0; i < g.shape[2]; ++i)
          for (index_t j = 0; j < g.shape[3]; ++j) g(b, h, i, j) = 0.0f;
  }
  RecomputedRowStats stats;
  if (!wider && needs_row_stats(p)) stats = recompute_row_stats(p, plan, options, scores);
  const kernels::SavedRowStats saved = wider ? *wider : stats.max.empty() ? kernels::SavedRowStats{} : stats.view();
  if (options.io_counts) {
    *options.io_counts = kernels::run_backward<CountingIo>(p, plan, options.execution, scores, saved);
    *options.io_counts += stats.io;
  } else {
    kernels::run_backward<NoIoCounting>(p, plan, options.execution, scores, saved);
  }
}

/// The row statistics backward(q, k, v, o, lse, dout, dq, dk, dv, options) would take P from
/// (its params, its tiles: backward_row_stats), into max and sum ([batch, heads, seqlen of
/// q]); nothing else is written. Ring attention's chunk pairs get theirs so
/// (distributed/ring.hpp), the views already checked as backward() checks them.
template <class T>
IoCounts backward_row_stats(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                            SavedLseView lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                            TensorView<T> dv, const BackwardOptions& options, const LseView& max, const LseView& sum) {
  const BackwardParams<T> p = make_backward_params(q, k, v, o, lse, dout, dq, dk, dv, options);
  const ops::BuiltinScores scores;
  const BackwardTilePlan plan =
      call_tiles(backward_shape(p.q, p.k, p.v, p.batch(), q.shape[dim::seqlen], k.shape[dim::seqlen],
                                scores.has_slope(p.softcap)),
                 options, nullptr);
  return backward_row_stats(p, plan, options, scores, max, sum);
}

template <class T, class Scores>
void backward_scored(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                     SavedLseView lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                     TensorView<T> dv, const BackwardOptions& options, const Scores& scores,
                     const kernels::SavedRowStats* wider = nullptr, const BackwardPlan* plan = nullptr) {
  check_backward_views(q, k, v, o, dout, dq, dk, dv, padded_layout);
  check_saved_lse(lse, {q.shape[dim::batch], q.shape[dim::heads], q.shape[dim::seqlen]}, lse_dims);
  const BackwardParams<T> p = make_backward_params(q, k, v, o, lse, dout, dq, dk, dv, options);
  check_and_run_backward(p, q.shape[dim::seqlen], k.shape[dim::seqlen], options, scores, wider, plan);
}

/// backward() whose dQ, dK and dV are stored in fp32 to dq32, dk32, dv32 (shaped like dq, dk,
/// dv, which are checked as backward() checks them and not written); wider as
/// check_and_run_backward's. Ring attention's chunk pairs (distributed/ring.hpp): their
/// partial gradients sum in fp32 and round once, as one backward's do.
template <class T>
void backward_fp32_gradients(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             TensorView<const T> o, SavedLseView lse, TensorView<const T> dout, TensorView<T> dq,
                             TensorView<T> dk, TensorView<T> dv, TensorView<float> dq32, TensorView<float> dk32,
                             TensorView<float> dv32, const BackwardOptions& options,
                             const kernels::SavedRowStats* wider) {
  check_backward_views(q, k, v, o, dout, dq, dk, dv, padded_layout);
  check_saved_lse(lse, {q.shape[dim::batch], q.shape[dim::heads], q.shape[dim::seqlen]}, lse_dims);
  BackwardParams<T> p = make_backward_params(q, k, v, o, lse, dout, dq, dk, dv, options);
  TILEATTN_REQUIRE(dq32.shape == dq.shape && dk32.shape == dk.shape && dv32.shape == dv.shape, "dq32",
                   "fp32 gradients must have the gradients' shapes");
  p.dq_fp32 = dq32;
  p.dk_fp32 = dk32;
  p.dv_fp32 = dv32;
  check_and_run_backward(p, q.shape[dim::seqlen], k.shape[dim::seqlen], options, ops::BuiltinScores{}, wider);
}

/// backward() with its types resolved; wider as check_and_run_backward's; plan:
/// the caller's (nullptr: planned here).
template <class T>
void backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
              SavedLseView lse, TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
              const BackwardOptions& options, const kernels::SavedRowStats* wider = nullptr,
              const BackwardPlan* plan = nullptr) {
  backward_scored(q, k, v, o, lse, dout, dq, dk, dv, options, ops::BuiltinScores{}, wider, plan);
}

template <class T, class Scores>
void backward_varlen_scored(PackedView<const T> q, PackedView<const T> k, PackedView<const T> v,
                            PackedView<const T> o, SavedPackedLseView lse, PackedView<const T> dout,
                            PackedView<T> dq, PackedView<T> dk, PackedView<T> dv, const VarlenSequences& seqs,
                            const BackwardOptions& options, const Scores& scores) {
  check_backward_views(q, k, v, o, dout, dq, dk, dv, packed_layout);
  check_saved_lse(lse, {q.shape[1], q.shape[0]}, packed_lse_dims);
  BackwardParams<T> p = make_backward_params(unpack(q), unpack(k), unpack(v), unpack(o), lse.with_leading(),
                                             unpack(dout), unpack(dq), unpack(dk), unpack(dv), options);
  set_sequences(p, seqs, q.shape[0], k.shape[0]);
  check_and_run_backward(p, seqs.max_seqlen_q, seqs.max_seqlen_k, options, scores);
}

template <class T>
void backward_varlen(PackedView<const T> q, PackedView<const T> k, PackedView<const T> v, PackedView<const T> o,
                     SavedPackedLseView lse, PackedView<const T> dout, PackedView<T> dq, PackedView<T> dk,
                     PackedView<T> dv, const VarlenSequences& seqs, const BackwardOptions& options) {
  backward_varlen_scored(q, k, v, o, lse, dout, dq, dk, dv, seqs, options, ops::BuiltinScores{});
}

/// One storage type for every tensor of a backward call; the gradients must be writable.
/// Returns whether there is, as check_element_types (forward.hpp).
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
constexpr bool check_backward_element_types() {
  const bool forward_ok = check_element_types<Q, K, V, std::remove_const_t<O>>();
  using T = std::remove_const_t<Q>;
  static_assert(std::is_same_v<T, std::remove_const_t<DO>>, "tileattn: dout must have q's element type");
  static_assert(std::is_same_v<T, DQ> && std::is_same_v<T, DK> && std::is_same_v<T, DV>,
                "tileattn: dq, dk and dv must have q's element type (and must not be const)");
  return forward_ok && std::is_same_v<T, std::remove_const_t<DO>> && std::is_same_v<T, DQ> &&
         std::is_same_v<T, DK> && std::is_same_v<T, DV>;
}

}  // namespace detail

/// The gradients of a forward(q, k, v, o, lse, options) call: given dO = d(loss)/dO, writes
/// dQ, dK and dV (dk and dv summed over each K/V head's group of query heads), and, when
/// options.dsinks / options.dbias are set, d(loss)/d(sinks) and d(loss)/d(bias). `options`
/// must hold the forward's options. Rows that saw no key get zero gradients; a NaN that a
/// row saw reaches that row's dQ and the dK, dV of the keys it saw, nothing else.
/// All tensors hold one storage type (float, bf16 or fp16), lse is float.
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
void backward(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v, const TensorView<O>& o,
              SavedLseView lse, const TensorView<DO>& dout, const TensorView<DQ>& dq, const TensorView<DK>& dk,
              const TensorView<DV>& dv, const BackwardOptions& options = {}) {
  if constexpr (detail::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>())
    detail::backward<DQ>(q, k, v, o, lse, dout, dq, dk, dv, options);
}

/// backward() with a plan from plan_backward (checked against the call).
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
void backward(const BackwardPlan& plan, const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
              const TensorView<O>& o, SavedLseView lse, const TensorView<DO>& dout, const TensorView<DQ>& dq,
              const TensorView<DK>& dk, const TensorView<DV>& dv, const BackwardOptions& options = {}) {
  if constexpr (detail::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>()) {
    detail::backward<DQ>(q, k, v, o, lse, dout, dq, dk, dv, options, nullptr, &plan);
  }
}

/// The plan backward(plan, q, k, v, ...) reuses: made from the views' shapes and the
/// options (the data are not read).
template <class Q, class K, class V>
BackwardPlan plan_backward(const TensorView<Q>& q, const TensorView<K>& k, const TensorView<V>& v,
                           const BackwardOptions& options = {}) {
  const bool slope = ops::BuiltinScores{}.has_slope(options.softcap);
  const BackwardShape shape =
      detail::backward_shape(q, k, v, q.shape[dim::batch], q.shape[dim::seqlen], k.shape[dim::seqlen], slope);
  return BackwardPlan(detail::backward_signature(shape, options));
}

/// backward() over packed variable-length batches (FlashAttention's varlen backward):
/// tensors as forward_varlen()'s, lse [heads_q, total_q].
template <class Q, class K, class V, class O, class DO, class DQ, class DK, class DV>
void backward_varlen(const PackedView<Q>& q, const PackedView<K>& k, const PackedView<V>& v,
                     const PackedView<O>& o, SavedPackedLseView lse, const PackedView<DO>& dout,
                     const PackedView<DQ>& dq, const PackedView<DK>& dk, const PackedView<DV>& dv,
                     const VarlenSequences& seqs, const BackwardOptions& options = {}) {
  if constexpr (detail::check_backward_element_types<Q, K, V, O, DO, DQ, DK, DV>())
    detail::backward_varlen<DQ>(q, k, v, o, lse, dout, dq, dk, dv, seqs, options);
}

}  // namespace tileattn

// The explicit instantiations of the backward for float, bf16 and fp16, as the forward's
// (forward.hpp): compiled once into tileattn::instantiations, extern in its users.
#define TILEATTN_INSTANTIATE_BACKWARD(KEYWORD, T)                                                      \
  KEYWORD template void tileattn::detail::backward<T>(                                                 \
      tileattn::TensorView<const T>, tileattn::TensorView<const T>, tileattn::TensorView<const T>,     \
      tileattn::TensorView<const T>, tileattn::SavedLseView, tileattn::TensorView<const T>,            \
      tileattn::TensorView<T>, tileattn::TensorView<T>, tileattn::TensorView<T>,                       \
      const tileattn::BackwardOptions&, const tileattn::kernels::SavedRowStats*,                       \
      const tileattn::BackwardPlan*);                                                                  \
  KEYWORD template void tileattn::detail::backward_varlen<T>(                                          \
      tileattn::PackedView<const T>, tileattn::PackedView<const T>, tileattn::PackedView<const T>,     \
      tileattn::PackedView<const T>, tileattn::SavedPackedLseView, tileattn::PackedView<const T>,      \
      tileattn::PackedView<T>, tileattn::PackedView<T>, tileattn::PackedView<T>,                       \
      const tileattn::VarlenSequences&, const tileattn::BackwardOptions&);

#if defined(TILEATTN_EXTERN_TEMPLATES)
TILEATTN_INSTANTIATE_BACKWARD(extern, float)
TILEATTN_INSTANTIATE_BACKWARD(extern, tileattn::bf16)
TILEATTN_INSTANTIATE_BACKWARD(extern, tileattn::fp16)
#endif
