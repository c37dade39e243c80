// tileattn/ops/score_mods.hpp: what happens to a score tile between Q K^T and the softmax:
// softcap, an additive bias and ALiBi, then the causal / sliding-window mask and a boolean
// mask. Masking last means a masked score is exactly -inf whatever a bias says there; for
// every visible score this is FlashAttention's order (softcap, masks, biases).
//
// A score tile's rows are "packed": rows [g * positions, (g + 1) * positions) hold query
// head head0 + g at positions position0 ... (GQA packs a group of query heads that share
// K/V into one tile). Scores arrive raw (Q K^T). A modifier that changes values (softcap,
// bias, ALiBi) first turns them into log2 units (times softmax_scale * log2(e)) in the same
// pass; to_log2() tells the softmax which units the tile is in afterwards.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <utility>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::ops {

/// The keys each query position of one sequence sees: j in [first(i), end(i)), from the
/// sliding window (causal is its right edge at 0) and the attention chunk, intersected.
struct KeyWindow {
  index_t offset = 0;  // query i is aligned with key i + offset
  index_t left = -1;   // -1: unbounded
  index_t right = -1;  // -1: unbounded
  index_t k_len = 0;
  index_t chunk = 0;   // attention_chunk; 0: none

  /// The window of sequence `seq` under params p (alignment, window, causal, chunk). A side
  /// at least q_len + k_len + |offset| wide is unbounded: no distance i + offset - j reaches
  /// it, and the positions below never overflow. A chunk that wide is cut to that width:
  /// every position i + offset then lies in chunk -1 or 0, as it did, and the keys of
  /// chunk 0 are all k_len of them either way.
  template <class T, class KV>
  static KeyWindow of(const ForwardParams<T, KV>& p, const SequenceRange& seq) {
    const index_t offset = p.mask_offset(seq);
    const index_t reach = seq.q_len + seq.k_len + (offset < 0 ? -offset : offset);
    const auto bound = [&](index_t side) { return side >= reach ? -1 : side; };
    const index_t chunk = p.attention_chunk > 0 ? std::min(p.attention_chunk, std::max<index_t>(reach, 1)) : 0;
    return {offset, bound(p.window_left), bound(p.effective_window_right()), seq.k_len, chunk};
  }

  index_t first(index_t i) const {
    const index_t from = left < 0 ? 0 : i + offset - left;
    return std::clamp<index_t>(std::max(from, chunk_start(i)), 0, k_len);
  }
  index_t end(index_t i) const {
    const index_t to = right < 0 ? k_len : i + offset + right + 1;
    return std::clamp<index_t>(chunk > 0 ? std::min(to, chunk_start(i) + chunk) : to, 0, k_len);
  }
  /// The first key of position i + offset's chunk (floor division), 0 without chunks. Both
  /// first() and end() never decrease with i, with or without chunks.
  index_t chunk_start(index_t i) const {
    if (chunk == 0) return 0;
    const index_t position = i + offset;
    const index_t c = position >= 0 ? position / chunk : -((-position + chunk - 1) / chunk);
    return c * chunk;
  }
  /// The positions of [p0, p0 + n) that see some key of [col0, col0 + cols), as [begin, end):
  /// contiguous, because first() and end() never decrease with the position.
  std::pair<index_t, index_t> positions_seeing(index_t p0, index_t n, index_t col0,
                                               index_t cols) const {
    const auto first_true = [&](auto&& pred) {  // pred is false, then true, over [p0, p0 + n)
      index_t lo = p0, hi = p0 + n;
      while (lo < hi) {
        const index_t mid = lo + (hi - lo) / 2;
        if (pred(mid)) hi = mid;
        else lo = mid + 1;
      }
      return lo;
    };
    const index_t begin = first_true([&](index_t p) { return end(p) > col0; });
    const index_t stop = first_true([&](index_t p) { return first(p) >= col0 + cols; });
    return {begin, std::max(begin, stop)};
  }
  /// True when every position in [p0, p0 + n) sees every key in [col0, col0 + cols).
  bool covers(index_t p0, index_t n, index_t col0, index_t cols) const {
    return first(p0 + n - 1) <= col0 && end(p0) >= col0 + cols;
  }
};

/// Which (query head, position) each packed row of a score tile stands for.
struct PackedRows {
  index_t head0 = 0, heads = 1;
  index_t position0 = 0, positions = 0;

  index_t count() const { return heads * positions; }
  index_t head(index_t r) const { return head0 + r / positions; }
  index_t position(index_t r) const { return position0 + r % positions; }
};

