// tileattn/ops/online_softmax.hpp: the online softmax of FlashAttention on score tiles:
// running row max and sum, rescaling of the output accumulator, the final normalization
// and log-sum-exp.
//
// Scores arrive in log2 units (the kernel folds softmax_scale * log2(e) into Q once per
// tile), so every exponential is a cheap 2^x.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/tile.hpp"

namespace tileattn::ops {

inline constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

/// Per-row running statistics of one query tile: max of scores seen (log2 units) and the
/// sum of 2^(score - max).
struct RowStats {
  TileVector<float> max;
  TileVector<float> sum;

  static constexpr std::size_t footprint(index_t rows) {
    return 2 * TileVector<float>::footprint(rows);
  }
  static RowStats carve(ScratchArena& arena, index_t rows) {
    return {TileVector<float>::carve(arena, rows), TileVector<float>::carve(arena, rows)};
  }
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

/// One key tile's step: s becomes P = 2^(s - new max); stats and the output accumulator o
/// are rescaled by 2^(old max - new max). Rows with every score so far masked keep P = 0.
template <class ScoreTile, class AccTile>
void online_softmax_step(ScoreTile& s, RowStats& stats, AccTile& o) {
  for (index_t i = 0; i < s.rows(); ++i) {
    float* p = s.row(i);
    const float old_max = stats.max[i];
    const float new_max = std::max(old_max, arch::native::row_max(p, s.cols()));
    if (new_max == negative_infinity) {
      std::fill_n(p, s.cols(), 0.0f);
      continue;
    }
    const float row_sum = arch::native::exp2_shift_sum(p, s.cols(), new_max);
    if (old_max != new_max) {
      const float correction = arch::native::exp2(old_max - new_max);
      stats.sum[i] *= correction;
      arch::native::scale(o.row(i), o.cols(), correction);
    }
    stats.sum[i] += row_sum;
    stats.max[i] = new_max;
  }
}

/// Deferred normalization: o /= sum, and lse = ln(sum) + max in natural-log units. A sink
/// (a logit in log2 units that joins the denominator without a value; -inf: none) may be given. Rows
/// that saw no unmasked key get o = 0 and lse = -inf (or the sink's logit).
template <class AccTile>
void finalize_rows(AccTile& o, const RowStats& stats, float* lse, const float* sink = nullptr) {
  constexpr float ln2 = std::numbers::ln2_v<float>;
  for (index_t i = 0; i < o.rows(); ++i) {
    float max = stats.max[i], sum = stats.sum[i], o_factor = 1.0f;
    if (sink && *sink != negative_infinity) {  // fold 2^(sink - max) into the sum, under the larger maximum
      const float new_max = std::max(max, *sink);
      o_factor = arch::native::exp2(max - new_max);
      sum = sum * o_factor + arch::native::exp2(*sink - new_max);
      max = new_max;
    }
    if (sum == 0.0f) {
      std::fill_n(o.row(i), o.cols(), 0.0f);
      lse[i] = negative_infinity;
      continue;
    }
    arch::native::scale(o.row(i), o.cols(), o_factor / sum);
    lse[i] = (max + std::log2(sum)) * ln2;
  }
}

}  // namespace tileattn::ops
