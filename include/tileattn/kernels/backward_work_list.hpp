// tileattn/kernels/backward_work_list.hpp: the backward's work items, (sequence, K/V head,
// key tile), and the turns that make the dQ sums deterministic.
//
// A work item is a KeyBlock: one key tile of one (sequence, K/V head) and every query head
// of its group. Items are numbered key tile first (all streams' tile 0, then tile 1, ...),
// so that under a causal mask, where the first key tiles see the most queries, the longest
// items start first, and so that within one stream tile j always precedes tile j + 1.
//
// dQ_i sums dS_ij K_j over the key tiles j that query tile i sees, and those belong to
// different items. DqTurns makes them add in ascending j, whatever thread runs them: an
// item waits for its turn on each query tile (the previous key tile's item has added its
// part) and passes the turn on. With items started in index order (parallel_for_in_order),
// the lowest unfinished item never waits, so the waits always end.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "tileattn/core/error.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/kernels/backward_plan.hpp"
#include "tileattn/ops/score_mods.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tileattn::kernels {

struct KeyBlock {
  index_t sequence;     // batch index b
  SequenceRange range;  // where sequence b lives in the views
  index_t kv_head;
  index_t key_tile;     // j: keys [col0, col0 + cols)
  index_t col0, cols;
};

/// The query rows of tile `tile` (br rows from 0) that see some key of a key tile seen by
/// rows [lo, hi) (KeyWindow::positions_seeing): [r0, r1), empty when r0 >= r1.
inline std::pair<index_t, index_t> visited_rows(index_t lo, index_t hi, index_t tile, index_t br) {
  return {std::max(lo, tile * br), std::min(hi, (tile + 1) * br)};
}

/// The query rows [lo, hi) a key tile's item visits: the rows that see one of its keys
/// (KeyWindow::positions_seeing), with lo rounded down to a multiple of min(sum_group_values,
/// br): the rows of dK += dS^T Q and dV += P^T dO then group alike whatever key tile (and so
/// whatever thread count) they are visited with. The rows added see none of the tile's keys:
/// their P and dS are exact zeros. Empty stays empty.
template <class Window>
std::pair<index_t, index_t> rows_visiting(const Window& w, index_t q_len, index_t col0, index_t cols, index_t br) {
  const auto [lo, hi] = w.positions_seeing(0, q_len, col0, cols);
  const index_t g = std::min(sum_group_values, br);
  return {lo < hi ? lo / g * g : lo, hi};
}

/// The items of sequences [seq_begin, seq_end) x K/V heads [kv_begin, kv_end), key tile first.
class BackwardWorkList {
 public:
  template <class T>
  BackwardWorkList(const BackwardParams<T>& p, const BackwardTilePlan& plan, index_t seq_begin,
                   index_t seq_end, index_t kv_begin, index_t kv_end) {
    index_t most_tiles = 0;
    for (index_t b = seq_begin; b < seq_end; ++b) most_tiles = std::max(most_tiles, plan.key_tiles(p.sequence(b).k_len));
    for (index_t j = 0; j < most_tiles; ++j)
      for (index_t b = seq_begin; b < seq_end; ++b) {
        const SequenceRange seq = p.sequence(b);
        const index_t col0 = j * plan.key_tile_rows;
        if (col0 >= seq.k_len) continue;
        for (index_t h = kv_begin; h < kv_end; ++h)
          items_.push_back({b, seq, h, j, col0, std::min(plan.key_tile_rows, seq.k_len - col0)});
      }
  }
  index_t size() const { return static_cast<index_t>(items_.size()); }
  const KeyBlock& operator[](index_t i) const { return items_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<KeyBlock> items_;
};

/// One turn counter per (sequence, query tile, query head): the key tile whose item adds
/// to that tile of the dQ accumulator next.
class DqTurns {
 public:
  template <class T>
  DqTurns(const BackwardParams<T>& p, const BackwardTilePlan& plan) : heads_(p.heads()), br_(plan.query_tile_rows) {
    const index_t batch = p.batch();
    base_.resize(static_cast<std::size_t>(batch) + 1, 0);
    for (index_t b = 0; b < batch; ++b) base_[static_cast<std::size_t>(b) + 1] = base_[static_cast<std::size_t>(b)] + plan.query_tiles(p.sequence(b).q_len);
    const auto tiles = static_cast<std::size_t>(base_.back());
    turns_ = std::make_unique<std::atomic<index_t>[]>(tiles * static_cast<std::size_t>(heads_));
    std::vector<index_t> first(tiles, -1);  // each query tile's first key tile
    for (index_t b = 0; b < batch; ++b) {
      const SequenceRange seq = p.sequence(b);
      const ops::KeyWindow window = ops::KeyWindow::of(p, seq);
      for (index_t j = plan.key_tiles(seq.k_len) - 1; j >= 0; --j) {  // descending: the first wins
        const index_t col0 = j * plan.key_tile_rows;
        const auto [lo, hi] = rows_visiting(window, seq.q_len, col0, std::min(plan.key_tile_rows, seq.k_len - col0), br_);
        for (index_t t = lo / br_; t * br_ < hi; ++t) first[static_cast<std::size_t>(base_[static_cast<std::size_t>(b)] + t)] = j;
      }
    }
    for (std::size_t t = 0; t < tiles; ++t)
      for (std::size_t h = 0; h < static_cast<std::size_t>(heads_); ++h) turns_[t * static_cast<std::size_t>(heads_) + h].store(first[t], std::memory_order_relaxed);
  }

  /// Blocks until key tile j may add to query tile `tile` of (sequence b, head).
  void wait(index_t b, index_t tile, index_t head, index_t j) const {
    const std::atomic<index_t>& turn = at(b, tile, head);
    for (int spins = 0; turn.load(std::memory_order_acquire) != j; ++spins) {
      if (aborted_.load(std::memory_order_relaxed)) throw invalid_argument("backward", "aborted: another work item failed");
      if (spins < 64) pause();
      else std::this_thread::yield();
    }
  }
  /// Hands query tile `tile` of (b, head) on to key tile j + 1.
  void pass(index_t b, index_t tile, index_t head, index_t j) { at(b, tile, head).store(j + 1, std::memory_order_release); }
  /// Releases every waiter (with an exception) after an item failed.
  void abort() { aborted_.store(true, std::memory_order_relaxed); }

 private:
  std::atomic<index_t>& at(index_t b, index_t tile, index_t head) const {
    return turns_[static_cast<std::size_t>((base_[static_cast<std::size_t>(b)] + tile) * heads_ + head)];
  }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  index_t heads_, br_;
  std::vector<index_t> base_;  // first tile of each sequence
  std::unique_ptr<std::atomic<index_t>[]> turns_;
  std::atomic<bool> aborted_{false};
};

}  // namespace tileattn::kernels