/// Sets to -inf the scores of s (keys [col0, col0 + s.cols())) that a row's query position
/// does not see through `window`: the causal mask is the window with right = 0.
template <class ScoreTile>
void mask_outside_window(ScoreTile& s, const PackedRows& rows, index_t col0, const KeyWindow& window) {
  for (index_t r = 0; r < rows.count(); ++r) {
    const index_t i = rows.position(r), n = s.cols();
    const index_t lo = std::clamp<index_t>(window.first(i) - col0, 0, n);
    const index_t hi = std::clamp<index_t>(window.end(i) - col0, lo, n);
    std::fill(s.row(r), s.row(r) + lo, negative_infinity);
    std::fill(s.row(r) + hi, s.row(r) + n, negative_infinity);
  }
}

/// The score modifiers of one sequence, resolved from the params once per work item.
class ScoreModifiers {
 public:
  template <class T, class KV>
  ScoreModifiers(const ForwardParams<T, KV>& p, index_t sequence, const SequenceRange& seq)
      : window_(KeyWindow::of(p, seq)),
        to_log2_(p.softmax_scale * log2e),
        softcap_(static_cast<double>(p.softcap) * std::numbers::log2e),
        softcap_in_(p.softcap > 0 ? static_cast<double>(p.softmax_scale) / static_cast<double>(p.softcap) : 0.0),
        bias_(slice_batch(p.bias, sequence)),
        mask_(slice_batch(p.mask, sequence)) {
    if (!p.alibi_slopes.empty()) {
      const bool per_sequence = static_cast<index_t>(p.alibi_slopes.size()) != p.heads();
      alibi_ = p.alibi_slopes.data() + (per_sequence ? sequence * p.heads() : 0);
    }
  }

  const KeyWindow& window() const { return window_; }

  /// The factor that turns the tiles apply() leaves into log2 units: softmax_scale *
  /// log2(e) while they stay raw, 1 once a modifier has converted them.
  float to_log2() const { return converts() ? 1.0f : to_log2_; }

  /// Applies every modifier to the raw scores s, whose columns are keys [col0, col0 +
  /// s.cols()): apply_values, then apply_masks. The bias and mask elements read from main
  /// memory are reported to the IO policy. With `softcap_slope` (the backward), a softcapped
  /// call also writes there the derivative of the cap, 1 - tanh^2, per score.
  template <class ScoreTile, class Io>
  void apply(ScoreTile& s, const PackedRows& rows, index_t col0, Io& io,
             ScoreTile* softcap_slope = nullptr) const {
    apply_values(s, rows, col0, io, softcap_slope);
    apply_masks(s, rows, col0, io);
  }

  /// The modifiers that change values: softcap, bias, ALiBi (converting to log2 units).
  template <class ScoreTile, class Io>
  void apply_values(ScoreTile& s, const PackedRows& rows, index_t col0, Io& io,
                    ScoreTile* softcap_slope = nullptr) const {
    if (softcap_ > 0) apply_softcap(s, softcap_slope);
    else if (converts()) scale(s, to_log2_);
    if (bias_.data) {
      apply_bias(s, rows, col0);
      io.read(static_cast<std::uint64_t>(rows.count() * s.cols()) * sizeof(float));
    }
    if (alibi_) apply_alibi(s, rows, col0);
  }

  /// The masks: the causal / sliding window and the boolean mask set hidden scores to -inf.
  template <class ScoreTile, class Io>
  void apply_masks(ScoreTile& s, const PackedRows& rows, index_t col0, Io& io) const {
    if (!window_.covers(rows.position0, rows.positions, col0, s.cols()))
      mask_outside_window(s, rows, col0, window_);
    if (mask_.data) {
      apply_mask(s, rows, col0);
      io.read(static_cast<std::uint64_t>(rows.count() * s.cols()) * sizeof(bool));
    }
  }

  /// Whether a tile of these rows and keys is known to be hidden whole (the key loops skip
  /// it unloaded): never for the built-in modifiers, whose key ranges already leave out
  /// what the window hides (FlexScores's block mask does skip tiles).
  bool skips(const PackedRows&, index_t, index_t) const { return false; }
  /// Calls f(lo, hi) for each run of the positions [p_lo, p_hi) of `head` that a key tile
  /// [col0, col0 + cols) must be computed for: here the one run the window leaves.
  template <class F>
  void for_row_runs(index_t, index_t p_lo, index_t p_hi, index_t, index_t, F&& f) const {
    if (p_lo < p_hi) f(p_lo, p_hi);
  }
  /// Whether the backward needs the derivative of the modified score (softcap).
  bool has_slope() const { return softcap_ > 0; }
  /// Whether apply_values leaves the tile in log2 units (else it stays raw).
  bool converts_to_log2() const { return converts(); }

