// tileattn/ops/merge_states.hpp: combining partial attention results over disjoint key sets.
//
// A partial state is (O_c, LSE_c): a softmax-weighted average over one set of keys and the
// log of its softmax denominator. Over the union of the sets, LSE = log(sum_c e^LSE_c) and
// O = sum_c e^(LSE_c - LSE) O_c: exact, as the online softmax is (it is the online softmax
// with one "score" LSE_c and one "value row" O_c per state). merge_state_step folds one
// state's rows into running statistics and an accumulator, in the online softmax's own
// units (log2, ops/online_softmax.hpp), so ops::finalize_rows finishes the merge (and adds
// an attention sink once). A state with LSE -inf saw no key and adds nothing; a NaN LSE
// makes the row NaN.
#pragma once

#include <cmath>
#include <numbers>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::ops {

/// acc, stats += the state (o_c, lse_c) for each row: lse_c is natural-log, acc holds
/// sum 2^(lse_c log2(e) - max) O_c, stats the running max and sum in log2 units.
template <class AccTile, class StateTile>
void merge_state_step(AccTile& acc, RowStats& stats, const StateTile& o_c, const float* lse_c) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  for (index_t r = 0; r < acc.rows(); ++r) {
    const float l = lse_c[r] * log2e;
    if (l == negative_infinity) continue;
    const float m = stats.max[r];
    const float m_new = std::isnan(l) ? l : std::max(m, l);  // std::max keeps a NaN max
    const float rescale = m == negative_infinity ? 0.0f : arch::native::exp2(m - m_new);
    const float weight = arch::native::exp2(l - m_new);
    float* a = acc.row(r);
    const float* o = o_c.row(r);
    for (index_t c = 0; c < acc.cols(); ++c) a[c] = a[c] * rescale + weight * o[c];
    stats.sum[r] = stats.sum[r] * rescale + weight;
    stats.max[r] = m_new;
  }
}

}  // namespace tileattn::ops
