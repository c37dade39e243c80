// tileattn/flex/tree_mask.hpp: the mask of a speculative-decoding verify step over a tree of
// draft tokens (EAGLE, Medusa, multi-token prediction), for forward_paged_flex.
//
// A verify step appends the draft tokens to each sequence's cache (KvCache::append or
// write_kv_slots) and attends their queries to the whole cache: draft token t sees every
// position before the drafts (the prompt and the accepted tokens) and, among the drafts,
// itself and its ancestors in the tree. The tree is a parent array in topological order:
// parents[t] is the draft token t extends, or -1 for a token that extends the last accepted
// one (a root; several roots make a forest).
//
//   //            0          draft tokens 0..4: 0 and 1 extend the last accepted token,
//   //          /   \        2 and 3 extend 0, 4 extends 3
//   //         2     3   1
//   //               |
//   //               4
//   const std::int32_t parents[] = {-1, -1, 0, 0, 3};
//   auto tree = tileattn::draft_tree_mask(parents, 5, cache_seqlens);   // cache_seqlens count the drafts
//   tileattn::forward_paged_flex(q, k_pool, v_pool, table, cache_seqlens, o, lse,
//                                tileattn::flex::no_score_mod{}, tree);
//
// The block mask is built from the tree directly, not by evaluating the mask on every
// position: key blocks that hold only accepted positions are full (no mask evaluated, never
// a per-score test), the blocks that reach into the drafts are classified by the mask, so
// building it costs O(blocks + drafts x block keys) and a verify step costs the plain
// attention over the cache plus the draft block (docs/flex.md has the picture).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tileattn/core/error.hpp"
#include "tileattn/flex/block_mask.hpp"

namespace tileattn {

namespace flex {

/// The mask_mod of a verify step over draft trees: for sequence b with prefix(b) positions
/// before its drafts, query t sees key j iff j < prefix(b), or j - prefix(b) is t or one of
/// t's ancestors. One tree for every sequence, or one per sequence.
class draft_tree {
 public:
  draft_tree() = default;
  /// parents: `tokens` entries (one tree) or batch x tokens (one per sequence), each in
  /// [-1, t - 1]; prefixes: each sequence's positions before its drafts. Unchecked here
  /// (draft_tree_mask checks them).
  draft_tree(std::span<const std::int32_t> parents, index_t tokens, std::vector<index_t> prefixes)
      : tokens_(tokens), words_((tokens + 63) / 64), prefixes_(std::move(prefixes)) {
    const index_t trees = tokens > 0 ? static_cast<index_t>(parents.size()) / tokens : 0;
    ancestors_.assign(static_cast<std::size_t>(trees * tokens * words_), 0);
    for (index_t tree = 0; tree < trees; ++tree)
      for (index_t t = 0; t < tokens; ++t) {
        std::uint64_t* row = word_row(tree, t);
        const std::int32_t parent = parents[static_cast<std::size_t>(tree * tokens + t)];
        if (parent >= 0) std::copy_n(word_row(tree, parent), words_, row);  // a parent's ancestors
        row[t / 64] |= std::uint64_t{1} << (t % 64);
      }
    per_sequence_ = trees > 1;
  }

  bool operator()(index_t b, index_t, index_t q_idx, index_t kv_idx) const {
    const index_t prefix = prefixes_[static_cast<std::size_t>(b)];
    if (kv_idx < prefix) return true;
    const index_t u = kv_idx - prefix;
    if (u >= tokens_ || q_idx >= tokens_) return false;
    return (word_row(per_sequence_ ? b : 0, q_idx)[u / 64] >> (u % 64)) & 1u;
  }

  index_t tokens() const { return tokens_; }

  /// The call it masks must be the one it was made for (FlexScores::check runs this before
  /// anything is written): one sequence per tree prefix, and sequence b's keys prefix(b) +
  /// tokens, the cache_seqlens draft_tree_mask was given. A tree made for other cache_seqlens
  /// would place the drafts at the wrong positions (wrong attention, silently), and a batch
  /// of more sequences would read past its prefixes; both throw, naming block_mask.
  template <class P>
  void check_call(const P& p) const {
    TILEATTN_REQUIRE(static_cast<index_t>(prefixes_.size()) == p.batch(), "block_mask",
                     "is a draft tree made for " + std::to_string(prefixes_.size()) + " sequences, the call has " +
                         std::to_string(p.batch()));
    for (index_t b = 0; b < p.batch(); ++b) {
      const index_t keys = p.sequence(b).k_len, want = prefix(b) + tokens_;
      if (keys != want)  // the message is built only on failure
        throw invalid_argument("block_mask", "is a draft tree made for cache_seqlens[" + std::to_string(b) +
                                                 "] = " + std::to_string(want) + ", the call's sequence " +
                                                 std::to_string(b) + " has " + std::to_string(keys) + " keys");
    }
  }
  /// Sequence b's positions before its draft tokens.
  index_t prefix(index_t b) const { return prefixes_[static_cast<std::size_t>(b)]; }

