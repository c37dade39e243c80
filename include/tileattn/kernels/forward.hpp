// tileattn/kernels/forward.hpp: the tiled forward kernel (FlashAttention-2 loop order).
//
// A work item is a QueryBlock (kernels/work_list.hpp). It loads the Q tiles of its query
// heads once, streams through SRAM only the K/V tiles some of its rows can see (causal and
// windowed tiles outside the band are never loaded), applies the score modifiers, keeps
// an online softmax, and writes O and LSE once, or, for one key chunk of a split-KV
// sequence, its partial state, which a merge pass combines (run_merges). Where K and V
// live is a policy: contiguous views (ContiguousKv) or a paged cache read through its block
// table (PagedKv, for forward_paged); the loop is the same.
#pragma once

#include <algorithm>
#include <numbers>
#include <type_traits>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/merge.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/online_softmax.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::kernels {

/// Hint the next K/V tile into cache while this one is computed (docs/performance.md has
/// the measured effect; define TILEATTN_NO_PREFETCH to compare).
#if defined(TILEATTN_NO_PREFETCH)
inline constexpr bool prefetch_next_kv_tile = false;
#else
inline constexpr bool prefetch_next_kv_tile = true;
#endif

/// The SRAM operand type of Q, K, V and P for storage type T: bf16 pairs where the arch
/// multiplies them natively (arch::native::bf16_dot_product), float otherwise (fp16 has no
/// such instruction here; float tiles keep its 11-bit significands exact, where bf16 tiles
/// would drop 3 bits: docs/precision.md).
template <class T>
using tile_operand_t =
    std::conditional_t<std::is_same_v<T, bf16> && arch::native::bf16_dot_product, bf16x2, float>;

template <class Op>
inline constexpr TileOperands tile_operands_v =
    std::is_same_v<Op, bf16x2> ? TileOperands::bf16_pairs : TileOperands::fp32;

/// Operand columns that hold n values (pairs hold two).
template <class Op>
constexpr index_t operand_cols(index_t n) {
  return std::is_same_v<Op, bf16x2> ? (n + 1) / 2 : n;
}

/// Everything one forward work item keeps in SRAM. Footprint: forward_working_set_bytes.
/// Op is float or bf16x2 (tile_operand_t); S and O accumulate in float either way.
template <class Op>
struct ForwardTiles {
  static constexpr bool pairs = std::is_same_v<Op, bf16x2>;
  Tile<Op> q;             // (Br, d) packed queries
  Tile<Op> k_t;           // (d, Bc) keys, transposed
  Tile<Op> v;             // (Bc, dv) values
  Tile<float> s;          // (Br, Bc) scores, then probabilities
  Tile<Op> p;             // (Br, Bc) probabilities rounded for P V (bf16 pairs only)
  Tile<float> o;          // (Br, dv) output accumulator
  ops::RowStats stats;    // (Br) running max and sum
  TileVector<float> lse;  // (Br)

  static ForwardTiles carve(ScratchArena& arena, const TilePlan& plan, index_t d, index_t dv) {
    const index_t br = plan.packed_rows(), bc = plan.key_tile_rows;
    ForwardTiles t;
    t.q = Tile<Op>::carve(arena, br, operand_cols<Op>(d));
    t.k_t = Tile<Op>::carve(arena, operand_cols<Op>(d), bc);
    t.v = Tile<Op>::carve(arena, operand_cols<Op>(bc), dv);
    t.s = Tile<float>::carve(arena, br, bc);
    if constexpr (pairs) t.p = Tile<Op>::carve(arena, br, operand_cols<Op>(bc));
    t.o = Tile<float>::carve(arena, br, dv);
    t.stats = ops::RowStats::carve(arena, br);
    t.lse = TileVector<float>::carve(arena, br);
    return t;
  }
};

/// The [len, head_dim] matrix of one head of one sequence.
template <class T>
MatrixView<T> sequence_matrix(const TensorView<T>& t, index_t view_batch, index_t head,
                              index_t start, index_t len) {
  MatrixView<T> m = head_matrix(t, view_batch, head);
  if (len > 0) m.data += start * m.row_stride;  // an empty sequence may start past the last row
  m.rows = len;
  return m;
}

/// K and V of a work item in contiguous [batch, seqlen, heads, head_dim] views.
struct ContiguousKv {
  template <class T, class View>
  static auto matrix(const ForwardParams<T>&, const View& view, const QueryBlock& blk) {
    return sequence_matrix(view, blk.range.view_batch, blk.kv_head, blk.range.k_start, blk.range.k_len);
  }
};

/// K and V of a work item in page pools, through the sequence's row of the block table.
struct PagedKv {
  template <class T, class View>
  static auto matrix(const ForwardParams<T>& p, const View& view, const QueryBlock& blk) {
    const auto& table = p.block_table;
    return paged_head_matrix(view, table.data + blk.sequence * table.stride[0], table.stride[1],
                             blk.kv_head, blk.range.k_len);
  }
};

