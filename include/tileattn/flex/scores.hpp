// tileattn/flex/scores.hpp: the score modifiers of flexible attention: the built-in
// options (ops/score_mods.hpp) joined by a user score_mod and mask_mod, compiled into the
// kernels' score step, and the block mask that lets the key loops skip empty tiles.
//
// Order on a score tile (raw Q K^T): the built-in softcap, bias and ALiBi; score_mod on
// softmax_scale * q.k (natural-log units, FlexAttention's order), its result turned into
// log2 units; the built-in window and boolean masks; then the mask_mod, per block: empty
// blocks hide every score, full ones none, partial ones ask the mask_mod per score. The
// kernels see the same interface as ScoreModifiers (window, apply, to_log2, skips,
// has_slope), so the forward and backward loops are the same code for both.
//
// It lives in flex/, above ops/ (it builds on ops/score_mods.hpp and flex's functors), and
// keeps the namespace of the score sources the kernels take: ops::FlexScores beside
// ops::BuiltinScores.
#pragma once

#include <algorithm>
#include <numbers>
#include <string>
#include <type_traits>

#include "tileattn/core/error.hpp"
#include "tileattn/flex/block_mask.hpp"
#include "tileattn/flex/mods.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::ops {

template <class ScoreMod>
inline constexpr bool modifies_scores_v = !std::is_same_v<ScoreMod, flex::no_score_mod>;
template <class MaskMod>
inline constexpr bool masks_scores_v = !std::is_same_v<MaskMod, flex::no_mask>;

/// One work item's modifiers: the built-in ones of the params and the user's functors.
template <class ScoreMod, class MaskMod>
class FlexModifiers {
 public:
  FlexModifiers(const ScoreModifiers& builtin, const ScoreMod& score_mod, const MaskMod& mask_mod,
                const BlockKinds* blocks, index_t sequence, float softmax_scale)
      : builtin_(builtin),
        score_mod_(&score_mod),
        mask_mod_(&mask_mod),
        blocks_(blocks),
        sequence_(sequence),
        to_natural_(builtin.converts_to_log2() ? std::numbers::ln2_v<float> : softmax_scale) {}

  const KeyWindow& window() const { return builtin_.window(); }
  float to_log2() const { return modifies_scores_v<ScoreMod> ? 1.0f : builtin_.to_log2(); }
  bool has_slope() const { return builtin_.has_slope() || modifies_scores_v<ScoreMod>; }

  /// True when the tile (rows x keys [col0, col0 + cols)) hides every score: each block it
  /// overlaps is empty, or partial with the mask_mod hiding the tile's part of it (asked
  /// before anything is loaded, stopping at the first visible score: a causal diagonal
  /// block's hidden corner tiles are skipped as empty blocks are). Never without a block mask.
  bool skips(const PackedRows& rows, index_t col0, index_t cols) const {
    if (!blocks_ || cols <= 0) return false;
    bool full = false, partial = false;
    for_blocks(rows, col0, cols, [&](index_t, index_t, index_t, index_t, index_t, BlockKind k) {
      full = full || k == BlockKind::full;
      partial = partial || k == BlockKind::partial;
    });
    if (full || (partial && !masks_scores_v<MaskMod>)) return false;
    if (!partial) return true;
    bool visible = false;
    for_blocks(rows, col0, cols, [&](index_t, index_t r0, index_t r1, index_t c0, index_t c1, BlockKind k) {
      if (visible || k != BlockKind::partial) return;
      for (index_t r = r0; r < r1 && !visible; ++r)
        for (index_t j = c0; j < c1 && !visible; ++j)
          visible = (*mask_mod_)(sequence_, rows.head(r), rows.position(r), col0 + j);
    });
    return !visible;
  }

  /// Calls f(lo, hi) for each run [lo, hi) of the positions [p_lo, p_hi) of `head` whose
  /// query blocks are not all empty over keys [col0, col0 + cols): the rows a key tile is
  /// computed for, at block granularity (as the window narrows rows exactly). A query tile
  /// spans several query blocks; without this a block-sparse key tile would be computed for
  /// all its rows whenever one block under it is not empty. Without a block mask: f(p_lo, p_hi).
  template <class F>
  void for_row_runs(index_t head, index_t p_lo, index_t p_hi, index_t col0, index_t cols, F&& f) const {
    if (p_lo >= p_hi) return;
    if (!blocks_) {
      f(p_lo, p_hi);
      return;
    }
    const BlockKinds& k = *blocks_;
    index_t run = -1;  // first position of the open run; -1: none open
    for (index_t qb = p_lo / k.block.q; qb * k.block.q < p_hi; ++qb) {
      const index_t q0 = std::max(p_lo, qb * k.block.q);
      bool any = false;
      for (index_t kb = col0 / k.block.kv; kb * k.block.kv < col0 + cols && !any; ++kb)
        any = k(sequence_, head, qb, kb) != BlockKind::empty;
      if (any && run < 0) {
        run = q0;
      } else if (!any && run >= 0) {
        f(run, q0);
        run = -1;
      }
    }
    if (run >= 0) f(run, p_hi);
  }

