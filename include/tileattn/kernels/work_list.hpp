// tileattn/kernels/work_list.hpp: the forward pass's work items, (sequence, query tile,
// K/V head, head chunk), numbered longest first.
//
// A work item is a QueryBlock: the query heads of one K/V group (or a chunk of them, if
// the group is larger than a tile) at one tile of query positions of one sequence. The
// backends hand items out in index order, so numbering the blocks that see the most keys
// first (causal, windowed and variable-length batches are uneven) lets threads finish
// together. The list holds one entry per (sequence, query tile): O(N / Br) memory.
#pragma once

#include <algorithm>
#include <vector>

#include "tileattn/core/params.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::kernels {

struct QueryBlock {
  index_t sequence;    // batch index b
  SequenceRange range;  // where sequence b lives in the views
  index_t kv_head;
  ops::PackedRows rows;  // query heads and positions packed into the tile
};

class ForwardWorkList {
 public:
  template <class T>
  ForwardWorkList(const ForwardParams<T>& p, const TilePlan& plan)
      : heads_kv_(p.heads_kv()),
        group_(p.group_size()),
        heads_per_tile_(plan.heads_per_tile),
        chunks_((group_ + heads_per_tile_ - 1) / heads_per_tile_) {
    for (index_t b = 0; b < p.batch(); ++b) {
      const SequenceRange seq = p.sequence(b);
      const ops::KeyWindow window = ops::KeyWindow::of(p, seq);
      for (index_t row0 = 0; row0 < seq.q_len; row0 += plan.query_tile_rows) {
        const index_t rows = std::min(plan.query_tile_rows, seq.q_len - row0);
        const index_t keys = std::max<index_t>(0, window.end(row0 + rows - 1) - window.first(row0));
        tiles_.push_back({b, seq, row0, rows, keys});
      }
    }
    std::stable_sort(tiles_.begin(), tiles_.end(),
                     [](const Tile& a, const Tile& b) { return a.keys > b.keys; });
  }

  index_t size() const { return static_cast<index_t>(tiles_.size()) * heads_kv_ * chunks_; }

  QueryBlock operator[](index_t item) const {
    const Tile& t = tiles_[static_cast<std::size_t>(item / (heads_kv_ * chunks_))];
    const index_t rest = item % (heads_kv_ * chunks_);
    const index_t kv_head = rest / chunks_, chunk = rest % chunks_;
    const index_t head0 = kv_head * group_ + chunk * heads_per_tile_;
    const index_t heads = std::min(heads_per_tile_, (kv_head + 1) * group_ - head0);
    return {t.sequence, t.range, kv_head, {head0, heads, t.row0, t.rows}};
  }

 private:
  struct Tile {
    index_t sequence;
    SequenceRange range;
    index_t row0, rows;
    index_t keys;  // keys some row of the tile sees: the work-size estimate
  };
  index_t heads_kv_, group_, heads_per_tile_, chunks_;
  std::vector<Tile> tiles_;
};

}  // namespace tileattn::kernels
