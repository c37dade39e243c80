// tileattn/ops/merge_states.hpp: combining partial attention results over disjoint key sets.
//
// A partial state is O_c, a softmax-weighted average over one set of keys, with the row
// statistics of its softmax (RowStats): the max m_c of its scores and the sum l_c of
// 2^(score - m_c), in log2 units (ops/online_softmax.hpp). Over the union of the sets,
// m = max_c m_c, l = sum_c l_c 2^(m_c - m) and O = sum_c l_c 2^(m_c - m) O_c / l: exact, as
// the online softmax is (it is the online softmax with one "score" m_c of multiplicity l_c
// and one "value row" O_c per state). merge_state_step folds one state's rows into running
// statistics and an accumulator, so ops::finalize_rows finishes the merge (and adds an
// attention sink once).
//
// Two sources give states. Split-KV stores m_c and l_c apart, exactly as its chunk's online
// softmax left them, so a split row is the unsplit one within rounding at every score
// magnitude. (One float LSE = (m_c + log2 l_c) ln 2 per row would not do: its rounding,
// about |m_c| 2^-24, becomes the chunk's relative weight error, 0.4% at scores of 1e5, and
// at 1e30 log2 l_c is lost whole.) merge_states takes the user's natural-log LSE_c, which
// is the state (LSE_c log2(e), 1) (lse_as_row_stats). A state with m_c = -inf saw no key
// and adds nothing, unless l_c is NaN (a chunk whose only visible scores were NaN); a NaN
// m_c or l_c makes the row NaN.
#pragma once

#include <cmath>
#include <numbers>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::ops {

/// Rows whose stats.max holds natural-log LSEs become the states (LSE log2(e), 1).
inline void lse_as_row_stats(RowStats& stats, index_t rows) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  for (index_t r = 0; r < rows; ++r) {
    stats.max[r] *= log2e;
    stats.sum[r] = 1.0f;
  }
}

/// How one state's row (m_c, l_c) folds into a row's running statistics (m, l), in log2
/// units: adds is false for a state that saw no key (m_c = -inf, l_c not NaN), which
/// changes nothing; otherwise (m, l) become the merged statistics, and the running
/// accumulator's row is to be scaled by rescale and the state's row by weight.
struct MergeWeights {
  bool adds;
  float rescale, weight;
};

inline MergeWeights merge_row_stats(float& m, float& l, float m_c, float l_c) {
  if (m_c == negative_infinity && !std::isnan(l_c)) return {false, 1.0f, 0.0f};  // saw no key
  const float m_new = std::isnan(m_c) ? m_c : std::max(m, m_c);  // std::max keeps a NaN max
  const float rescale = m == negative_infinity ? 0.0f : arch::native::exp2(m - m_new);
  const float weight = l_c * arch::native::exp2(m_c - m_new);
  l = arch::native::mul_add(l, rescale, weight);
  m = m_new;
  return {true, rescale, weight};
}

/// acc, stats += the state (o_c, state) for each row: acc holds sum_c l_c 2^(m_c - max) O_c,
/// stats the running max and sum in log2 units.
template <class AccTile, class StateTile>
void merge_state_step(AccTile& acc, RowStats& stats, const StateTile& o_c, const RowStats& state) {
  for (index_t r = 0; r < acc.rows(); ++r) {
    const MergeWeights w = merge_row_stats(stats.max[r], stats.sum[r], state.max[r], state.sum[r]);
    if (!w.adds) continue;
    float* a = acc.row(r);
    const float* o = o_c.row(r);
    for (index_t c = 0; c < acc.cols(); ++c) a[c] = a[c] * w.rescale + w.weight * o[c];
  }
}

}  // namespace tileattn::ops