  /// Every modifier on the raw scores s (keys [col0, col0 + s.cols())); with `slope` (the
  /// backward), the derivative of the modified score by softmax_scale * q.k.
  template <class ScoreTile, class Io>
  void apply(ScoreTile& s, const PackedRows& rows, index_t col0, Io& io, ScoreTile* slope = nullptr) const {
    builtin_.apply_values(s, rows, col0, io, slope);
    if constexpr (modifies_scores_v<ScoreMod>) apply_score_mod(s, rows, col0, slope);
    builtin_.apply_masks(s, rows, col0, io);
    if constexpr (masks_scores_v<MaskMod>) apply_mask_mod(s, rows, col0);
    else if (blocks_) apply_block_kinds(s, rows, col0);
    if constexpr (modifies_scores_v<ScoreMod>)
      if (slope) clear_hidden_slopes(s, *slope);
  }

 private:
  static constexpr float log2e = std::numbers::log2e_v<float>;

  /// Calls f(g, r0, r1, c0, c1, kind) for each head g of the rows and each block the tile
  /// overlaps: rows [r0, r1) of the tile (head g's), keys [c0, c1) as tile columns.
  template <class F>
  void for_blocks(const PackedRows& rows, index_t col0, index_t cols, F&& f) const {
    const BlockKinds& k = *blocks_;
    const index_t p0 = rows.position0, p1 = rows.position0 + rows.positions;
    for (index_t g = 0; g < rows.heads; ++g)
      for (index_t qb = p0 / k.block.q; qb * k.block.q < p1; ++qb) {
        const index_t q0 = std::max(p0, qb * k.block.q), q1 = std::min(p1, (qb + 1) * k.block.q);
        for (index_t kb = col0 / k.block.kv; kb * k.block.kv < col0 + cols; ++kb) {
          const index_t c0 = std::max(col0, kb * k.block.kv), c1 = std::min(col0 + cols, (kb + 1) * k.block.kv);
          f(g, g * rows.positions + q0 - p0, g * rows.positions + q1 - p0, c0 - col0, c1 - col0,
            k(sequence_, rows.head0 + g, qb, kb));
        }
      }
  }

  /// s := score_mod(s in natural units) in log2 units; slope *= its derivative.
  template <class ScoreTile>
  void apply_score_mod(ScoreTile& s, const PackedRows& rows, index_t col0, ScoreTile* slope) const {
    const bool chained = slope && builtin_.has_slope();  // the softcap's slope is already there
    if (slope && !chained) slope->set_extent(s.rows(), s.cols());
    for (index_t r = 0; r < s.rows(); ++r) {
      const index_t h = rows.head(r), i = rows.position(r);
      float* row = s.row(r);
      for (index_t j = 0; j < s.cols(); ++j) {
        const float x = row[j] * to_natural_;
        row[j] = static_cast<float>((*score_mod_)(x, sequence_, h, i, col0 + j)) * log2e;
        if constexpr (score_mod_with_grad<ScoreMod>) {  // the forward takes score_mods without one
          if (slope) {
            const auto d = static_cast<float>(score_mod_->grad(x, sequence_, h, i, col0 + j));
            (*slope)(r, j) = chained ? (*slope)(r, j) * d : d;
          }
        }
      }
    }
  }

  /// Hides scores where the mask_mod says so: in every score without a block mask, else
  /// per block (empty: all, full: none, partial: the mask_mod's).
  template <class ScoreTile>
  void apply_mask_mod(ScoreTile& s, const PackedRows& rows, index_t col0) const {
    if (!blocks_) {
      evaluate_mask(s, rows, col0, 0, s.rows(), 0, s.cols());
      return;
    }
    for_blocks(rows, col0, s.cols(), [&](index_t, index_t r0, index_t r1, index_t c0, index_t c1, BlockKind k) {
      if (k == BlockKind::empty) hide(s, r0, r1, c0, c1);
      else if (k == BlockKind::partial) evaluate_mask(s, rows, col0, r0, r1, c0, c1);
    });
  }
  /// The block mask of flex::no_mask: only its empty blocks hide (it may have been edited).
  template <class ScoreTile>
  void apply_block_kinds(ScoreTile& s, const PackedRows& rows, index_t col0) const {
    for_blocks(rows, col0, s.cols(), [&](index_t, index_t r0, index_t r1, index_t c0, index_t c1, BlockKind k) {
      if (k == BlockKind::empty) hide(s, r0, r1, c0, c1);
    });
  }
  template <class ScoreTile>
  static void hide(ScoreTile& s, index_t r0, index_t r1, index_t c0, index_t c1) {
    for (index_t r = r0; r < r1; ++r) std::fill(s.row(r) + c0, s.row(r) + c1, negative_infinity);
  }
  template <class ScoreTile>
  void evaluate_mask(ScoreTile& s, const PackedRows& rows, index_t col0, index_t r0, index_t r1, index_t c0,
                     index_t c1) const {
    for (index_t r = r0; r < r1; ++r) {
      const index_t h = rows.head(r), i = rows.position(r);
      float* row = s.row(r);
      for (index_t j = c0; j < c1; ++j)
        if (!(*mask_mod_)(sequence_, h, i, col0 + j)) row[j] = negative_infinity;
    }
  }
  /// A hidden score's slope is 0: dS is 0 there, and the score_mod's derivative at a
  /// position it never saw may be Inf or NaN.
  template <class ScoreTile>
  static void clear_hidden_slopes(const ScoreTile& s, ScoreTile& slope) {
    for (index_t r = 0; r < s.rows(); ++r)
      for (index_t j = 0; j < s.cols(); ++j)
        if (s(r, j) == negative_infinity) slope(r, j) = 0.0f;
  }

