// tileattn/kernels/forward.hpp: the tiled forward kernel (FlashAttention-2 loop order).
//
// A work item is a QueryBlock (kernels/work_list.hpp). It loads the Q tiles of its query
// heads once (rotated at their positions when the call asks for rotary embedding:
// ops/rotary.hpp), streams only the K/V tiles some of its rows can see (causal and windowed
// tiles outside the band are never loaded), applies the score modifiers, keeps an online
// softmax, and writes O and LSE once, or, for one key chunk of a split-KV sequence, its
// partial state, which a merge pass combines (run_merges).
//
// One key loop (forward_item) serves every forward call (contiguous, varlen, paged, flex,
// top-k, MLA, prefix-once), in named phases: start, then per key tile skip, load, products,
// softmax, accumulate, then finish. How a key tile reaches the products is the item's
// loader (kernels/key_loaders.hpp): K^T and V packed into SRAM tiles (PackedLoader), or rows
// read where they lie for decode (InPlaceLoader); where K and V live is the loader's Kv
// source (kernels/kv_source.hpp). The products, the softmax and the accumulation
// (attend_visible_rows -> attend_key_tile -> attend_slab) take either loader's operands.
// The scales that go with a tile come with its operands (TileScalesRef; the model is
// kernels/tile_scales.hpp): attend_slab applies 8-bit K's to the scores (scale_scores) and
// accumulate_values V's to the probabilities (scale_probabilities); 4-bit blocks dequantize
// exactly as they load, so the products never see their scales.
#pragma once

#include <algorithm>
#include <numbers>
#include <type_traits>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/key_loaders.hpp"
#include "tileattn/kernels/kv_source.hpp"
#include "tileattn/kernels/merge.hpp"
#include "tileattn/kernels/operands.hpp"
#include "tileattn/kernels/tile_lists.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/memory/io_policy.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/dropout.hpp"
#include "tileattn/ops/hadamard.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/online_softmax.hpp"
#include "tileattn/ops/operand_layout.hpp"
#include "tileattn/ops/rotary.hpp"
#include "tileattn/ops/score_mods.hpp"
#include "tileattn/ops/score_source.hpp"

