// tileattn/ops/online_softmax.hpp: the online softmax of FlashAttention on score tiles:
// running row max and sum, rescaling of the output accumulator, the final normalization
// and log-sum-exp.
//
// Units. The running max and the sum live in log2 units (softmax_scale * log2(e) times a
// raw score), so every exponential is a cheap 2^x. Score tiles arrive either raw (Q K^T)
// or already in log2 units (when a score modifier converted them); the step takes the
// factor `to_log2` that turns them into log2 units and applies it inside the exponent's
// fused multiply-add, 2^(s * to_log2 - max), as FlashAttention does: Q is never rounded
// after a scaling, and the plain path costs no extra pass over S.
//
// NaN and masking. A masked score is -inf and adds nothing. A NaN score that a row sees
// makes the row's O and LSE NaN, whatever the tiling: when every score a row has seen is
// -inf or NaN the running max stays -inf, so the step checks for NaN itself there and
// poisons the running sum.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/scratch_arena.hpp"

namespace tileattn::ops {

inline constexpr float negative_infinity = -std::numeric_limits<float>::infinity();
inline constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();

/// Per-row running statistics of one query tile: max of the scores seen (log2 units) and
/// the sum of 2^(score - max); a NaN sum marks a row that saw a NaN score.
struct RowStats {
  TileVector<float> max;
  TileVector<float> sum;