  ScoreModifiers builtin_;
  const ScoreMod* score_mod_;
  const MaskMod* mask_mod_;
  const BlockKinds* blocks_;  // nullptr: no block mask
  index_t sequence_;
  float to_natural_;  // scores after the built-in values times this: natural-log units
};

/// The kernels' source of a work item's modifiers for a flexible-attention call.
template <class ScoreMod, class MaskMod>
struct FlexScores {
  const ScoreMod* score_mod;
  const MaskMod* mask_mod;
  const BlockKinds* blocks = nullptr;

  template <class P>
  FlexModifiers<ScoreMod, MaskMod> operator()(const P& p, index_t sequence, const SequenceRange& seq) const {
    return {ScoreModifiers(p, sequence, seq), *score_mod, *mask_mod, blocks, sequence, p.softmax_scale};
  }
  bool has_slope(float softcap) const { return softcap > 0 || modifies_scores_v<ScoreMod>; }
  /// A block mask's key block: panels no wider, so that the tiles it leaves empty are skipped.
  index_t key_tile_limit() const { return blocks ? blocks->block.kv : 0; }

  /// A query tile's work estimate (ForwardWorkList, which runs the costliest tiles first):
  /// of the `window_keys` keys from `first` the window leaves rows [row0, row0 + rows) of
  /// sequence b, those in key blocks some head's query blocks there do not leave empty.
  index_t estimate_keys(index_t b, index_t row0, index_t rows, index_t first, index_t window_keys) const {
    if (!blocks || window_keys <= 0 || rows <= 0) return window_keys;
    const BlockKinds& k = *blocks;
    const index_t end = first + window_keys;
    index_t keys = 0;
    for (index_t kb = first / k.block.kv; kb * k.block.kv < end; ++kb) {
      bool seen = false;
      for (index_t h = 0; h < k.heads && !seen; ++h)
        for (index_t qb = row0 / k.block.q; qb * k.block.q < row0 + rows && !seen; ++qb)
          seen = k(b, h, qb, kb) != BlockKind::empty;
      if (seen) keys += std::min(end, (kb + 1) * k.block.kv) - std::max(first, kb * k.block.kv);
    }
    return keys;
  }

  /// The block mask must cover the call: batch and heads (or 1), the longest sequences
  /// exactly; the backward cannot give dbias through a score_mod.
  template <class P>
  void check(const P& p, index_t max_seqlen_q, index_t max_seqlen_k) const {
    if constexpr (modifies_scores_v<ScoreMod> && requires { p.dbias; })
      TILEATTN_REQUIRE(!p.dbias.data, "dbias",
                       "is not computed with a score_mod (give the bias as a score_mod, or run without dbias)");
    if constexpr (requires { mask_mod->check_call(p); })
      mask_mod->check_call(p);  // a mask made for one call's sequences (flex::draft_tree)
    if (!blocks) return;
    const BlockKinds& k = *blocks;
    TILEATTN_REQUIRE(k.batch == 1 || k.batch == p.batch(), "block_mask",
                     "batch must be 1 or the call's " + std::to_string(p.batch()) + ", got " + std::to_string(k.batch));
    TILEATTN_REQUIRE(k.heads == 1 || k.heads == p.heads(), "block_mask",
                     "heads must be 1 or the call's heads_q " + std::to_string(p.heads()) + ", got " +
                         std::to_string(k.heads));
    TILEATTN_REQUIRE(k.seqlen_q == max_seqlen_q && k.seqlen_k == max_seqlen_k, "block_mask",
                     "was built for " + std::to_string(k.seqlen_q) + " x " + std::to_string(k.seqlen_k) +
                         " positions, the call has " + std::to_string(max_seqlen_q) + " x " +
                         std::to_string(max_seqlen_k) + " (varlen: max_seqlen_q x max_seqlen_k)");
  }
};

}  // namespace tileattn::ops
