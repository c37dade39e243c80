// tileattn/kernels/backward.hpp: the tiled backward kernel (FlashAttention-2's Algorithm 2
// loop order, deterministic).
//
// Three passes, each a parallel_for over tiles:
//   1. preprocess: D = rowsum(dO * O) per query row (and d(sink) per head from D and LSE);
//   2. main: a work item (kernels/backward_work_list.hpp) keeps one key tile's K, K^T, V^T
//      and its dK, dV accumulators in SRAM and streams past them every query tile that
//      sees those keys: S = Q K^T, the score modifiers, P = 2^(S - LSE) recomputed,
//      dP = dO V^T, dS = P * (dP - D); dV += P^T dO, dK += dS^T Q, and dQ_acc += dS K into
//      an fp32 accumulator in main memory, taking turns so that every dQ row sums its key
//      tiles in ascending order;
//   3. epilogue: dQ = scale * dQ_acc, rounded once to the storage type.
// Dropout (ops/dropout.hpp) regenerates the forward's decisions Z: dP becomes Z dP / (1 - p')
// before dS, and dV sums Z P (scaled by 1 / (1 - p') once, with dK's scale); D = rowsum(dO *
// O) holds as it is, O being the dropped output.
// No N x N buffer: extra memory is the fp32 dQ accumulator and D (O(N) per head) and one
// turn counter per query tile and head.
#pragma once

#include <cmath>
#include <numbers>
#include <span>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/backward_plan.hpp"
#include "tileattn/kernels/backward_work_list.hpp"
#include "tileattn/kernels/operands.hpp"
#include "tileattn/kernels/tile_lists.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/memory/io_policy.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/dropout.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/online_softmax.hpp"
#include "tileattn/ops/operand_layout.hpp"
#include "tileattn/ops/score_mods.hpp"
#include "tileattn/ops/score_source.hpp"
#include "tileattn/ops/softmax_grad.hpp"

namespace tileattn::kernels {

/// The forward's final row statistics, [view batch, heads, seqlen] like the saved LSE: each
/// row's max score in log2 units and its sum of 2^(score - max), sinks folded in
/// (ForwardParams::row_max, row_sum). Where given, P is recomputed from them rather than
/// from the saved float LSE, whose rounding (|LSE| 2^-24) is P's relative error: beyond
/// |LSE| ~ 256 more than FlashAttention's rule allows (backward.hpp recomputes them there).
struct SavedRowStats {
  StridedView<const float, 3> max, sum;
  bool given() const { return max.data != nullptr; }
};

/// The backward's main-memory state besides the user's tensors: the fp32 dQ accumulator
/// [view batch, heads, seqlen, d], D [view batch, heads, seqlen], the dQ turns, and the
/// forward's row statistics where given.
struct BackwardState {
  std::vector<float> dq_acc;
  std::vector<float> delta;
  TensorView<float> dq_acc_view;
  StridedView<float, 3> delta_view;
  DqTurns turns;
  SavedRowStats row_stats;

