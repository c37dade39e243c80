// tileattn/kernels/merge.hpp: merging partial attention states row block by row block, for
// split-KV (kernels/forward.hpp) and the public merge_states (merge_states.hpp).
//
// A state is a [rows, head_dim_v] matrix O_c in main memory with per-row statistics: the
// max score and sum that split-KV stores (MaxSumRows), or the natural-log LSE a user gives
// (LseRows), both loaded as the same RowStats (ops/merge_states.hpp). The merge loads
// each state's block of rows through tile IO (counted), folds it into an accumulator with
// ops::merge_state_step in a fixed order, finishes with ops::finalize_rows (the forward's
// own normalization, which adds a sink once) and stores O (rounded once to its type) and
// LSE.
#pragma once

#include <algorithm>

#include "tileattn/core/strided_view.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/merge_states.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::kernels {

/// A state's row statistics as split-KV stores them: each row's max score (log2 units, the
/// shift its chunk's online softmax used) and sum of 2^(score - max), one float each.
struct MaxSumRows {
  const float* max;
  const float* sum;

  template <class Io>
  void load(ops::RowStats& into, index_t first, index_t count, Io& io) const {
    load_vector(into.max.data(), max + first, 1, count, io);
    load_vector(into.sum.data(), sum + first, 1, count, io);
  }
};

/// A state's row statistics as merge_states takes them: natural-log LSEs, `stride` apart.
struct LseRows {
  const float* lse;
  index_t stride;

  template <class Io>
  void load(ops::RowStats& into, index_t first, index_t count, Io& io) const {
    load_vector(into.max.data(), lse + first * stride, stride, count, io);
    ops::lse_as_row_stats(into, count);
  }
};

/// One partial state's rows in main memory: O and its row statistics (MaxSumRows or LseRows).
template <class S, class Stats>
struct PartialState {
  MatrixView<const S> o;
  Stats stats;
};

/// What one merge keeps in SRAM: a block of rows of the accumulator and of one state, the
/// running statistics and the state's, and the LSE out.
struct MergeTiles {
  Tile<float> acc, state;
  ops::RowStats stats, state_stats;
  TileVector<float> lse;

  /// The scratch pieces, in carving order: footprint() counts them and carve() carves them.
  template <class Piece>
  constexpr void pieces(Piece& piece, index_t rows, index_t dv) {
    piece(acc, rows, dv);    // (rows, dv)
    piece(state, rows, dv);  // (rows, dv)
    stats.pieces(piece, rows);
    state_stats.pieces(piece, rows);
    piece(lse, rows);
  }
  static constexpr std::size_t footprint(index_t rows, index_t dv) { return pieces_bytes<MergeTiles>(rows, dv); }
  static MergeTiles carve(ScratchArena& arena, index_t rows, index_t dv) {
    return carve_pieces<MergeTiles>(arena, rows, dv);
  }
};

/// The rows a merge block holds: as many as fit the budget, at most `wanted` (at least 1).
inline index_t merge_block_rows(index_t wanted, index_t dv, std::size_t budget) {
  index_t rows = std::max<index_t>(wanted, 1);
  while (rows > 1 && MergeTiles::footprint(rows, dv) > budget) rows = (rows + 1) / 2;
  return rows;
}

/// out = the merge of states state_at(0) ... state_at(count - 1), all out.rows rows, in
/// that order; out_lse (stride apart; nullptr: not written) their LSE; sink_log2 (nullptr:
/// none) an attention sink in log2 units, added once; finish(acc) sees each block of merged
/// rows before it is stored (the forward's Hadamard rotation of O).
struct NoFinish {
  void operator()(Tile<float>&) const {}
};
template <class StateAt, class D, class Io, class Finish = NoFinish>
void merge_rows(index_t count, StateAt&& state_at, const MatrixView<D>& out, float* out_lse,
                index_t out_lse_stride, const float* sink_log2, MergeTiles& t, Io& io, const Finish& finish = {}) {
  for (index_t i0 = 0; i0 < out.rows; i0 += t.acc.capacity_rows()) {
    const index_t n = std::min(t.acc.capacity_rows(), out.rows - i0);
    t.acc.set_extent(n, out.cols);
    ops::fill(t.acc, 0.0f);
    t.stats.reset(n);
    for (index_t c = 0; c < count; ++c) {
      const auto state = state_at(c);
      load_rows(t.state, state.o, i0, n, io);
      state.stats.load(t.state_stats, i0, n, io);
      ops::merge_state_step(t.acc, t.stats, t.state, t.state_stats);
    }
    ops::finalize_rows(t.acc, t.stats, t.lse.data(), sink_log2);
    finish(t.acc);
    store_rows(out, i0, t.acc, io);
    if (out_lse) store_vector(out_lse + i0 * out_lse_stride, out_lse_stride, t.lse.data(), n, io);
  }
}

}  // namespace tileattn::kernels