  /// The scratch pieces, in carving order (memory/scratch_arena.hpp, PieceBytes).
  template <class Piece>
  constexpr void pieces(Piece& piece, index_t rows) {
    piece(max, rows);
    piece(sum, rows);
  }
  static constexpr std::size_t footprint(index_t rows) { return pieces_bytes<RowStats>(rows); }
  static RowStats carve(ScratchArena& arena, index_t rows) { return carve_pieces<RowStats>(arena, rows); }
  RowStats slice(index_t first, index_t count) const {
    return {max.slice(first, count), sum.slice(first, count)};
  }
  void reset(index_t rows) {
    std::fill_n(max.data(), rows, negative_infinity);
    std::fill_n(sum.data(), rows, 0.0f);
  }
};

template <class AnyTile>
void fill(AnyTile& t, typename AnyTile::element_type value) {
  for (index_t r = 0; r < t.rows(); ++r) std::fill_n(t.row(r), t.cols(), value);
}

template <class AnyTile>
void scale(AnyTile& t, float factor) {
  for (index_t r = 0; r < t.rows(); ++r) arch::native::scale(t.row(r), t.cols(), factor);
}

/// t[r, j] *= factors[j] for every row: a key tile's dequantization scales applied to the
/// scores (K's) or the probabilities (V's) of 8-bit K and V.
template <class AnyTile>
void scale_columns(AnyTile& t, const float* factors) {
  for (index_t r = 0; r < t.rows(); ++r) {
    float* row = t.row(r);
    for (index_t j = 0; j < t.cols(); ++j) row[j] *= factors[j];
  }
}

/// True when no element of the tile is Inf or NaN.
template <class AnyTile>
bool all_finite(const AnyTile& t) {
  for (index_t r = 0; r < t.rows(); ++r)
    if (!arch::native::all_finite(t.row(r), t.cols())) return false;
  return true;
}

/// 2^(s c - max) with s c exact inside the FMA leaves the row's largest score with
/// 2^(its rounding error): harmless while max is small, but past 2^24 that error exceeds 1
/// and reaches +-1024 near 2^34, where 2^x overflows. Rows whose max (log2 units) is this
/// large, a softmax that is one-hot in float anyway, round s c first instead, so their
/// largest score gets exactly 2^0.
inline constexpr float exact_shift_limit = 16777216.0f;  // 2^24

namespace detail {
/// A row that has seen nothing but -inf and NaN scores: P = 0, and a NaN poisons the sum.
inline void mask_row(float* p, index_t n, float& sum) {
  if (std::any_of(p, p + n, [](float x) { return std::isnan(x); })) sum = quiet_nan;
  std::fill_n(p, n, 0.0f);
}
}  // namespace detail

/// One key tile's step: s (scores times 1 / to_log2 in log2 units) becomes
/// P = 2^(s * to_log2 - new max); stats and the output accumulator o are rescaled by
/// 2^(old max - new max). Rows whose scores so far are all masked keep P = 0. Rows go to
/// the exponential in blocks, so one call serves many rows. With a pair tile `p`, P is
/// written there instead, rounded to bf16 (the operand of a bf16 P V; s's contents are
/// then unspecified), in the same pass.
template <class ScoreTile, class AccTile>
void online_softmax_step(ScoreTile& s, RowStats& stats, AccTile& o, float to_log2,
                         Tile<bf16x2>* p = nullptr) {
  if (p) p->set_extent(s.rows(), (s.cols() + 1) / 2);
  constexpr index_t block = 32;
  float factor[block], shift[block], sums[block];
  bool seen[block];  // false: nothing but -inf and NaN so far
  for (index_t r0 = 0; r0 < s.rows(); r0 += block) {
    const index_t rows = std::min(block, s.rows() - r0);
    for (index_t k = 0; k < rows; ++k) {
      float* p = s.row(r0 + k);
      const float new_max = std::max(stats.max[r0 + k], arch::native::row_max(p, s.cols()) * to_log2);
      seen[k] = new_max != negative_infinity;
      factor[k] = to_log2;
      shift[k] = seen[k] ? new_max : -negative_infinity;  // +inf: P = 2^-inf = 0
      if (!seen[k]) detail::mask_row(p, s.cols(), stats.sum[r0 + k]);
      if (seen[k] && std::abs(new_max) >= exact_shift_limit && to_log2 != 1.0f) {  // see exact_shift_limit
        arch::native::scale(p, s.cols(), to_log2);
        factor[k] = 1.0f;
      }
    }
    arch::native::exp2_shift_sum_rows(s.row(r0), s.ld(), rows, s.cols(), factor, shift, sums,
                                      p ? p->row(r0) : nullptr, p ? p->ld() : 0);
    for (index_t k = 0; k < rows; ++k) {
      const index_t i = r0 + k;
      if (!seen[k]) continue;
      if (const float old_max = stats.max[i]; old_max != shift[k]) {
        const float correction = arch::native::exp2(old_max - shift[k]);
        stats.sum[i] *= correction;
        arch::native::scale(o.row(i), o.cols(), correction);
      }
      stats.sum[i] += sums[k];
      stats.max[i] = shift[k];
    }
  }
}

namespace detail {
/// Value (key j, column c) of a V tile: float, or one half of a bf16 row pair.
inline float value_at(const Tile<float>& v, index_t j, index_t c) { return v(j, c); }
template <class E>
float value_at(const RowRefs<E>& v, index_t j, index_t c) { return to_float(v(j, c)); }
inline float value_at(const Tile<bf16x2>& v, index_t j, index_t c) {
  const bf16x2 pair = v(j / 2, c);
  return to_float(j % 2 ? pair.hi : pair.lo);
}
/// A probability as the P V product sees it: as is, or rounded to bf16 for pair tiles.
inline float probability_as(const Tile<float>&, float p) { return p; }
template <class E>
float probability_as(const RowRefs<E>&, float p) { return p; }
inline float probability_as(const Tile<bf16x2>&, float p) { return to_float(bf16(p)); }
}  // namespace detail

/// The step and o += P V for a V tile that holds an Inf or a NaN: row by row, P V sums only
/// the keys the row sees (score != -inf), so such a value reaches exactly the rows that see
/// its key, never a row that a mask hides it from (0 * NaN), whatever the tiling. Each
/// row's sum runs over the keys in order with the running set's multiply-add (mul_add:
/// fused, or two roundings where generic runs without FMA), as its float gemm sums (bf16
/// pair tiles: P rounded to bf16 as in their product; the sum's order differs from
/// vdpbf16ps's in the last bits).
namespace detail {
/// The visible-values step's default treatment of a row's probabilities: none.
struct KeepAll {
  template <class RowTile>
  void operator()(RowTile&, index_t, float = 1.0f, index_t = 0) const {}
};
}  // namespace detail

/// `drop(row, keys, 1, i)` is called on each row's P (a 1-row tile) after its step and
/// before P V: dropout (ops/dropout.hpp) multiplies P by 0 there; a dropped key stays visible, so an
/// Inf or NaN value of it still reaches the row (0 * Inf), as in PyTorch's dropout(P) V.
template <class ScoreTile, class AccTile, class ValueTile, class Drop = detail::KeepAll>
void online_softmax_step_visible_values(ScoreTile& s, RowStats& stats, AccTile& o,
                                        const ValueTile& v, float to_log2,
                                        const float* value_scales = nullptr, const Drop& drop = {}) {
  thread_local std::vector<unsigned char> visible;  // one row's keys: this rare path's only buffer
  visible.resize(static_cast<std::size_t>(s.cols()));
  for (index_t i = 0; i < s.rows(); ++i) {
    ScoreTile s_row = s.slice_rows(i, 1);
    AccTile o_row = o.slice_rows(i, 1);
    RowStats row_stats = stats.slice(i, 1);
    const float* p = s_row.row(0);
    for (index_t j = 0; j < s.cols(); ++j) visible[static_cast<std::size_t>(j)] = p[j] != negative_infinity;
    online_softmax_step(s_row, row_stats, o_row, to_log2);
    drop(s_row, s.cols(), 1.0f, i);
    float* out = o_row.row(0);
    for (index_t j = 0; j < s.cols(); ++j) {
      if (!visible[static_cast<std::size_t>(j)]) continue;
      float pj = detail::probability_as(v, p[j]);
      if (value_scales) pj *= value_scales[j];
      for (index_t c = 0; c < o_row.cols(); ++c) out[c] = arch::native::mul_add(pj, detail::value_at(v, j, c), out[c]);
    }
  }
}

/// o /= sum alone: a split-KV chunk's partial O, stored beside its max and sum (the merge
/// weighs it by them). Rows that saw no unmasked key get o = 0; rows that saw a NaN get NaN.
template <class AccTile>
void normalize_rows(AccTile& o, const RowStats& stats) {
  for (index_t i = 0; i < o.rows(); ++i) {
    if (stats.sum[i] == 0.0f) std::fill_n(o.row(i), o.cols(), 0.0f);
    else arch::native::scale(o.row(i), o.cols(), 1.0f / stats.sum[i]);
  }
}

/// Deferred normalization of one row: o (cols values) /= sum, and lse = ln(sum) + max in
/// natural-log units. A sink (a logit in log2 units that joins the denominator without a
/// value; -inf: none) may be given. A row that saw no unmasked key gets o = 0 and lse = -inf
/// (or the sink's logit); a row that saw a NaN gets NaN. o_scale multiplies o besides
/// (dropout's 1 / (1 - p), folded into the one scaling). max and sum end as the row's final
/// statistics, the sink folded in, which the backward reads where the float LSE cannot carry
/// them (kernels/backward.hpp).
inline void finalize_row(float* o, index_t cols, float& max, float& sum, float& lse, const float* sink = nullptr,
                         float o_scale = 1.0f) {
  constexpr float ln2 = std::numbers::ln2_v<float>;
  float o_factor = 1.0f;
  if (sink && *sink != negative_infinity) {  // fold 2^(sink - max) into the sum, under the larger maximum
    const float new_max = std::max(max, *sink);
    o_factor = arch::native::exp2(max - new_max);
    sum = arch::native::mul_add(sum, o_factor, arch::native::exp2(*sink - new_max));
    max = new_max;
  }
  if (sum == 0.0f) {
    std::fill_n(o, cols, 0.0f);
    lse = negative_infinity;
    return;
  }
  arch::native::scale(o, cols, o_factor / sum * o_scale);
  lse = (max + std::log2(sum)) * ln2;
}

/// finalize_row for each row of a tile; `stats` (a view: RowStats are tiles) ends as the
/// rows' final statistics.
template <class AccTile>
void finalize_rows(AccTile& o, RowStats stats, float* lse, const float* sink = nullptr, float o_scale = 1.0f) {
  for (index_t i = 0; i < o.rows(); ++i)
    finalize_row(o.row(i), o.cols(), stats.max[i], stats.sum[i], lse[i], sink, o_scale);
}

}  // namespace tileattn::ops
