// tileattn/kernels/work_list.hpp: the forward pass's work items, (sequence, query tile,
// key chunk, K/V head, head chunk), numbered longest first; and, for split-KV, the merges.
//
// A work item is a QueryBlock: the query heads of one K/V group (or a chunk of them, if
// the group is larger than a tile) at one tile of query positions of one sequence, against
// the sequence's keys or, under split-KV (flash-decoding), one chunk of them. The backends
// hand items out in index order, so numbering the blocks that see the most keys first
// (causal, windowed and variable-length batches are uneven) lets threads finish together.
//
// Split-KV. When a KeySplit is given, a sequence with few query rows and more keys than one
// chunk has its keys cut at multiples of keys_per_split; each chunk's item writes a partial
// state (O normalized over the chunk, and each row's max score and sum, kept apart) to the
// params' o_accum / max_accum / sum_accum, and a Merge item per (sequence, query head)
// combines them in chunk order afterwards (ops/merge_states.hpp). The chunking depends
// only on the shapes, never on the thread count, so every thread count gives the same
// bits. The list holds one entry per (sequence, query tile, key chunk): O(N / Br) memory.
//
// K and V in place. Whether an item reads K and V where they lie (decoding, short verify
// steps) or packs them into SRAM tiles is decided here, once, when the list is made
// (reads_kv_in_place, QueryBlock::in_place): a property of the sequence's shape.
//
// K/V heads per item. When every sequence reads K and V in place (decoding, short verify
// steps), an item may take kv_heads consecutive K/V heads: it then reads each key's rows of
// all those heads, which lie next to each other in the [.., seqlen, heads_kv, head_dim]
// layout, as one contiguous run (a whole page of a paged cache) instead of heads_kv
// strided pieces, which the hardware prefetchers follow far better (docs/paged.md).
// Each head's arithmetic is unchanged: only the order in which heads run changes.
//
// Shared prefixes (prefix-once attention, kernels/shared_prefix.hpp). A sequence given
// PrefixStates had its first `keys` keys attended by another list's items, together with
// the other sequences that share those pages; its own items attend only the keys after
// them and always write partial states, and its Merge folds the prefix's states in first.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "tileattn/core/params.hpp"
#include "tileattn/kernels/key_split.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/ops/score_mods.hpp"
#include "tileattn/ops/score_source.hpp"

namespace tileattn::kernels {

/// Where a sequence's shared-prefix states are (kernels/shared_prefix.hpp): its keys
/// [0, keys) were attended in `chunks` partial states, state c's row of query head h and
/// position i at o_accum row partial + c * chunk_stride + h * head_stride + i. chunks == 0:
/// no shared prefix.
struct PrefixStates {
  index_t keys = 0;
  index_t chunks = 0;
  index_t partial = 0, chunk_stride = 0, head_stride = 0;

  index_t row(index_t chunk, index_t head) const { return partial + chunk * chunk_stride + head * head_stride; }
};

/// The shared prefixes of a batch's sequences (one PrefixStates per sequence, or none),
/// and the first o_accum row a list's own partial states take (after the prefix pass's).
struct SharedPrefixes {
  std::span<const PrefixStates> of_sequence{};
  index_t partial_base = 0;
};

/// Query rows per K/V group (positions x query heads) up to which a sequence reads K and V
/// in place instead of packing them into SRAM tiles: decoding and short verify steps,
/// where a packed K^T or V tile would serve too few rows to pay for the copy (docs/paged.md).
inline constexpr index_t in_place_max_rows = 16;

/// Whether sequence `seq`'s work items read K and V in place: head vectors contiguous in
/// memory, and at most in_place_max_rows query rows per K/V group. A property of the
/// sequence's shape alone, so every tiling and thread count agrees.
template <class T, class KV>
bool reads_kv_in_place(const ForwardParams<T, KV>& p, const SequenceRange& seq) {
  return p.k.stride[dim::head_dim] == 1 && p.v.stride[dim::head_dim] == 1 &&
         seq.q_len * p.group_size() <= in_place_max_rows;
}

struct QueryBlock {
  index_t sequence;      // batch index b
  SequenceRange range;   // where sequence b lives in the views
  index_t kv_head;
  ops::PackedRows rows;  // query heads and positions packed into the tile
  index_t key_begin = 0, key_end = 0;  // the keys this item attends: [key_begin, key_end)
  index_t partial = -1;  // >= 0: first o_accum row of its partial state; -1: writes O
  index_t kv_heads = 1;  // K/V heads kv_head, kv_head + 1, ... this item attends (rows: the first's)
  bool in_place = false;  // reads K and V where they lie (reads_kv_in_place), decided with the list
};

/// One split sequence's merge: `chunks` partial states, each heads_q x q_len rows from
/// o_accum row `partial` on (state c, head h, position i at partial + (c * heads_q + h) * q_len + i),
/// after the states of its shared prefix, if any (they hold its first keys).
struct Merge {
  index_t sequence;
  SequenceRange range;
  index_t chunks;
  index_t partial;
  PrefixStates prefix{};
};

class ForwardWorkList {
 public:
  /// kv_heads_per_item divides heads_kv; > 1 only when each tile holds a whole group.
  /// `scores` (the kernel's score-modifier source) refines each tile's work estimate.
  /// `shared`: the sequences whose first keys a shared prefix's pass attends (none by default).
  template <class T, class KV, class Scores = ops::BuiltinScores>
    requires ops::forward_score_source<Scores, ForwardParams<T, KV>>
  ForwardWorkList(const ForwardParams<T, KV>& p, const TilePlan& plan, const KeySplit& split = {},
                  index_t kv_heads_per_item = 1, const Scores& scores = {}, const SharedPrefixes& shared = {})
      : heads_kv_(p.heads_kv()),
        group_(p.group_size()),
        heads_per_tile_(plan.heads_per_tile),
        chunks_((group_ + heads_per_tile_ - 1) / heads_per_tile_),
        kv_heads_per_item_(chunks_ == 1 ? kv_heads_per_item : 1),
        kv_groups_(heads_kv_ / kv_heads_per_item_),
        partial_rows_(shared.partial_base) {
    for (index_t b = 0; b < p.batch(); ++b) {
      const auto at = static_cast<std::size_t>(b);
      add_sequence(p, plan, split, b, scores, at < shared.of_sequence.size() ? shared.of_sequence[at] : PrefixStates{});
    }
    std::stable_sort(tiles_.begin(), tiles_.end(),
                     [](const Tile& a, const Tile& b) { return a.keys > b.keys; });
  }