  template <class T>
  BackwardState(const BackwardParams<T>& p, const BackwardTilePlan& plan, const SavedRowStats& stats = {})
      : dq_acc(static_cast<std::size_t>(p.q.shape[0] * p.q.shape[1] * p.q.shape[2] * p.q.shape[3]), 0.0f),
        delta(static_cast<std::size_t>(p.q.shape[0] * p.q.shape[1] * p.q.shape[2]), 0.0f),
        dq_acc_view(make_bhsd(dq_acc.data(), p.q.shape[0], p.q.shape[2], p.q.shape[1], p.q.shape[3])),
        delta_view{delta.data(), {p.q.shape[0], p.q.shape[2], p.q.shape[1]},
                   {p.q.shape[2] * p.q.shape[1], p.q.shape[1], 1}},
        turns(p, plan),
        row_stats(stats) {}
};

/// Pass 1 for one (sequence, head, query tile): D = rowsum(dO * O) in fp32.
template <class T, class Io>
void backward_preprocess_tile(const BackwardParams<T>& p, const BackwardTilePlan& plan, const BackwardState& st,
                              index_t b, index_t head, index_t tile, Io& io) {
  const SequenceRange seq = p.sequence(b);
  const index_t r0 = tile * plan.query_tile_rows, n = std::min(plan.query_tile_rows, seq.q_len - r0);
  auto t = BackwardPreprocessTiles::carve(worker_scratch(plan.working_set_bytes), n, p.head_dim_v());
  load_rows(t.o, sequence_matrix(p.out, seq.view_batch, head, seq.q_start, seq.q_len), r0, n, io);
  load_rows(t.dout, sequence_matrix(p.dout, seq.view_batch, head, seq.q_start, seq.q_len), r0, n, io);
  ops::row_dots(t.dout, t.o, t.delta.data());
  store_vector(&st.delta_view(seq.view_batch, head, seq.q_start + r0), 1, t.delta.data(), n, io);
}

/// dbias[..., rows, keys] += dS (natural units) for one query head: the bias's broadcast
/// dimensions (extent 1) receive every head's or sequence's share, in the order the
/// kernel's phases run them.
template <class T, class Io>
void accumulate_bias_grad(const BackwardParams<T>& p, const KeyBlock& blk, index_t head, index_t r0,
                          index_t col0, const Tile<float>& ds, Io& io) {
  const StridedView<float, 4>& g = p.dbias;
  const index_t b = g.shape[0] == 1 ? 0 : blk.sequence, h = g.shape[1] == 1 ? 0 : head;  // broadcast: index 0
  for (index_t r = 0; r < ds.rows(); ++r) {
    float* row = g.ptr(b, h, r0 + r, col0);
    for (index_t j = 0; j < ds.cols(); ++j) row[j * g.stride[3]] += ds(r, j);
  }
  const auto bytes = static_cast<std::uint64_t>(ds.rows() * ds.cols()) * sizeof(float);
  io.read(bytes);
  io.written(bytes);
}

/// The (query row, key) terms of one step that its rows do not see (score -inf: masked, or
/// made -inf), which the sparse-safe products skip; recorded only when an operand holds an
/// Inf or a NaN (`none`: every operand is finite and the fast products run).
class HiddenTerms {
 public:
  static HiddenTerms none() { return {}; }
  /// The terms of the score tile s (rows: query rows, columns: keys), before P overwrites it.
  static HiddenTerms of(const Tile<float>& s) {
    thread_local std::vector<unsigned char> hidden;  // this rare path's only buffer
    hidden.resize(static_cast<std::size_t>(s.rows() * s.cols()));
    for (index_t r = 0; r < s.rows(); ++r)
      for (index_t j = 0; j < s.cols(); ++j)
        hidden[static_cast<std::size_t>(r * s.cols() + j)] = s(r, j) == ops::negative_infinity;
    return HiddenTerms(hidden.data(), s.rows(), s.cols());
  }
  bool recorded() const { return hidden_ != nullptr; }
  /// Whether query row r does not see key j (a pair's padding, past either end, is hidden).
  bool operator()(index_t r, index_t j) const {
    return r >= rows_ || j >= keys_ || hidden_[static_cast<std::size_t>(r * keys_ + j)] != 0;
  }

