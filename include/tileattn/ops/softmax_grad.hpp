// tileattn/ops/softmax_grad.hpp: the backward's tile steps around the softmax: P recomputed
// from the forward's log-sum-exp (no running max: the LSE is the final one), the row dots
// D = rowsum(dO * O), and dS = P * (dP - D).
//
// Units as in ops/online_softmax.hpp: score tiles arrive raw or in log2 units, and
// `to_log2` turns them into log2 units; the LSE given here is in log2 units too
// (lse * log2(e)), so P = 2^(s * to_log2 - lse2) costs one fused multiply-add and a 2^x.
//
// Masking and NaN. A masked score is -inf and its P is exactly 0, whatever the row's LSE
// (a row that saw a NaN has LSE NaN, yet its masked keys get no gradient); dS is exactly
// 0 wherever P is, so an Inf or NaN in dP = dO V^T at a key the row does not see reaches
// nothing. A row that saw no key (LSE -inf) has P = 0 everywhere: zero gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::ops {

/// s := P = 2^(s * to_log2 - lse2[r]) row by row (lse2: the rows' LSE in log2 units), or,
/// with `low` (the forward's row statistics: lse2 = max, low = log2(sum)),
/// P = 2^((s * to_log2 - lse2[r]) - low[r]), the difference to the max taken exactly first,
/// so that P keeps its bits at any score magnitude. Rows whose LSE is -inf get P = 0; rows
/// whose LSE is NaN get NaN where the score is not -inf. Rows with a huge LSE round
/// s * to_log2 first, as the forward did for them (exact_shift_limit), so their largest
/// score still gets 2^0.
template <class ScoreTile>
void recompute_probabilities(ScoreTile& s, const float* lse2, float to_log2, const float* low = nullptr) {
  constexpr index_t block = 32;
  float factor[block], shift[block], sums[block];
  for (index_t r0 = 0; r0 < s.rows(); r0 += block) {
    const index_t rows = std::min(block, s.rows() - r0);
    for (index_t k = 0; k < rows; ++k) {
      const float lse = lse2[r0 + k];
      float* row = s.row(r0 + k);
      factor[k] = to_log2;
      shift[k] = lse == negative_infinity ? -negative_infinity : lse;  // +inf: P = 0
      if (std::isnan(lse)) {  // P = NaN where the row sees the key, 0 where masked
        for (index_t j = 0; j < s.cols(); ++j) row[j] = row[j] == negative_infinity ? row[j] : quiet_nan;
        shift[k] = 0.0f;
        continue;
      }
      if (std::abs(lse) >= exact_shift_limit && to_log2 != 1.0f) {
        arch::native::scale(row, s.cols(), to_log2);
        factor[k] = 1.0f;
      }
      if (low && lse != negative_infinity) {  // s c - max, exact, then 2^(that - log2(sum))
        for (index_t j = 0; j < s.cols(); ++j) row[j] = std::fma(row[j], factor[k], -lse);
        factor[k] = 1.0f;
        shift[k] = low[r0 + k];
      }
    }
    arch::native::exp2_shift_sum_rows(s.row(r0), s.ld(), rows, s.cols(), factor, shift, sums);
  }
}

/// out[r] = sum over c of a(r, c) * b(r, c), in column order: D = rowsum(dO * O).
template <class TileA, class TileB>
void row_dots(const TileA& a, const TileB& b, float* out) {
  for (index_t r = 0; r < a.rows(); ++r) {
    const float* x = a.row(r);
    const float* y = b.row(r);
    float sum = 0.0f;
    for (index_t c = 0; c < a.cols(); ++c) sum = std::fma(x[c], y[c], sum);
    out[r] = sum;
  }
}

/// ds := dS = P * (dP - D[r]) where P != 0, exactly 0 where P == 0 (ds holds dP on entry).
template <class ScoreTile>
void softmax_grad(ScoreTile& ds, const ScoreTile& p, const float* d) {
  for (index_t r = 0; r < p.rows(); ++r) {
    const float* pr = p.row(r);
    float* g = ds.row(r);
    const float dr = d[r];
    for (index_t j = 0; j < p.cols(); ++j) g[j] = pr[j] == 0.0f ? 0.0f : pr[j] * (g[j] - dr);
  }
}

/// a := a * b elementwise where a != 0 (dS times the softcap's slope). An exact zero stays
/// zero whatever b holds: a masked key's dS is 0, and its slope, computed from the raw
/// score, is NaN on a row whose Q holds a NaN (0 * NaN would reach the hidden key's dK).
/// A nonzero dS times a NaN slope only occurs where dS is NaN already (the row saw a NaN).
template <class ScoreTile>
void multiply_nonzero(ScoreTile& a, const ScoreTile& b) {
  for (index_t r = 0; r < a.rows(); ++r) {
    float* x = a.row(r);
    const float* y = b.row(r);
    for (index_t j = 0; j < a.cols(); ++j) x[j] = x[j] == 0.0f ? 0.0f : x[j] * y[j];
  }
}

}  // namespace tileattn::ops
