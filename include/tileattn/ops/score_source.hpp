// tileattn/ops/score_source.hpp: the contract of a score-modifier source and of the score
// modifiers it gives, as concepts: what the forward and backward loops (kernels/forward.hpp,
// kernels/backward.hpp), the forward's work list and the entry points ask of `Scores` and
// of the `mods` it returns. ops::BuiltinScores (ops/score_mods.hpp) and ops::FlexScores
// (flexible attention) are the two sources; a plug-in that lacks a member fails at the
// kernel's template head with one of these names, not deep inside the key loop.
//
//   score_source<S, P>                  scores(p, sequence, range) gives a work item's
//                                       modifiers; scores.check(p, max_seqlen_q, max_seqlen_k)
//                                       validates the call (the entry points run it first).
//   score_modifiers<M, Io>              what both loops ask of the modifiers: window(),
//                                       to_log2(), skips(rows, col0, cols), apply(s, rows, col0, io).
//   forward_score_modifiers<M, Io>      and for_row_runs(head, p_lo, p_hi, col0, cols, f).
//   backward_score_modifiers<M, Io>     and has_slope(), apply(..., io, &slope).
//   forward_score_source<S, P, Io>      a source for ForwardParams P whose modifiers are
//                                       forward_score_modifiers, with estimate_keys(b, row0,
//                                       rows, first, window_keys) for the work list.
//   backward_score_source<S, P, Io>     a source for BackwardParams P whose modifiers are
//                                       backward_score_modifiers, with has_slope(softcap).
//
// Io is the kernel's IO policy (memory/io_policy.hpp); the modifiers report the bias and
// mask elements they read to it.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::ops {

namespace detail {
/// Stands for the callable the forward gives for_row_runs: f(lo, hi) per run of positions.
struct RowRunCallback {
  void operator()(index_t, index_t) const;
};
}  // namespace detail

/// The modifiers a source gives for params P: the type of scores(p, sequence, range).
template <class S, class P>
using score_modifiers_t = std::remove_cvref_t<decltype(std::declval<const S&>()(
    std::declval<const P&>(), std::declval<index_t>(), std::declval<const SequenceRange&>()))>;

/// A source of each work item's score modifiers, for params P (ForwardParams or BackwardParams).
template <class S, class P>
concept score_source = requires(const S& scores, const P& p, index_t sequence, const SequenceRange& range,
                                index_t max_seqlen_q, index_t max_seqlen_k) {
  scores(p, sequence, range);
  scores.check(p, max_seqlen_q, max_seqlen_k);
};

/// What the forward and backward loops both ask of one work item's modifiers, on a float
/// score tile s whose columns are keys [col0, col0 + s.cols()).
template <class M, class Io>
concept score_modifiers = requires(const M& mods, Tile<float>& s, const PackedRows& rows, index_t col0,
                                   index_t cols, Io& io) {
  { mods.window() } -> std::convertible_to<const KeyWindow&>;
  { mods.to_log2() } -> std::convertible_to<float>;
  { mods.skips(rows, col0, cols) } -> std::convertible_to<bool>;
  mods.apply(s, rows, col0, io);
};

/// The forward's modifiers: also the runs of a head's positions a key tile is computed for.
template <class M, class Io>
concept forward_score_modifiers =
    score_modifiers<M, Io> && requires(const M& mods, index_t head, index_t p_lo, index_t p_hi, index_t col0,
                                       index_t cols, detail::RowRunCallback f) {
      mods.for_row_runs(head, p_lo, p_hi, col0, cols, f);
    };

/// The backward's modifiers: also whether the modified score has a derivative (softcap, a
/// score_mod), which apply writes to `slope` when given.
template <class M, class Io>
concept backward_score_modifiers =
    score_modifiers<M, Io> &&
    requires(const M& mods, Tile<float>& s, Tile<float>* slope, const PackedRows& rows, index_t col0, Io& io) {
      { mods.has_slope() } -> std::convertible_to<bool>;
      mods.apply(s, rows, col0, io, slope);
    };

/// A source for the forward (run_forward, ForwardWorkList) over ForwardParams P.
template <class S, class P, class Io = NoIoCounting>
concept forward_score_source =
    score_source<S, P> && forward_score_modifiers<score_modifiers_t<S, P>, Io> &&
    requires(const S& scores, index_t sequence, index_t row0, index_t rows, index_t first, index_t window_keys) {
      { scores.estimate_keys(sequence, row0, rows, first, window_keys) } -> std::convertible_to<index_t>;
      { scores.key_tile_limit() } -> std::convertible_to<index_t>;
    };

/// A source for the backward (run_backward) over BackwardParams P.
template <class S, class P, class Io = NoIoCounting>
concept backward_score_source =
    score_source<S, P> && backward_score_modifiers<score_modifiers_t<S, P>, Io> &&
    requires(const S& scores, float softcap) {
      { scores.has_slope(softcap) } -> std::convertible_to<bool>;
    };

static_assert(forward_score_source<BuiltinScores, ForwardParams<float>, NoIoCounting>);
static_assert(forward_score_source<BuiltinScores, ForwardParams<float>, CountingIo>);
static_assert(backward_score_source<BuiltinScores, BackwardParams<float>, NoIoCounting>);
static_assert(backward_score_source<BuiltinScores, BackwardParams<float>, CountingIo>);

}  // namespace tileattn::ops