 private:
  HiddenTerms() = default;
  HiddenTerms(const unsigned char* hidden, index_t rows, index_t keys) : hidden_(hidden), rows_(rows), keys_(keys) {}
  const unsigned char* hidden_ = nullptr;
  index_t rows_ = 0, keys_ = 0;
};

/// c += a b over query rows (a: rows of P or dS, summed over keys), through the sparse-safe
/// product when b holds an Inf or a NaN (the hidden terms recorded).
template <class TileA, class TileB>
void accumulate(Tile<float>& c, const TileA& a, const TileB& b, const HiddenTerms& hidden) {
  if (!hidden.recorded()) ops::matmul_accumulate(c, a, b);
  else ops::matmul_accumulate_visible(c, a, b, [&](index_t r, index_t j) { return hidden(r, j); });
}

/// c += a^T b over keys (a as stored: query rows by keys, summed over query rows), likewise.
template <class TileA, class TileB>
void accumulate_tn(Tile<float>& c, const TileA& a_t, const TileB& b, const HiddenTerms& hidden) {
  if (!hidden.recorded()) ops::matmul_accumulate_tn(c, a_t, b);
  else ops::matmul_accumulate_tn_visible(c, a_t, b, [&](index_t j, index_t r) { return hidden(r, j); });
}

/// The keys [k0, k1) of a key tile [col0, col0 + cols) that query rows [r0, r0 + n) can
/// see (first() and end() never decrease with the row), k0 rounded down to a multiple of
/// sum_group_values (so dQ += dS K groups its sum alike for any key tiling) and k1 up to even.
inline std::pair<index_t, index_t> keys_seen(const ops::KeyWindow& w, index_t r0, index_t n, index_t col0,
                                             index_t cols) {
  const index_t k0 = std::clamp<index_t>(w.first(r0) - col0, 0, cols) / sum_group_values * sum_group_values;
  const index_t k1 = std::clamp<index_t>(w.end(r0 + n - 1) - col0, k0, cols);
  return {k0, std::min(cols, (k1 + 1) / 2 * 2)};
}

/// P's shift for rows [row, row + n) of (view batch vb, head), in log2 units, into t.lse2
/// (and t.lse2_low where the forward's row statistics are given: P = 2^((s c - max) -
/// log2(sum)), each part exact, instead of 2^(s c - LSE log2(e))). A row that saw no key
/// gets -inf, a row that saw a NaN NaN, as from the saved LSE.
template <class T, class Op, class Io>
void load_shift(const BackwardParams<T>& p, const BackwardState& st, index_t vb, index_t head, index_t row,
                index_t n, BackwardTiles<Op>& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SavedRowStats& stats = st.row_stats;
  if (!stats.given()) {
    load_vector(t.lse2.data(), &p.saved_lse(vb, head, row), p.saved_lse.stride[2], n, io);
    arch::native::scale(t.lse2.data(), n, log2e);
    return;
  }
  load_vector(t.lse2.data(), &stats.max(vb, head, row), stats.max.stride[2], n, io);
  load_vector(t.lse2_low.data(), &stats.sum(vb, head, row), stats.sum.stride[2], n, io);
  for (index_t i = 0; i < n; ++i) {
    float& high = t.lse2[i];
    float& low = t.lse2_low[i];
    if (low == 0.0f) high = ops::negative_infinity;
    else if (std::isnan(low) || std::isnan(high)) high = ops::quiet_nan;
    low = high == ops::negative_infinity || std::isnan(high) ? 0.0f : std::log2(low);
  }
}

/// One query tile's step against the resident key tile: rows [r0, r0 + n) of `head`, against
/// the keys of the tile they can see. A tile the modifiers skip whole (a block mask's empty
/// blocks) loads nothing and only passes its dQ turn on.
template <class T, class Op, class Mods, class Io>
void backward_step(const BackwardParams<T>& p, const Mods& mods, const ops::Dropout& dropout, const KeyBlock& blk,
                   BackwardState& st, index_t head, index_t tile, index_t r0, index_t n,
                   bool keys_finite, BackwardTiles<Op>& t, Io& io) {
  const SequenceRange& seq = blk.range;
  if (mods.skips({head, 1, r0, n}, blk.col0, blk.cols)) {
    st.turns.wait(blk.sequence, tile, head, blk.key_tile);
    st.turns.pass(blk.sequence, tile, head, blk.key_tile);
    return;
  }
  const auto rows_of = [&](const auto& view) {
    return sequence_matrix(view, seq.view_batch, head, seq.q_start, seq.q_len);
  };
  load_rows(t.q, rows_of(p.q), r0, n, io);                                        // (n, d)
  load_rows(t.dout, rows_of(p.dout), r0, n, io);                                  // (n, dv)
  if constexpr (BackwardTiles<Op>::pairs) {
    ops::pair_rows(t.q_rows, t.q, p.head_dim());
    ops::pair_rows(t.dout_rows, t.dout, p.head_dim_v());
  }
  const index_t row = seq.q_start + r0;
  load_shift(p, st, seq.view_batch, head, row, n, t, io);                         // P's shift
  load_vector(t.delta.data(), &st.delta_view(seq.view_batch, head, row), st.delta_view.stride[2], n, io);
  const auto [k0, k1] = keys_seen(mods.window(), r0, n, blk.col0, blk.cols);
  auto keys = t.keys(k0, k1 - k0);                                                // c = k1 - k0 keys

  ops::matmul(t.s, t.q, keys.k_t);                                                // S (n, c)
  Tile<float>* slope = mods.has_slope() ? &t.slope : nullptr;
  mods.apply(t.s, {head, 1, r0, n}, blk.col0 + k0, io, slope);
  const bool q_finite = ops::all_finite(t.q), dout_finite = ops::all_finite(t.dout);
  const HiddenTerms hidden = q_finite && dout_finite && keys_finite ? HiddenTerms::none() : HiddenTerms::of(t.s);
  const HiddenTerms none = HiddenTerms::none();
  ops::recompute_probabilities(t.s, t.lse2.data(), mods.to_log2(),               // P
                               st.row_stats.given() ? t.lse2_low.data() : nullptr);
  ops::matmul(t.ds, t.dout, keys.v_t);                                            // dP
  const ops::PackedRows rows{head, 1, r0, n};
  const index_t c = t.s.cols();
  dropout.apply(t.ds, rows, 0, blk.col0 + k0, c, dropout.kept_scale());          // Z dP / (1 - p')
  ops::softmax_grad(t.ds, t.s, t.delta.data());                                   // dS
  if (p.dbias.data) accumulate_bias_grad(p, blk, head, r0, blk.col0 + k0, t.ds, io);
  if (slope) ops::multiply_nonzero(t.ds, *slope);                                 // through tanh
  dropout.apply(t.s, rows, 0, blk.col0 + k0, c);                                  // Z P, for dV

  accumulate_tn(keys.dv, ops::as_transposed_operand(t.s, t.p_op), t.dout_as_rows(),  // dV += P^T dO
                dout_finite ? none : hidden);
  accumulate_tn(keys.dk, ops::as_transposed_operand(t.ds, t.p_op), t.queries_as_rows(),  // dK += dS^T Q
                q_finite ? none : hidden);

  // dQ_acc += dS K, after the key tiles before this one (ascending order: deterministic).
  const Tile<Op>& ds = ops::as_operand(t.ds, t.ds_op);
  Tile<float> acc = Tile<float>::wrap(&st.dq_acc_view(seq.view_batch, seq.q_start + r0, head, 0), n, p.head_dim(),
                                      st.dq_acc_view.stride[1]);
  st.turns.wait(blk.sequence, tile, head, blk.key_tile);
  accumulate(acc, ds, keys.k_rows, keys_finite ? none : hidden);
  st.turns.pass(blk.sequence, tile, head, blk.key_tile);
  const auto acc_bytes = static_cast<std::uint64_t>(n * p.head_dim()) * sizeof(float);
  io.read(acc_bytes);
  io.written(acc_bytes);
}

/// Pass 0, where the saved LSE is too coarse (backward.hpp, needs_row_stats), for one
/// (sequence, head, query tile) of row_stats_tiles' plan: the forward's final row statistics
/// (max in log2 units and sum, the sink folded in) recomputed from the backward's own scores
/// (the same Q K^T product and modifiers as backward_step: each score the same bits, which
/// do not depend on the tile), into out_max and out_sum ([view batch, heads, seqlen]).
/// P = 2^((s c - max) - log2(sum)) is then exact to the bit for a row's largest score.
/// Statistics from a forward would not do: its product sums over d in another order, so its
/// scores differ from the backward's in the last bits, and at |s| in the thousands that
/// rounding (|s| 2^-24) is P's relative error. The keys go in whole chunks of
/// row_stats_keys from key 0 (masked keys add exact zeros), so the sum's rounding is the
/// same for every budget and thread count.
template <class T, class Op, class Scores, class Io>
void backward_row_stats_tile(const BackwardParams<T>& p, const BackwardTilePlan& plan, index_t b, index_t head,
                             index_t tile, BackwardTiles<Op>& t, const Scores& scores, const LseView& out_max,
                             const LseView& out_sum, Io& io) {
  const SequenceRange seq = p.sequence(b);
  const auto mods = scores(p, b, seq);
  const index_t r0 = tile * plan.query_tile_rows, n = std::min(plan.query_tile_rows, seq.q_len - r0);
  const index_t kv_head = head / p.group_size();
  load_rows(t.q, sequence_matrix(p.q, seq.view_batch, head, seq.q_start, seq.q_len), r0, n, io);
  ops::RowStats stats{t.lse2, t.lse2_low};
  stats.reset(n);
  float unused = 0.0f;
  Tile<float> no_values = Tile<float>::wrap(&unused, n, 0, 0);  // the statistics alone
  Tile<float>* slope = mods.has_slope() ? &t.slope : nullptr;
  for (index_t col0 = 0; col0 < seq.k_len; col0 += plan.key_tile_rows) {
    const index_t cols = std::min(plan.key_tile_rows, seq.k_len - col0);
    if (mods.skips({head, 1, r0, n}, col0, cols)) continue;  // every score masked: adds nothing
    load_rows(t.k, sequence_matrix(p.k, seq.view_batch, kv_head, seq.k_start, seq.k_len), col0, cols, io);
    ops::transpose(t.k_t, t.k);
    ops::matmul(t.s, t.q, t.keys(0, cols).k_t);
    mods.apply(t.s, {head, 1, r0, n}, col0, io, slope);
    ops::online_softmax_step(t.s, stats, no_values, mods.to_log2());
  }
  constexpr float log2e = std::numbers::log2e_v<float>;
  const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
  for (index_t i = 0; i < n; ++i) {
    float lse = 0.0f;
    ops::finalize_row(&unused, 0, stats.max[i], stats.sum[i], lse, p.sinks.empty() ? nullptr : &sink);
  }
  store_vector(&out_max(seq.view_batch, head, seq.q_start + r0), out_max.stride[2], stats.max.data(), n, io);
  store_vector(&out_sum(seq.view_batch, head, seq.q_start + r0), out_sum.stride[2], stats.sum.data(), n, io);
}

/// Pass 2 for one work item: dK and dV of one key tile, summed over the group's query heads.
template <class T, class Op, class Scores, class Io>
void backward_key_block(const BackwardParams<T>& p, const BackwardTilePlan& plan, const KeyBlock& blk,
                        BackwardState& st, BackwardTiles<Op>& t, const Scores& scores, Io& io) {
  const SequenceRange& seq = blk.range;
  const auto mods = scores(p, blk.sequence, seq);
  const ops::Dropout dropout(p.dropout, blk.sequence, p.heads());
  const auto keys_of = [&](const auto& view) {
    return sequence_matrix(view, seq.view_batch, blk.kv_head, seq.k_start, seq.k_len);
  };
  load_rows(t.k, keys_of(p.k), blk.col0, blk.cols, io);                           // (Bc, d)
  ops::transpose(t.k_t, t.k);                                                     // (d, Bc)
  if constexpr (BackwardTiles<Op>::pairs) {
    ops::pair_rows(t.k_rows, t.k, p.head_dim());                                  // (Bc / 2, d) pairs
    load_rows(t.v, keys_of(p.v), blk.col0, blk.cols, io);                         // (Bc, dv)
    ops::transpose(t.v_t, t.v);                                                   // (dv / 2, Bc) pairs
  } else {
    load_rows_transposed(t.v_t, keys_of(p.v), blk.col0, blk.cols, io);           // (dv, Bc)
  }
  const bool keys_finite = ops::all_finite(t.k);
  t.dk.set_extent(blk.cols, p.head_dim());
  t.dv.set_extent(blk.cols, p.head_dim_v());
  ops::fill(t.dk, 0.0f);
  ops::fill(t.dv, 0.0f);

  const index_t br = plan.query_tile_rows;
  const auto [lo, hi] = rows_visiting(mods.window(), seq.q_len, blk.col0, blk.cols, br);
  for (index_t g = 0; g < p.group_size(); ++g) {                                  // heads, then rows:
    const index_t head = blk.kv_head * p.group_size() + g;                        // dK, dV sum in one
    for (index_t tile = lo / br; tile * br < hi; ++tile) {                        // order for any tiling
      const auto [r0, r1] = visited_rows(lo, hi, tile, br);
      backward_step(p, mods, dropout, blk, st, head, tile, r0, r1 - r0, keys_finite, t, io);
    }
  }
  ops::scale(t.dk, p.softmax_scale);
  if (dropout.enabled()) ops::scale(t.dv, dropout.kept_scale());
  if (p.dk_fp32.data) {  // a ring pair's partial gradients (BackwardParams::dk_fp32)
    store_rows(keys_of(p.dk_fp32), blk.col0, t.dk, io);
    store_rows(keys_of(p.dv_fp32), blk.col0, t.dv, io);
  } else {
    store_rows(keys_of(p.dk), blk.col0, t.dk, io);
    store_rows(keys_of(p.dv), blk.col0, t.dv, io);
  }
}

/// Pass 3 for one (sequence, head, query tile): dQ = scale * dQ_acc, rounded once (or kept
/// in fp32: BackwardParams::dq_fp32).
template <class T, class Io>
void backward_epilogue_tile(const BackwardParams<T>& p, const BackwardTilePlan& plan, const BackwardState& st,
                            index_t b, index_t head, index_t tile, Io& io) {
  const SequenceRange seq = p.sequence(b);
  const index_t r0 = tile * plan.query_tile_rows, n = std::min(plan.query_tile_rows, seq.q_len - r0);
  Tile<float> dq = carve_tile<float>(worker_scratch(plan.working_set_bytes), n, p.head_dim());
  const TensorView<const float> acc = st.dq_acc_view;
  load_rows(dq, sequence_matrix(acc, seq.view_batch, head, seq.q_start, seq.q_len), r0, n, io);
  ops::scale(dq, p.softmax_scale);
  if (p.dq_fp32.data) store_rows(sequence_matrix(p.dq_fp32, seq.view_batch, head, seq.q_start, seq.q_len), r0, dq, io);
  else store_rows(sequence_matrix(p.dq, seq.view_batch, head, seq.q_start, seq.q_len), r0, dq, io);
}

/// d(sink_h) = -sum over rows of e^(sink_h - lse) * D, in a fixed order (double sums); a
/// row whose LSE is -inf (no key, sink -inf) has no sink probability and adds nothing.
template <class T, class Io>
void sink_gradients(const BackwardParams<T>& p, const BackwardState& st, Io& io) {
  for (index_t h = 0; h < p.heads(); ++h) {
    double sum = 0.0;
    for (index_t b = 0; b < p.batch(); ++b) {
      const SequenceRange seq = p.sequence(b);
      const double sink = p.sinks[static_cast<std::size_t>(h)];
      for (index_t i = 0; i < seq.q_len; ++i) {
        const double lse = p.saved_lse(seq.view_batch, h, seq.q_start + i);
        if (lse == -HUGE_VAL) continue;  // no key and a -inf sink: the row adds nothing (not e^(-inf + inf))
        sum += std::exp(sink - lse) * static_cast<double>(st.delta_view(seq.view_batch, h, seq.q_start + i));
      }
      io.read(static_cast<std::uint64_t>(seq.q_len) * 2 * sizeof(float));
    }
    p.dsinks[static_cast<std::size_t>(h)] = static_cast<float>(-sum);
  }
  io.written(static_cast<std::uint64_t>(p.heads()) * sizeof(float));
}

/// (sequence, head, query tile) triples of the whole batch, for passes 1 and 3.
template <class T>
std::vector<std::array<index_t, 3>> query_tiles(const BackwardParams<T>& p, const BackwardTilePlan& plan) {
  std::vector<std::array<index_t, 3>> tiles;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t t = 0; t < plan.query_tiles(p.sequence(b).q_len); ++t) tiles.push_back({b, h, t});
  return tiles;
}