 private:
  const std::uint64_t* word_row(index_t tree, index_t t) const {
    return ancestors_.data() + static_cast<std::size_t>((tree * tokens_ + t) * words_);
  }
  std::uint64_t* word_row(index_t tree, index_t t) {
    return ancestors_.data() + static_cast<std::size_t>((tree * tokens_ + t) * words_);
  }

  index_t tokens_ = 0, words_ = 0;
  bool per_sequence_ = false;
  std::vector<index_t> prefixes_;
  std::vector<std::uint64_t> ancestors_;  // [trees, tokens, words]: bit u of row t: u is t or an ancestor
};

}  // namespace flex

/// The block mask of a verify step over draft trees (flex::draft_tree), [batch, 1, tokens,
/// max(cache_seqlens)], for forward_paged_flex with seqlen_q = tokens: cache_seqlens[b] counts
/// sequence b's keys with its `tokens` drafts (the last ones). parents: one tree (`tokens`
/// entries) or one per sequence (batch x tokens), each parents[t] in [-1, t - 1]. Checks
/// every argument (tileattn::invalid_argument naming it).
inline BlockMask<flex::draft_tree> draft_tree_mask(std::span<const std::int32_t> parents, index_t tokens,
                                                   std::span<const std::int32_t> cache_seqlens,
                                                   BlockSize block = {}) {
  const auto batch = static_cast<index_t>(cache_seqlens.size());
  TILEATTN_REQUIRE(tokens >= 1, "tokens", "must be >= 1, got " + std::to_string(tokens));
  TILEATTN_REQUIRE(batch >= 1, "cache_seqlens", "is empty (one entry per sequence)");
  const auto entries = static_cast<index_t>(parents.size());
  TILEATTN_REQUIRE(entries == tokens || entries == batch * tokens, "parents",
                   "needs tokens = " + std::to_string(tokens) + " entries (one tree) or batch x tokens = " +
                       std::to_string(batch * tokens) + " (one per sequence), got " + std::to_string(entries));
  for (index_t e = 0; e < entries; ++e) {
    const index_t t = e % tokens, parent = parents[static_cast<std::size_t>(e)];
    TILEATTN_REQUIRE(parent >= -1 && parent < t, "parents",
                     "entry " + std::to_string(e) + " (token " + std::to_string(t) + ") is " + std::to_string(parent) +
                         ": a parent must be -1 (a root) or an earlier token (topological order)");
  }
  std::vector<index_t> prefixes;
  index_t longest = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t len = cache_seqlens[static_cast<std::size_t>(b)];
    TILEATTN_REQUIRE(len >= tokens, "cache_seqlens",
                     "entry " + std::to_string(b) + " is " + std::to_string(len) + ": fewer keys than the " +
                         std::to_string(tokens) + " draft tokens it must hold");
    prefixes.push_back(len - tokens);
    longest = std::max(longest, len);
  }
  BlockMask<flex::draft_tree> mask(flex::draft_tree(parents, tokens, prefixes), batch, 1, tokens, longest, block);
  for (index_t b = 0; b < batch; ++b)
    for (index_t qb = 0; qb < mask.q_blocks(); ++qb) {
      const index_t q0 = qb * block.q, q1 = q0 + std::min(block.q, tokens - q0);
      for (index_t kb = 0; kb < mask.kv_blocks(); ++kb) {
        const index_t k0 = kb * block.kv, k1 = k0 + std::min(block.kv, longest - k0);
        const index_t prefix = prefixes[static_cast<std::size_t>(b)];
        const BlockKind kind = k1 <= prefix ? BlockKind::full
                               : k0 >= prefix + tokens ? BlockKind::empty  // past the sequence
                                                       : classify_block(mask.mask_mod(), b, 0, q0, q1, k0, k1);
        mask.set_kind(b, 0, qb, kb, kind);
      }
    }
  return mask;
}

}  // namespace tileattn
