// tileattn/kernels/forward.hpp: the tiled forward kernel (FlashAttention-2 loop order).
//
// A work item is a QueryBlock (kernels/work_list.hpp). It loads the Q tiles of its query
// heads once, streams through SRAM only the K/V tiles some of its rows can see (causal and
// windowed tiles outside the band are never loaded), applies the score modifiers, keeps
// an online softmax, and writes O and LSE once.
#pragma once

#include <algorithm>
#include <numbers>
#include <type_traits>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
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

template <class T, class Op, class Io>
void forward_query_block(const ForwardParams<T>& p, const TilePlan& plan,
                         const QueryBlock& blk, ForwardTiles<Op>& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const SequenceRange& seq = blk.range;
  const ops::PackedRows& rows = blk.rows;
  const ops::ScoreModifiers mods(p, blk.sequence, seq);
  const auto q_of = [&](const auto& view, index_t g) {
    return sequence_matrix(view, seq.view_batch, rows.head0 + g, seq.q_start, seq.q_len);
  };
  const auto k = sequence_matrix(p.k, seq.view_batch, blk.kv_head, seq.k_start, seq.k_len);
  const auto v = sequence_matrix(p.v, seq.view_batch, blk.kv_head, seq.k_start, seq.k_len);

  for (index_t g = 0; g < rows.heads; ++g) {                       // (positions, d) per head
    Tile<Op> q_head = t.q.slice_rows(g * rows.positions, rows.positions);
    load_rows(q_head, q_of(p.q, g), rows.position0, rows.positions, io);
  }
  t.q.set_extent(rows.count(), operand_cols<Op>(p.head_dim()));    // (Br, d)
  t.o.set_extent(rows.count(), p.head_dim_v());                    // (Br, dv)
  ops::fill(t.o, 0.0f);
  t.stats.reset(rows.count());

  // Key tiles start at multiples of Bc, so each row meets the same tiles whatever query
  // tile it is in: results do not depend on the packing or the thread count.
  const index_t bc = plan.key_tile_rows;
  const index_t key_end = mods.window().end(rows.position0 + rows.positions - 1);
  for (index_t col0 = mods.window().first(rows.position0) / bc * bc; col0 < key_end; col0 += bc) {
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

  for (index_t g = 0; g < rows.heads; ++g) {                       // o /= l, lse; store
    const index_t r0 = g * rows.positions, head = rows.head0 + g;
    Tile<float> o_head = t.o.slice_rows(r0, rows.positions);
    const float sink = p.sinks.empty() ? 0.0f : p.sinks[static_cast<std::size_t>(head)] * log2e;
    ops::finalize_rows(o_head, t.stats.slice(r0, rows.positions), t.lse.data() + r0,
                       p.sinks.empty() ? nullptr : &sink);
    store_rows(q_of(p.o, g), rows.position0, o_head, io);
    if (p.lse.data)
      store_vector(&p.lse(seq.view_batch, head, seq.q_start + rows.position0), p.lse.stride[2],
                   t.lse.data() + r0, rows.positions, io);
  }
}

/// Runs every work item under `exec`; returns the HBM traffic counted (zero unless Io counts).
/// Each worker's scratch holds exactly the plan's working set (planned for tile_operand_t<T>).
template <class Io, class T>
IoCounts run_forward(const ForwardParams<T>& p, const TilePlan& plan, const Execution& exec) {
  using Op = tile_operand_t<T>;
  const ForwardWorkList work(p, plan);
  std::vector<Io> io(static_cast<std::size_t>(worker_count(exec, work.size())));
  parallel_for(exec, work.size(), [&](index_t item, int worker) {
    auto tiles = ForwardTiles<Op>::carve(worker_scratch(plan.working_set_bytes), plan,
                                         p.head_dim(), p.head_dim_v());
    forward_query_block(p, plan, work[item], tiles, io[static_cast<std::size_t>(worker)]);
  });
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

}  // namespace tileattn::kernels