/// One key tile's work for the packed rows `rows`, which start at row first_row of the
/// tiles. A V tile with an Inf or NaN takes the row-by-row path that never multiplies it
/// by the zero probability of a masked key.
template <class Op, class Io>
void attend_key_tile(ForwardTiles<Op>& t, const ops::ScoreModifiers& mods,
                     const ops::PackedRows& rows, index_t first_row, index_t col0,
                     bool values_finite, Io& io) {
  if (rows.count() == 0) return;
  const Tile<Op> q = t.q.slice_rows(first_row, rows.count());
  Tile<float> o = t.o.slice_rows(first_row, rows.count());
  Tile<float> s = t.s.slice_rows(first_row, rows.count());
  ops::RowStats stats = t.stats.slice(first_row, rows.count());
  ops::matmul(s, q, t.k_t);                                        // (rows, Bc) raw scores
  mods.apply(s, rows, col0, io);                                   // softcap, biases, masks
  if (values_finite) {
    if constexpr (ForwardTiles<Op>::pairs) {
      Tile<Op> p = t.p.slice_rows(first_row, rows.count());
      ops::online_softmax_step(s, stats, o, mods.to_log2(), &p);   // p := P in bf16, as on GPUs
      ops::matmul_accumulate(o, p, t.v);                           // (rows, dv)
    } else {
      ops::online_softmax_step(s, stats, o, mods.to_log2());       // s := P (rows, Bc)
      ops::matmul_accumulate(o, s, t.v);                           // (rows, dv)
    }
  } else {
    ops::online_softmax_step_visible_values(s, stats, o, t.v, mods.to_log2());
  }
}

template <class Kv, class T, class Op, class Io>
void forward_query_block(const ForwardParams<T>& p, const TilePlan& plan,
                         const QueryBlock& blk, ForwardTiles<Op>& t, Io& io) {
  const SequenceRange& seq = blk.range;
  const ops::PackedRows& rows = blk.rows;
  const ops::ScoreModifiers mods(p, blk.sequence, seq);
  const auto q_of = [&](const auto& view, index_t g) {
    return sequence_matrix(view, seq.view_batch, rows.head0 + g, seq.q_start, seq.q_len);
  };
  const auto k = Kv::matrix(p, p.k, blk);
  const auto v = Kv::matrix(p, p.v, blk);

  for (index_t g = 0; g < rows.heads; ++g) {                       // (positions, d) per head
    Tile<Op> q_head = t.q.slice_rows(g * rows.positions, rows.positions);
    load_rows(q_head, q_of(p.q, g), rows.position0, rows.positions, io);
  }
  t.q.set_extent(rows.count(), operand_cols<Op>(p.head_dim()));    // (Br, d)
  t.o.set_extent(rows.count(), p.head_dim_v());                    // (Br, dv)
  ops::fill(t.o, 0.0f);
  t.stats.reset(rows.count());

  // Key tiles start at multiples of Bc (and key chunks too), so each row meets the same
  // tiles whatever query tile it is in: results do not depend on the packing or the
  // thread count.
  const index_t bc = plan.key_tile_rows;
  const index_t key_end = std::min(blk.key_end, mods.window().end(rows.position0 + rows.positions - 1));
  const index_t key_first = std::max(blk.key_begin, mods.window().first(rows.position0));
  for (index_t col0 = key_first / bc * bc; col0 < key_end; col0 += bc) {
    const index_t cols = std::min(bc, key_end - col0);
    load_rows_transposed(t.k_t, k, col0, cols, io);                // (d, Bc)
    load_rows_pairwise(t.v, v, col0, cols, io);                    // (Bc, dv)
    if (const index_t next = col0 + cols; prefetch_next_kv_tile && next < key_end) {
      prefetch_rows(k, next, std::min(bc, key_end - next));
      prefetch_rows(v, next, std::min(bc, key_end - next));
    }
    const bool values_finite = ops::all_finite(t.v);
    const auto [lo, hi] = mods.window().positions_seeing(rows.position0, rows.positions, col0, cols);
    if (hi - lo == rows.positions) {
      attend_key_tile(t, mods, rows, 0, col0, values_finite, io);  // every packed row
    } else {                                                       // rows masked off are not computed
      for (index_t g = 0; g < rows.heads; ++g)
        attend_key_tile(t, mods, {rows.head0 + g, 1, lo, hi - lo},
                        g * rows.positions + lo - rows.position0, col0, values_finite, io);
    }
  }

  if (blk.partial >= 0) store_partial_state(p, blk, t, io);
  else store_output(p, blk, t, io);
}