/// The keys pass 0 takes at a time: a bf16 pair tile's smallest width.
inline constexpr index_t row_stats_keys = sum_group_values;

/// Pass 0's tiles: row_stats_keys keys, and as many query rows of the backward's as fit its
/// budget beside them (the rows do not change the bits), at least the smallest tile's (1;
/// bf16 pairs 32), whose working set is then this rare path's only excess over a budget.
template <class T>
BackwardTilePlan row_stats_tiles(const BackwardParams<T>& p, const BackwardTilePlan& plan, bool slope) {
  BackwardTilePlan t = plan;
  t.key_tile_rows = row_stats_keys;
  const bool pairs = ::tileattn::pair_operands(tile_operands_for<T>());
  const index_t least = std::min(plan.query_tile_rows, pairs ? sum_group_values : index_t{1});
  const auto bytes = [&](index_t rows) {
    return with_tile_operand<T>([&]<class Op>(std::type_identity<Op>) {
      return BackwardTiles<Op>::footprint(rows, row_stats_keys, p.head_dim(), p.head_dim_v(), slope);
    });
  };
  while (t.query_tile_rows > least && bytes(t.query_tile_rows) > plan.working_set_bytes)
    t.query_tile_rows = std::max(least, t.query_tile_rows / 2);
  t.working_set_bytes = bytes(t.query_tile_rows);
  return t;
}