namespace tileattn::kernels {


namespace detail {
/// S = Q K^T from a K^T tile (prepared or not) or from key rows read in place.
template <class Op, class KeyOperand>
void scores(Tile<float>& s, const Tile<Op>& q, const KeyOperand& k_t) { ops::matmul(s, q, k_t); }
template <class Op, class E>
void scores(Tile<float>& s, const Tile<Op>& q, const RowRefs<E>& k) { ops::matmul_transposed(s, q, k); }

/// Calls f(first, piece) for the pieces of the packed rows [r0, r0 + n) that lie in one query
/// head each (first: the piece's first row, counted from r0): the score modifiers index
/// their rows by (head, position).
template <class F>
void for_head_pieces(const ops::PackedRows& rows, index_t r0, index_t n, F&& f) {
  if (r0 == 0 && n == rows.count()) return f(index_t{0}, rows);
  for (index_t r = r0; r < r0 + n;) {
    const index_t g = r / rows.positions, offset = r % rows.positions;
    const index_t len = std::min(rows.positions - offset, r0 + n - r);
    f(r - r0, ops::PackedRows{rows.head0 + g, 1, rows.position0 + offset, len});
    r += len;
  }
}
}  // namespace detail

/// Rows per slab of a key tile's work: in bf16 panels (where the micro-kernel set multiplies
/// prepared operands, arch/prepared_pairs.hpp) the set's slab, at most max_slab_rows; all
/// of them elsewhere. Every row's result is the same bits either way.
template <class Tiles>
index_t slab_rows_of(const Tiles& t, index_t rows) {
  if constexpr (Tiles::pairs)
    if (t.panels) return std::clamp<index_t>(arch::native::product_slab_rows(), 1, max_slab_rows);
  return rows;
}

/// The keys of a prepared key tile (from its first on) that the slab [r0, r0 + n) of `rows`
/// computes: up to the last its rows see, rounded up to whole pairs of 16 (32 keys), so that
/// a diagonal panel costs a slab its band, not the whole panel. The keys left out are masked
/// for every row of the slab (P = 0), and a product's sum over whole pairs of 16 that are
/// zero adds exact zeros: the same bits as the whole tile.
template <class Mods, class Op>
index_t slab_keys(const Mods& mods, const ops::PackedRows& rows, index_t r0, index_t n, index_t col0,
                  const ops::PreparedOperand<Op>& k) {
  const bool one_head = r0 / rows.positions == (r0 + n - 1) / rows.positions;
  const index_t last = one_head ? rows.position(r0 + n - 1) : rows.position0 + rows.positions - 1;
  const index_t seen = mods.window().end(last) - col0;  // keys [col0, col0 + seen) at most
  return std::clamp<index_t>((seen + 31) / 32 * 32, 0, k.cols);
}
template <class Mods, class KeyOperand>
index_t slab_keys(const Mods&, const ops::PackedRows&, index_t, index_t, index_t, const KeyOperand&) {
  return -1;  // all of them
}

/// The keys of a whole key tile: K^T's columns, prepared or not, or the key rows read in place.
template <class Op>
index_t tile_keys(const Tile<Op>& k_t) { return k_t.cols(); }
template <class Op>
index_t tile_keys(const ops::PreparedOperand<Op>& k_t) { return k_t.cols; }
template <class E>
index_t tile_keys(const RowRefs<E>& k) { return k.rows(); }

/// O += P V for a slab whose V is finite: the softmax step makes P from S (n, Bc) and
/// sums it, then dropout (if any) multiplies the entries it drops by 0; V's per-key scales (8-bit V)
/// multiply P's columns before P meets V (scale_probabilities); where the tiles multiply
/// bf16 pairs P is rounded to pairs, in the softmax step itself when nothing scales it (as
/// on GPUs), and dropped there.
template <class Tiles, class ValueOperand>
void accumulate_values(Tiles& t, Tile<float>& s, ops::RowStats& stats, Tile<float>& o, const ValueOperand& v,
                       const TileScalesRef& scales, float to_log2, index_t n, const ops::Dropout::Slab& drop) {
  const index_t keys = s.cols();
  if constexpr (Tiles::pairs) {
    auto p = t.p.slice_rows(0, n);
    if (scales.scales_values()) {
      ops::online_softmax_step(s, stats, o, to_log2);  // s := P
      drop(s, keys);
      scales.scale_probabilities(s);
      ops::round_to_pairs(p, s);
    } else {
      ops::online_softmax_step(s, stats, o, to_log2, &p);  // p := P in bf16
      drop(p, keys);
    }
    ops::matmul_accumulate(o, p, v);  // (n, dv)
  } else {
    ops::online_softmax_step(s, stats, o, to_log2);  // s := P
    drop(s, keys);
    scales.scale_probabilities(s);
    ops::matmul_accumulate(o, s, v);  // (n, dv)
  }
}

/// One slab of a key tile's work: the packed rows [first_row + r0, first_row + r0 + n) of
/// the tiles, `rows` describing those from first_row on. Scores, probabilities and their
/// pairs use the first n rows of S and P (the slab's, hot in cache for the next step).
template <class Tiles, class KeyOperand, class ValueOperand, class Mods, class Io>
void attend_slab(Tiles& t, const KeyOperand& k_tile, const ValueOperand& v_tile, const TileScalesRef& scales,
                 const Mods& mods, const ops::Dropout& dropout, const ops::PackedRows& rows, index_t first_row,
                 index_t r0, index_t n, index_t col0, int& values_finite, Io& io) {
  const index_t keys = slab_keys(mods, rows, r0, n, col0, k_tile);
  if (keys == 0) return;  // no row of the slab sees a key of the tile
  const auto k = [&] {
    if constexpr (std::is_same_v<KeyOperand, ops::PreparedOperand<bf16x2>>) return k_tile.columns(keys);
    else return k_tile;
  }();
  const auto v = [&] {
    if constexpr (std::is_same_v<ValueOperand, ops::PreparedOperand<bf16x2>>) return v_tile.leading((keys + 1) / 2);
    else return v_tile;
  }();
  const auto q = t.q.slice_rows(first_row + r0, n);
  Tile<float> o = t.o.slice_rows(first_row + r0, n);
  Tile<float> s = t.s.slice_rows(0, n);
  ops::RowStats stats = t.stats.slice(first_row + r0, n);
  detail::scores(s, q, k);  // (n, Bc) raw scores
  scales.scale_scores(s);   // 8-bit K: q . k * scale
  detail::for_head_pieces(rows, r0, n, [&](index_t first, const ops::PackedRows& piece) {
    Tile<float> s_piece = s.slice_rows(first, piece.count());
    mods.apply(s_piece, piece, col0, io);  // softcap, biases, masks
  });
  const auto& values = ops::values_of(v);
  if (values_finite < 0)  // after Q K^T: V has arrived. Over the whole tile: a later slab may see more keys
    values_finite = ops::all_finite(values) && scales.values_finite(tile_keys(k_tile));
  const ops::Dropout::Slab drop = dropout.slab(rows, r0, col0);
  if (!values_finite)
    return ops::online_softmax_step_visible_values(s, stats, o, values, mods.to_log2(), scales.v, drop);
  accumulate_values(t, s, stats, o, v, scales, mods.to_log2(), n, drop);
}

/// One key tile's work for the packed rows `rows`, which start at row first_row of the
/// tiles, with K and V as tiles (k_t, v; prepared or not) or read in place (RowRefs), a
/// slab of rows at a time (slab_rows_of). A V tile with an Inf or NaN takes the row-by-row
/// path that never multiplies it by the zero probability of a masked key; values_finite
/// (-1: not yet known) is checked once per tile, after the first Q K^T.
template <class Tiles, class KeyOperand, class ValueOperand, class Mods, class Io>
void attend_key_tile(Tiles& t, const KeyOperand& k, const ValueOperand& v, const TileScalesRef& scales,
                     const Mods& mods, const ops::Dropout& dropout, const ops::PackedRows& rows, index_t first_row,
                     index_t col0, int& values_finite, Io& io) {
  const index_t count = rows.count(), slab = slab_rows_of(t, count);
  for (index_t r0 = 0; r0 < count; r0 += slab)
    attend_slab(t, k, v, scales, mods, dropout, rows, first_row, r0, std::min(slab, count - r0), col0,
                values_finite, io);
}

/// Every packed row's work on one key tile, or, where the window (or a block mask's empty
/// blocks) hides some of them from this tile, each head's runs of rows that see it (rows
/// masked off are not computed).
template <class Tiles, class KeyOperand, class ValueOperand, class Mods, class Io>
void attend_visible_rows(Tiles& t, const KeyOperand& k, const ValueOperand& v, const TileScalesRef& scales,
                         const Mods& mods, const ops::Dropout& dropout, const ops::PackedRows& rows, index_t col0,
                         index_t cols, Io& io) {
  int values_finite = -1;  // whether V holds no Inf or NaN: -1 until the first product asks
  const auto [lo, hi] = mods.window().positions_seeing(rows.position0, rows.positions, col0, cols);
  const index_t end = rows.position0 + rows.positions;
  bool whole = true;  // every head's visible rows are all its rows: one product for all heads
  for (index_t g = 0; g < rows.heads && whole; ++g) {
    index_t runs = 0;
    mods.for_row_runs(rows.head0 + g, lo, hi, col0, cols, [&](index_t a, index_t b) {
      whole = whole && a == rows.position0 && b == end;
      ++runs;
    });
    whole = whole && runs == 1;
  }
  if (whole) {
    attend_key_tile(t, k, v, scales, mods, dropout, rows, 0, col0, values_finite, io);
    return;
  }
  for (index_t g = 0; g < rows.heads; ++g)
    mods.for_row_runs(rows.head0 + g, lo, hi, col0, cols, [&](index_t a, index_t b) {
      attend_key_tile(t, k, v, scales, mods, dropout, {rows.head0 + g, 1, a, b - a},
                      g * rows.positions + a - rows.position0, col0, values_finite, io);
    });
}

/// Loads an item's queries into t.q (rotated at their positions when p.rotary is set: query
/// i's is i + the diagonal's offset) and clears its output accumulator and statistics.
template <class T, class KV, class Tiles, class Io>
void start_query_block(const ForwardParams<T, KV>& p, const QueryBlock& blk, Tiles& t, Io& io) {
  const SequenceRange& seq = blk.range;
  const ops::PackedRows& rows = blk.rows;
  using QOp = typename decltype(t.q)::element_type;
  for (index_t g = 0; g < rows.heads; ++g) {                       // (positions, d) per head
    auto q_head = t.q.slice_rows(g * rows.positions, rows.positions);
    const auto q = sequence_matrix(p.q, seq.view_batch, rows.head0 + g, seq.q_start, seq.q_len);
    if (p.rotary.enabled())
      ops::load_rows_rotated(q_head, q, rows.position0, rows.positions, p.rotary,
                             rows.position0 + p.mask_offset(seq), io);
    else
      load_rows(q_head, q, rows.position0, rows.positions, io);
  }
  t.q.set_extent(rows.count(), operand_cols<QOp>(p.head_dim()));   // (Br, d)
  if constexpr (std::is_same_v<QOp, float>)
    if (p.hadamard) ops::hadamard_rows(t.q);                       // (Br, d): H q (4-bit K stored as H k)
  t.o.set_extent(rows.count(), p.head_dim_v());                    // (Br, dv)
  ops::fill(t.o, 0.0f);
  t.stats.reset(rows.count());
}

/// The key tiles an item visits: [col_begin, key_end) in steps of Bc. Key tiles start at
/// the item's first key (blk.key_begin) plus multiples of Bc: at multiples of Bc for a
/// whole sequence or a split-KV chunk (whose chunks are multiples of Bc), and right after
/// the shared keys for a sequence's own items after a prefix-once pass (any whole number of
/// pages, kernels/shared_prefix.hpp), so no tile reaches back into keys another item
/// attends. Each row meets the same tiles whatever query tile it is in: results do not
/// depend on the packing or the thread count.
struct KeyRange {
  index_t col_begin, key_end;
};
template <class Mods>
KeyRange key_range(const QueryBlock& blk, const Mods& mods, index_t bc) {
  const ops::PackedRows& rows = blk.rows;
  const index_t key_end = std::min(blk.key_end, mods.window().end(rows.position0 + rows.positions - 1));
  const index_t key_first = std::max(blk.key_begin, mods.window().first(rows.position0));
  return {blk.key_begin + (key_first - blk.key_begin) / bc * bc, key_end};
}

/// One work item: the forward's one key loop, whatever the loader (kernels/key_loaders.hpp)
/// that brings its key tiles to the products. Phases: start (each head's queries, its
/// output and statistics cleared), then per key tile skip (no rows see it: never loaded),
/// load, and per head the products, the online softmax and the accumulation of O
/// (attend_visible_rows), then finish (O and LSE, or a partial state). `scores` gives the
/// item's score modifiers (ops::BuiltinScores, or ops::FlexScores).
template <class Loader, class T, class KV, class Scores, class Io>
  requires key_tile_loader<Loader, std::invoke_result_t<const Scores&, const ForwardParams<T, KV>&, index_t,
                                                         const SequenceRange&>, Io>
void forward_item(const ForwardParams<T, KV>& p, const TilePlan& plan, const QueryBlock& blk, Loader& loader,
                  const Scores& scores, Io& io) {
  const auto mods = scores(p, blk.sequence, blk.range);
  const ops::Dropout dropout(p.dropout, blk.sequence, p.heads());
  loader.for_each_head([&](auto& t, const QueryBlock& head) { start_query_block(p, head, t, io); });  // start
  const index_t bc = plan.key_tile_rows;
  const KeyRange keys = key_range(blk, mods, bc);
  for (index_t col0 = keys.col_begin; col0 < keys.key_end; col0 += bc) {
    const index_t cols = std::min(bc, keys.key_end - col0);
    if (!loader.select(mods, col0, cols)) continue;  // skip
    loader.load(col0, cols, keys.key_end, io);       // load
    loader.for_each_operand(col0, cols, io, [&](auto& t, const auto& k, const auto& v, const TileScalesRef& scales,
                                                const ops::PackedRows& rows) {
      attend_visible_rows(t, k, v, scales, mods, dropout, rows, col0, cols, io);  // products, softmax, accumulate
    });
  }
  loader.for_each_head([&](auto& t, const QueryBlock& head) { finish_query_block(p, head, t, io); });  // finish
}

template <class T, class KV, class Tiles, class Io>
void finish_query_block(const ForwardParams<T, KV>& p, const QueryBlock& blk, Tiles& t, Io& io) {
  if (blk.partial >= 0) store_partial_state(p, blk, t, io);
  else store_output(p, blk, t, io);
}

/// o /= l (times dropout's 1 / (1 - p')), lse; O and LSE stored (sinks folded in).
template <class T, class KV, class Tiles, class Io>
void store_output(const ForwardParams<T, KV>& p, const QueryBlock& blk, Tiles& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SequenceRange& seq = blk.range;
  const ops::PackedRows& rows = blk.rows;
  for (index_t g = 0; g < rows.heads; ++g) {
    const index_t r0 = g * rows.positions, head = rows.head0 + g;
    Tile<float> o_head = t.o.slice_rows(r0, rows.positions);
    const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
    const ops::RowStats stats = t.stats.slice(r0, rows.positions);
    ops::finalize_rows(o_head, stats, t.lse.data() + r0, p.sinks.empty() ? nullptr : &sink,
                       ops::Dropout(p.dropout, blk.sequence, p.heads()).kept_scale());  // o *= 1 / (1 - p')
    if (p.hadamard) ops::hadamard_rows(o_head);                  // V stored as H v: O = H (P H v)
    store_rows(sequence_matrix(p.o, seq.view_batch, head, seq.q_start, seq.q_len), rows.position0, o_head, io);
    const auto store_rows_of = [&](const LseView& out, const float* values) {
      if (out.data)
        store_vector(&out(seq.view_batch, head, seq.q_start + rows.position0), out.stride[2], values,
                     rows.positions, io);
    };
    store_rows_of(p.lse, t.lse.data() + r0);
    store_rows_of(p.row_max, stats.max.data());
    store_rows_of(p.row_sum, stats.sum.data());
  }
}

/// The rows [first, first + q_len) of o_accum (head_dim_v floats each): one head's partial
/// state of one key chunk, as a matrix of the sequence's query positions.
template <class T, class KV>
MatrixView<float> accum_matrix(const ForwardParams<T, KV>& p, index_t first, index_t q_len) {
  return {p.o_accum + first * p.head_dim_v(), q_len, p.head_dim_v(), p.head_dim_v(), 1};
}

/// One key chunk's partial state, no sink (the merge adds it once): O normalized over the
/// chunk to o_accum, and each row's max and sum as the online softmax left them (no LSE,
/// whose float would round the sum away at large scores) to max_accum / sum_accum.
template <class T, class KV, class Tiles, class Io>
void store_partial_state(const ForwardParams<T, KV>& p, const QueryBlock& blk, Tiles& t, Io& io) {
  const ops::PackedRows& rows = blk.rows;
  for (index_t g = 0; g < rows.heads; ++g) {
    const index_t r0 = g * rows.positions, first = blk.partial + (rows.head0 + g) * blk.range.q_len;
    Tile<float> o_head = t.o.slice_rows(r0, rows.positions);
    const ops::RowStats stats = t.stats.slice(r0, rows.positions);
    ops::normalize_rows(o_head, stats);
    store_rows(accum_matrix(p, first, blk.range.q_len), rows.position0, o_head, io);
    store_vector(p.max_accum + first + rows.position0, 1, stats.max.data(), rows.positions, io);
    store_vector(p.sum_accum + first + rows.position0, 1, stats.sum.data(), rows.positions, io);
  }
}

/// Merges query head `head`'s partial states of one split sequence in key order (its shared
/// prefix's states first, if any, then its chunks') and stores O and LSE as the unsplit
/// kernel would (sink included, once).
template <class T, class KV, class Io>
void merge_partial_states(const ForwardParams<T, KV>& p, const Merge& m, index_t head, MergeTiles& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SequenceRange& seq = m.range;
  const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
  const index_t prefix = m.prefix.chunks;
  const auto state = [&](index_t c) {
    const index_t first =
        c < prefix ? m.prefix.row(c, head) : m.partial + ((c - prefix) * p.heads() + head) * seq.q_len;
    const MatrixView<float> o = accum_matrix(p, first, seq.q_len);
    return PartialState<float, MaxSumRows>{{o.data, o.rows, o.cols, o.row_stride, 1},
                                           {p.max_accum + first, p.sum_accum + first}};
  };
  float* lse = p.lse.data ? &p.lse(seq.view_batch, head, seq.q_start) : nullptr;
  merge_rows(prefix + m.chunks, state, sequence_matrix(p.o, seq.view_batch, head, seq.q_start, seq.q_len), lse,
             p.lse.stride[2], p.sinks.empty() ? nullptr : &sink, t, io, [&](Tile<float>& o) {
               if (p.hadamard) ops::hadamard_rows(o);  // partial states stay rotated: H undone once, merged
             });
}

/// The SRAM an in-place item of `work` carves (in_place_item_bytes for its K/V heads per item).
template <class T, class KV>
std::size_t in_place_bytes_of(const ForwardParams<T, KV>& p, const TilePlan& plan, const ForwardWorkList& work) {
  const index_t heads = work.kv_heads_per_item();  // float and pair items may both run: the larger
  const std::size_t floats = in_place_item_bytes<KV, float>(plan, p.head_dim(), p.head_dim_v(), heads);
  if constexpr (in_place_pairs_possible<T, KV>)
    if (in_place_pairs_for<T, KV>(in_place_max_rows))
      return std::max(floats, in_place_item_bytes<KV, bf16x2>(plan, p.head_dim(), p.head_dim_v(), heads));
  return floats;
}

/// One work item on the calling worker, from the worker's scratch: K and V read in place
/// (InPlaceLoader, its Q and P float or bf16 pairs by the K/V group's query rows:
/// with_in_place_operand) where the work
/// list decided so (QueryBlock::in_place), else packed into
/// SRAM tiles of the operand type the micro-kernels multiply (PackedLoader).
template <class Kv, class T, class KV, class Scores, class Io>
void run_item(const ForwardParams<T, KV>& p, const TilePlan& plan, const QueryBlock& blk, std::size_t in_place_bytes,
              const Scores& scores, Io& counter) {
  if (blk.in_place) {
    with_in_place_operand<T, KV>(p.group_size() * blk.range.q_len, [&]<class Op>(std::type_identity<Op>) {
      InPlaceLoader<Kv, T, KV, Op> loader(p, plan, blk, worker_scratch(in_place_bytes));
      forward_item(p, plan, blk, loader, scores, counter);
    });
  } else {
    with_tile_operand<T, KV>([&]<class Op>(std::type_identity<Op>) {
      auto tiles = ForwardTiles<Op>::carve(worker_scratch(plan.working_set_bytes), plan.packed_rows(),
                                           plan.key_tile_rows, p.head_dim(), p.head_dim_v(), plan.panels);
      PackedLoader<Kv, T, KV, Op> loader(p, blk, tiles);
      forward_item(p, plan, blk, loader, scores, counter);
    });
  }
}

/// The merges of `work`'s split sequences (after all of its items ran), a (sequence, query
/// head) per item; `io` holds a counter per worker and grows if the merges use more.
template <class T, class KV, class Io>
void run_merges(const ForwardParams<T, KV>& p, const TilePlan& plan, const ForwardWorkList& work,
                const Execution& exec, std::vector<Io>& io) {
  const auto merges = static_cast<index_t>(work.merges().size()) * p.heads();
  if (merges == 0) return;
  index_t longest = 1;
  for (const Merge& m : work.merges()) longest = std::max(longest, m.range.q_len);
  const index_t rows = merge_block_rows(std::min<index_t>(longest, 64), p.head_dim_v(), plan.sram_budget_bytes);
  if (worker_count(exec, merges) > static_cast<int>(io.size()))
    io.resize(static_cast<std::size_t>(worker_count(exec, merges)));
  parallel_for(exec, merges, [&](index_t item, int worker) {
    auto tiles = MergeTiles::carve(worker_scratch(MergeTiles::footprint(rows, p.head_dim_v())), rows,
                                   p.head_dim_v());
    merge_partial_states(p, work.merges()[static_cast<std::size_t>(item / p.heads())], item % p.heads(),
                         tiles, io[static_cast<std::size_t>(worker)]);
  });
}

/// The bytes the counters of `io` counted (zero unless Io counts).
template <class Io>
IoCounts total_counts(const std::vector<Io>& io) {
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

/// Runs every work item of `work` under `exec`, then the split sequences' merges; returns
/// the HBM traffic counted (zero unless Io counts). Each worker's scratch holds exactly the
/// plan's working set (planned for with_tile_operand<T>'s Op). Kv says where K and V live; `scores`
/// gives each item's score modifiers.
template <io_policy Io, class Kv = ContiguousKv, class T, class KV, class Scores = ops::BuiltinScores>
  requires kv_source<Kv, ForwardParams<T, KV>> && ops::forward_score_source<Scores, ForwardParams<T, KV>, Io>
IoCounts run_forward(const ForwardParams<T, KV>& p, const TilePlan& plan, const ForwardWorkList& work,
                     const Execution& exec, const Scores& scores = {}) {
  const std::size_t in_place_bytes = in_place_bytes_of(p, plan, work);
  std::vector<Io> io(static_cast<std::size_t>(worker_count(exec, work.size())));
  parallel_for(exec, work.size(), [&](index_t item, int worker) {
    run_item<Kv>(p, plan, work[item], in_place_bytes, scores, io[static_cast<std::size_t>(worker)]);
  });
  run_merges(p, plan, work, exec, io);
  return total_counts(io);
}

/// The same over the work list of an unsplit forward.
template <io_policy Io, class T, class KV, class Scores = ops::BuiltinScores>
  requires ops::forward_score_source<Scores, ForwardParams<T, KV>, Io>
IoCounts run_forward(const ForwardParams<T, KV>& p, const TilePlan& plan, const Execution& exec,
                     const Scores& scores = {}) {
  return run_forward<Io>(p, plan, ForwardWorkList(p, plan, {}, in_place_heads_per_item(p, plan), scores), exec,
                         scores);
}

}  // namespace tileattn::kernels