/// o /= l, lse; O and LSE stored (sinks folded in).
template <class T, class Op, class Io>
void store_output(const ForwardParams<T>& p, const QueryBlock& blk, ForwardTiles<Op>& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SequenceRange& seq = blk.range;
  const ops::PackedRows& rows = blk.rows;
  for (index_t g = 0; g < rows.heads; ++g) {
    const index_t r0 = g * rows.positions, head = rows.head0 + g;
    Tile<float> o_head = t.o.slice_rows(r0, rows.positions);
    const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
    ops::finalize_rows(o_head, t.stats.slice(r0, rows.positions), t.lse.data() + r0,
                       p.sinks.empty() ? nullptr : &sink);
    store_rows(sequence_matrix(p.o, seq.view_batch, head, seq.q_start, seq.q_len), rows.position0, o_head, io);
    if (p.lse.data)
      store_vector(&p.lse(seq.view_batch, head, seq.q_start + rows.position0), p.lse.stride[2],
                   t.lse.data() + r0, rows.positions, io);
  }
}

/// The rows [first, first + q_len) of o_accum (head_dim_v floats each): one head's partial
/// state of one key chunk, as a matrix of the sequence's query positions.
template <class T>
MatrixView<float> accum_matrix(const ForwardParams<T>& p, index_t first, index_t q_len) {
  return {p.o_accum + first * p.head_dim_v(), q_len, p.head_dim_v(), p.head_dim_v(), 1};
}

/// One key chunk's partial state: O normalized over the chunk and the chunk's LSE, no
/// sink (the merge adds it once), to o_accum / lse_accum.
template <class T, class Op, class Io>
void store_partial_state(const ForwardParams<T>& p, const QueryBlock& blk, ForwardTiles<Op>& t, Io& io) {
  const ops::PackedRows& rows = blk.rows;
  for (index_t g = 0; g < rows.heads; ++g) {
    const index_t r0 = g * rows.positions, first = blk.partial + (rows.head0 + g) * blk.range.q_len;
    Tile<float> o_head = t.o.slice_rows(r0, rows.positions);
    ops::finalize_rows(o_head, t.stats.slice(r0, rows.positions), t.lse.data() + r0);
    store_rows(accum_matrix(p, first, blk.range.q_len), rows.position0, o_head, io);
    store_vector(p.lse_accum + first + rows.position0, 1, t.lse.data() + r0, rows.positions, io);
  }
}

/// Merges query head `head`'s partial states of one split sequence in chunk order and
/// stores O and LSE as the unsplit kernel would (sink included).
template <class T, class Io>
void merge_partial_states(const ForwardParams<T>& p, const Merge& m, index_t head, MergeTiles& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SequenceRange& seq = m.range;
  const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
  const auto state = [&](index_t c) {
    const index_t first = m.partial + (c * p.heads() + head) * seq.q_len;
    const MatrixView<float> o = accum_matrix(p, first, seq.q_len);
    return PartialState<float>{{o.data, o.rows, o.cols, o.row_stride, 1}, p.lse_accum + first, 1};
  };
  float* lse = p.lse.data ? &p.lse(seq.view_batch, head, seq.q_start) : nullptr;
  merge_rows(m.chunks, state, sequence_matrix(p.o, seq.view_batch, head, seq.q_start, seq.q_len), lse,
             p.lse.stride[2], p.sinks.empty() ? nullptr : &sink, t, io);
}

/// Runs every work item of `work` under `exec`, then the split sequences' merges; returns
/// the HBM traffic counted (zero unless Io counts). Each worker's scratch holds exactly the
/// plan's working set (planned for tile_operand_t<T>). Kv says where K and V live.
template <class Io, class Kv = ContiguousKv, class T>
IoCounts run_forward(const ForwardParams<T>& p, const TilePlan& plan, const ForwardWorkList& work,
                     const Execution& exec) {
  using Op = tile_operand_t<T>;
  std::vector<Io> io(static_cast<std::size_t>(worker_count(exec, work.size())));
  parallel_for(exec, work.size(), [&](index_t item, int worker) {
    auto tiles = ForwardTiles<Op>::carve(worker_scratch(plan.working_set_bytes), plan,
                                         p.head_dim(), p.head_dim_v());
    forward_query_block<Kv>(p, plan, work[item], tiles, io[static_cast<std::size_t>(worker)]);
  });
  const auto merges = static_cast<index_t>(work.merges().size()) * p.heads();
  if (merges > 0) {
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
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

/// The same over the work list of an unsplit forward.
template <class Io, class T>
IoCounts run_forward(const ForwardParams<T>& p, const TilePlan& plan, const Execution& exec) {
  return run_forward<Io>(p, plan, ForwardWorkList(p, plan), exec);
}

}  // namespace tileattn::kernels
