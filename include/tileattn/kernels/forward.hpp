// tileattn/kernels/forward.hpp: the tiled forward kernel (FlashAttention-2 loop order).
//
// Work items are (batch, head, query tile). Each loads its Q tile once, streams the K/V
// tiles it can see through SRAM with an online softmax, and writes O and LSE once.
// Causal key tiles wholly above the diagonal are never loaded.
#pragma once

#include <algorithm>
#include <numbers>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/memory/io_counter.hpp"
#include "tileattn/memory/scratch_arena.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/matmul.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::kernels {

/// Everything one forward work item keeps in SRAM. Footprint: forward_working_set_bytes.
template <index_t D>
struct ForwardTiles {
  Tile<float, D> q;       // (Br, D) queries, scaled into log2 units
  Tile<float> k_t;        // (D, Bc) keys, transposed
  Tile<float, D> v;       // (Bc, D) values
  Tile<float> s;          // (Br, Bc) scores, then probabilities
  Tile<float, D> o;       // (Br, D) output accumulator
  ops::RowStats stats;    // (Br) running max and sum
  TileVector<float> lse;  // (Br)

  static ForwardTiles carve(ScratchArena& arena, const TilePlan& plan) {
    const index_t br = plan.query_tile_rows, bc = plan.key_tile_rows;
    return {Tile<float, D>::carve(arena, br), Tile<float>::carve(arena, D, bc),
            Tile<float, D>::carve(arena, bc),  Tile<float>::carve(arena, br, bc),
            Tile<float, D>::carve(arena, br),  ops::RowStats::carve(arena, br),
            TileVector<float>::carve(arena, br)};
  }
};

/// The (batch, head, query tile) a work item stands for.
struct ForwardWorkItem {
  index_t batch, head, query_tile;
};

/// Numbers work items so that, under causal masking, the query tiles with the most keys
/// come first: the backends hand items out in order, so threads finish together.
struct ForwardWorkList {
  index_t batch, heads, query_tiles;
  bool longest_first;

  index_t size() const { return batch * heads * query_tiles; }
  ForwardWorkItem operator[](index_t item) const {
    const index_t rank = item / (batch * heads), bh = item % (batch * heads);
    return {bh / heads, bh % heads, longest_first ? query_tiles - 1 - rank : rank};
  }
};

/// Keys [0, end) that some query in [row0, row0 + rows) can see.
template <class T>
index_t visible_key_end(const ForwardParams<T>& p, index_t row0, index_t rows) {
  if (!p.causal) return p.seqlen_k();
  return std::clamp<index_t>(row0 + rows + p.causal_offset(), 0, p.seqlen_k());
}

template <index_t D, class Io>
void forward_work_item(const ForwardParams<float>& p, const TilePlan& plan,
                       ForwardWorkItem w, ForwardTiles<D>& t, Io& io) {
  constexpr float log2e = std::numbers::log2e_v<float>;
  const auto q = head_matrix(p.q, w.batch, w.head), k = head_matrix(p.k, w.batch, w.head),
             v = head_matrix(p.v, w.batch, w.head);
  const index_t row0 = w.query_tile * plan.query_tile_rows;
  const index_t rows = std::min(plan.query_tile_rows, p.seqlen_q() - row0);
  const index_t key_end = visible_key_end(p, row0, rows);

  load_rows(t.q, q, row0, rows, io);                                // (rows, D)
  ops::scale(t.q, p.softmax_scale * log2e);                         // scores in log2 units
  t.o.set_extent(rows);                                             // (rows, D)
  ops::fill(t.o, 0.0f);
  t.stats.reset(rows);
  for (index_t col0 = 0; col0 < key_end; col0 += plan.key_tile_rows) {
    const index_t cols = std::min(plan.key_tile_rows, key_end - col0);
    load_rows_transposed(t.k_t, k, col0, cols, io);                 // (D, cols)
    load_rows(t.v, v, col0, cols, io);                              // (cols, D)
    ops::matmul(t.s, t.q, t.k_t);                                   // (rows, cols)
    if (p.causal && col0 + cols - 1 > row0 + p.causal_offset())
      ops::mask_causal(t.s, row0, col0, p.causal_offset());
    ops::online_softmax_step(t.s, t.stats, t.o);                    // s := P (rows, cols)
    ops::matmul_accumulate(t.o, t.s, t.v);                          // (rows, D)
  }
  ops::finalize_rows(t.o, t.stats, t.lse.data());                   // o /= l, lse
  store_rows(head_matrix(p.o, w.batch, w.head), row0, t.o, io);
  if (p.lse.data)
    store_vector(&p.lse(w.batch, w.head, row0), p.lse.stride[2], t.lse.data(), rows, io);
}

/// Runs every work item under `exec`; returns the HBM traffic counted (zero unless Io counts).
template <index_t D, class Io>
IoCounts run_forward(const ForwardParams<float>& p, const TilePlan& plan, const Execution& exec) {
  const ForwardWorkList work{p.batch(), p.heads(), plan.query_tiles(p.seqlen_q()), p.causal};
  std::vector<Io> io(static_cast<std::size_t>(worker_count(exec)));
  parallel_for(exec, work.size(), [&](index_t item, int worker) {
    auto tiles = ForwardTiles<D>::carve(worker_scratch(plan.sram_budget_bytes), plan);
    forward_work_item<D>(p, plan, work[item], tiles, io[static_cast<std::size_t>(worker)]);
  });
  IoCounts total;
  if constexpr (Io::enabled)
    for (const Io& counter : io) total += counter.counts;
  return total;
}

}  // namespace tileattn::kernels