/// Runs pass 0 under `exec` on row_stats_tiles: every row's statistics from the backward's
/// own scores (backward_row_stats_tile) into out_max and out_sum; returns the traffic counted.
template <io_policy Io, class T, class Scores = ops::BuiltinScores>
  requires ops::backward_score_source<Scores, BackwardParams<T>, Io>
IoCounts run_backward_row_stats(const BackwardParams<T>& p, const BackwardTilePlan& backward_plan,
                                const Execution& exec, const LseView& out_max, const LseView& out_sum,
                                const Scores& scores = {}) {
  const BackwardTilePlan plan = row_stats_tiles(p, backward_plan, scores.has_slope(p.softcap));
  std::vector<Io> io(static_cast<std::size_t>(std::max<index_t>(worker_count(exec), 1)));
  const auto tiles = query_tiles(p, plan);
  parallel_for(exec, static_cast<index_t>(tiles.size()), [&](index_t i, int worker) {
    const index_t b = tiles[static_cast<std::size_t>(i)][0], h = tiles[static_cast<std::size_t>(i)][1],
                  tile = tiles[static_cast<std::size_t>(i)][2];  // not a structured binding: clang 14 captures none
    with_tile_operand<T>([&]<class Op>(std::type_identity<Op>) {
      auto t = BackwardTiles<Op>::carve(worker_scratch(plan.working_set_bytes), plan.query_tile_rows,
                                        plan.key_tile_rows, p.head_dim(), p.head_dim_v(), scores.has_slope(p.softcap));
      backward_row_stats_tile(p, plan, b, h, tile, t, scores, out_max, out_sum, io[static_cast<std::size_t>(worker)]);
    });
  });
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

/// Runs the three passes under `exec`; returns the HBM traffic counted (zero unless Io counts).
/// A bias gradient that broadcasts over sequences or K/V heads runs pass 2 in phases, one per
/// sequence or head, so that each of its elements sums its shares in a fixed order. `scores`
/// gives each item's score modifiers (ops::BuiltinScores, or ops::FlexScores).
template <io_policy Io, class T, class Scores = ops::BuiltinScores>
  requires ops::backward_score_source<Scores, BackwardParams<T>, Io>
IoCounts run_backward(const BackwardParams<T>& p, const BackwardTilePlan& plan, const Execution& exec,
                      const Scores& scores = {}, const SavedRowStats& row_stats = {}) {
  BackwardState st(p, plan, row_stats);
  const index_t workers = worker_count(exec);
  std::vector<Io> io(static_cast<std::size_t>(std::max<index_t>(workers, 1)));
  const auto tiles = query_tiles(p, plan);
  const auto n_tiles = static_cast<index_t>(tiles.size());
  parallel_for(exec, n_tiles, [&](index_t i, int worker) {
    const auto& [b, h, t] = tiles[static_cast<std::size_t>(i)];
    backward_preprocess_tile(p, plan, st, b, h, t, io[static_cast<std::size_t>(worker)]);
  });
  if (!p.dsinks.empty()) sink_gradients(p, st, io[0]);

  const bool per_sequence = p.dbias.data && p.dbias.shape[0] == 1 && p.batch() > 1;
  const bool per_kv_head = p.dbias.data && p.dbias.shape[1] == 1 && p.heads_kv() > 1;
  const index_t seq_phases = per_sequence ? p.batch() : 1, kv_phases = per_kv_head ? p.heads_kv() : 1;
  for (index_t sp = 0; sp < seq_phases; ++sp)
    for (index_t kp = 0; kp < kv_phases; ++kp) {
      const BackwardWorkList work(p, plan, per_sequence ? sp : 0, per_sequence ? sp + 1 : p.batch(),
                                  per_kv_head ? kp : 0, per_kv_head ? kp + 1 : p.heads_kv());
      parallel_for_in_order(exec, work.size(), [&](index_t item, int worker) {
        try {
          with_tile_operand<T>([&]<class Op>(std::type_identity<Op>) {
            auto t = BackwardTiles<Op>::carve(worker_scratch(plan.working_set_bytes), plan.query_tile_rows,
                                              plan.key_tile_rows, p.head_dim(), p.head_dim_v(),
                                              scores.has_slope(p.softcap));
            backward_key_block(p, plan, work[item], st, t, scores, io[static_cast<std::size_t>(worker)]);
          });
        } catch (...) {
          st.turns.abort();
          throw;
        }
      });
    }

  parallel_for(exec, n_tiles, [&](index_t i, int worker) {
    const auto& [b, h, t] = tiles[static_cast<std::size_t>(i)];
    backward_epilogue_tile(p, plan, st, b, h, t, io[static_cast<std::size_t>(worker)]);
  });
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

}  // namespace tileattn::kernels