 private:
  static constexpr float log2e = std::numbers::log2e_v<float>;

  bool converts() const { return softcap_ > 0 || bias_.data || alibi_; }

  /// The [H or 1, Nq, Nk] slice of a [B or 1, H or 1, Nq, Nk] view for one sequence.
  template <class V>
  static V slice_batch(const V& v, index_t sequence) {
    V out = v;
    if (v.data && v.shape[0] != 1) out.data = v.ptr(sequence, 0, 0, 0);
    return out;
  }
  template <class V>
  static auto at(const V& v, index_t head, index_t i, index_t j) {
    const index_t h = v.shape[1] == 1 ? 0 : head;
    return v(0, h, i, j);
  }

  /// s = C tanh(scale s / C) in log2 units, C = softcap * log2(e): raw scores in, log2 out.
  /// In double, so that every accepted softcap (from the subnormals up to
  /// max_natural_log_magnitude, where C reaches FLT_MAX) gives the definition's value:
  /// scale / softcap may lie outside float's range. The clamp only keeps rounding from
  /// pushing a score at the cap past FLT_MAX.
  template <class ScoreTile>
  void apply_softcap(ScoreTile& s, ScoreTile* slope) const {
    constexpr double largest = std::numeric_limits<float>::max();
    if (slope) slope->set_extent(s.rows(), s.cols());
    for (index_t r = 0; r < s.rows(); ++r) {
      float* row = s.row(r);
      for (index_t j = 0; j < s.cols(); ++j) {
        const double t = std::tanh(static_cast<double>(row[j]) * softcap_in_);
        row[j] = static_cast<float>(std::clamp(softcap_ * t, -largest, largest));
        if (slope) (*slope)(r, j) = static_cast<float>(1.0 - t * t);
      }
    }
  }
  template <class ScoreTile>
  void apply_mask(ScoreTile& s, const PackedRows& rows, index_t col0) const {
    for (index_t r = 0; r < rows.count(); ++r)
      for (index_t j = 0; j < s.cols(); ++j)
        if (!at(mask_, rows.head(r), rows.position(r), col0 + j)) s(r, j) = negative_infinity;
  }
  template <class ScoreTile>
  void apply_bias(ScoreTile& s, const PackedRows& rows, index_t col0) const {
    for (index_t r = 0; r < rows.count(); ++r)
      for (index_t j = 0; j < s.cols(); ++j)
        s(r, j) += log2e * at(bias_, rows.head(r), rows.position(r), col0 + j);
  }
  template <class ScoreTile>
  void apply_alibi(ScoreTile& s, const PackedRows& rows, index_t col0) const {
    for (index_t r = 0; r < rows.count(); ++r) {
      const float slope = -log2e * alibi_[rows.head(r)];
      const index_t diagonal = rows.position(r) + window_.offset - col0;  // column of distance 0
      arch::native::add_alibi_bias(s.row(r), s.cols(), slope, diagonal);  // fused as the set's target fuses
    }
  }

  KeyWindow window_;
  float to_log2_;          // softmax_scale * log2(e)
  double softcap_ = 0.0;   // in log2 units; 0: off
  double softcap_in_ = 0;  // softmax_scale / softcap: raw score to tanh's argument
  ScoreBiasView bias_{};
  ScoreMaskView mask_{};
  const float* alibi_ = nullptr;  // slopes of this sequence, one per query head
};

/// The kernels' source of a work item's score modifiers when no user functor takes part:
/// the built-in options of the params (FlexScores, flex/scores.hpp, adds functors).
struct BuiltinScores {
  template <class P>
  ScoreModifiers operator()(const P& p, index_t sequence, const SequenceRange& seq) const {
    return ScoreModifiers(p, sequence, seq);
  }
  bool has_slope(float softcap) const { return softcap > 0; }
  template <class P>
  void check(const P&, index_t, index_t) const {}
  /// A query tile's work estimate (ForwardWorkList): the keys the window leaves it.
  index_t estimate_keys(index_t, index_t, index_t, index_t, index_t window_keys) const { return window_keys; }
  /// The widest key tile the planner should give (PlanShape::key_tile_limit): no limit.
  index_t key_tile_limit() const { return 0; }
};

}  // namespace tileattn::ops
