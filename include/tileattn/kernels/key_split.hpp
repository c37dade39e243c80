// tileattn/kernels/key_split.hpp: split-KV (flash-decoding): which sequences of a batch have
// their keys cut into chunks, and where (KeySplit, choose_split). Each chunk's work items
// write partial states that a merge pass combines exactly (kernels/work_list.hpp's Merge,
// kernels/merge.hpp), so a long decode occupies many workers. The chunking depends on the
// batch's shape and the options alone (PagedOptions::num_splits, batch_invariant), never on
// the thread count, so every thread count gives the same bits.
#pragma once

#include <algorithm>

#include "tileattn/core/params.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::kernels {

/// Which sequences split their keys, and where: sequences whose query rows (positions x
/// query heads of a group) are at most max_query_rows, in chunks of keys_per_split keys (a
/// multiple of the key tile). keys_per_split == 0: no split.
struct KeySplit {
  index_t keys_per_split = 0;
  index_t max_query_rows = 0;
  /// Every sequence writes partial states, one chunk at least, whose merges run elsewhere
  /// (a shared prefix's pass: kernels/shared_prefix.hpp; merges() says where they are).
  bool partial_states = false;

  bool splits(index_t q_len, index_t group, index_t k_len) const {
    return keys_per_split > 0 && q_len * group <= max_query_rows && k_len > keys_per_split;
  }
};

/// Split-KV's automatic choice: chunks of at least min_split_keys keys, sized so that the
/// batch has about split_target_items (sequence, K/V head, chunk) items: enough for 16
/// workers with 4 items each.
inline constexpr index_t split_target_items = 64;
inline constexpr index_t min_split_keys = 512;
inline constexpr index_t split_max_query_rows = 256;
/// Batch-invariant mode (ForwardOptions::batch_invariant): split-KV's chunk, fixed. A
/// sequence of at most split_max_query_rows query rows and more keys is cut at multiples of
/// it, whatever the rest of the batch: 2048 keys keep a 32k-token decode at 16 chunks per
/// K/V head, enough to occupy 16 workers on one sequence with 8 K/V heads.
inline constexpr index_t invariant_split_keys = 2048;

/// The key chunking for a batch whose longest sequence has `longest` keys, in key tiles of
/// key_tile keys (independent of the thread count; see PagedOptions). kv_heads_per_item:
/// K/V heads one work item takes (kernels::in_place_heads_per_item).
template <class T, class KV>
KeySplit choose_split(const ForwardParams<T, KV>& p, index_t key_tile, index_t longest, const PagedOptions& options,
                      index_t kv_heads_per_item) {
  const index_t num_splits = options.num_splits;
  const auto round_to_tiles = [&](index_t keys) { return tileattn::detail::ceil_div(keys, key_tile) * key_tile; };
  KeySplit split{0, split_max_query_rows};
  if (num_splits == 1 || longest == 0) return split;
  if (options.batch_invariant) {  // fixed chunks: a sequence splits (or not) by its own length
    split.keys_per_split = round_to_tiles(invariant_split_keys);
    return split;
  }
  if (num_splits > 1) {
    split.keys_per_split = round_to_tiles(tileattn::detail::ceil_div(longest, num_splits));  // num_splits may be INT64_MAX
  } else {
    index_t keys = 0;
    for (index_t b = 0; b < p.batch(); ++b) keys += p.sequence(b).k_len * (p.heads_kv() / kv_heads_per_item);
    split.keys_per_split =
        std::max(round_to_tiles(min_split_keys), round_to_tiles(tileattn::detail::ceil_div(keys, split_target_items)));
  }
  if (split.keys_per_split >= longest) split.keys_per_split = 0;
  return split;
}

}  // namespace tileattn::kernels