  index_t size() const { return static_cast<index_t>(tiles_.size()) * kv_groups_ * chunks_; }
  index_t kv_heads_per_item() const { return kv_heads_per_item_; }

  QueryBlock operator[](index_t item) const {
    const Tile& t = tiles_[static_cast<std::size_t>(item / (kv_groups_ * chunks_))];
    const index_t rest = item % (kv_groups_ * chunks_);
    const index_t kv_head = rest / chunks_ * kv_heads_per_item_, chunk = rest % chunks_;
    const index_t head0 = kv_head * group_ + chunk * heads_per_tile_;
    const index_t heads = std::min(heads_per_tile_, (kv_head + 1) * group_ - head0);
    return {t.sequence, t.range, kv_head, {head0, heads, t.row0, t.rows}, t.key_begin, t.key_end, t.partial,
            kv_heads_per_item_, t.in_place};
  }

  /// The split sequences' merges, and the partial-state rows (o_accum rows, max_accum and
  /// sum_accum entries) their states take (from SharedPrefixes::partial_base on: the count
  /// includes the rows before it).
  const std::vector<Merge>& merges() const { return merges_; }
  index_t partial_rows() const { return partial_rows_; }

 private:
  struct Tile {
    index_t sequence;
    SequenceRange range;
    index_t row0, rows;
    index_t keys;  // keys some row of the tile sees: the work-size estimate
    index_t key_begin, key_end, partial;
    bool in_place;
  };

  /// Sequence b's tiles and key chunks: keys [prefix.keys, k_len) (a shared prefix's pass
  /// attends the keys before), cut at multiples of keys_per_split from there when it splits.
  template <class T, class KV, class Scores>
  void add_sequence(const ForwardParams<T, KV>& p, const TilePlan& plan, const KeySplit& split, index_t b,
                    const Scores& scores, const PrefixStates& prefix) {
    const SequenceRange seq = p.sequence(b);
    const ops::KeyWindow window = ops::KeyWindow::of(p, seq);
    const bool in_place = reads_kv_in_place(p, seq);
    const index_t lo = prefix.chunks > 0 ? prefix.keys : 0, own = seq.k_len - lo;  // keys of its own items
    const bool cut = split.splits(seq.q_len, group_, own);
    const bool split_keys = cut || split.partial_states || prefix.chunks > 0;  // partial states, merged
    const index_t step = cut ? split.keys_per_split : std::max<index_t>(own, 1);
    const index_t key_chunks = (std::max<index_t>(own, 1) + step - 1) / step;
    if (split_keys && seq.q_len > 0) {
      merges_.push_back({b, seq, key_chunks, partial_rows_, prefix});
    }
    for (index_t c = 0; c < key_chunks; ++c) {
      const index_t begin = lo + c * step, end = split_keys ? std::min(seq.k_len, begin + step) : seq.k_len;
      const index_t partial = split_keys ? partial_rows_ + c * p.heads() * seq.q_len : -1;
      for (index_t row0 = 0; row0 < seq.q_len; row0 += plan.query_tile_rows) {
        const index_t rows = std::min(plan.query_tile_rows, seq.q_len - row0);
        const index_t first = std::max(begin, window.first(row0));
        const index_t keys = scores.estimate_keys(
            b, row0, rows, first, std::max<index_t>(0, std::min(end, window.end(row0 + rows - 1)) - first));
        tiles_.push_back({b, seq, row0, rows, keys, begin, end, partial, in_place});
      }
    }
    if (split_keys) partial_rows_ += key_chunks * p.heads() * seq.q_len;
  }

  index_t heads_kv_, group_, heads_per_tile_, chunks_, kv_heads_per_item_, kv_groups_;
  std::vector<Tile> tiles_;
  std::vector<Merge> merges_;
  index_t partial_rows_ = 0;
};

}  // namespace tileattn::kernels
