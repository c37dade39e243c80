// benchmarks/flex_block_mask_pictures.cpp: pictures of the block masks of flexible attention
// (flex/block_mask.hpp) for docs/flex.md: for each library mask_mod on N = 1024 positions in
// 64 x 64 blocks, one character per block (rows: query blocks from the top, columns: key
// blocks from the left), with its density and counts. Needs only tileattn.
//
//   '#' full     every score of the block is visible: no mask evaluated
//   '+' partial  some are: the mask_mod is evaluated per score
//   '.' empty    none is: the kernels never load the block's keys
//
//   flex_block_mask_pictures > docs/figures/flex_block_masks.txt
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tileattn/flex.hpp"

namespace {

using tileattn::BlockKind;
using tileattn::index_t;
namespace flex = tileattn::flex;

constexpr index_t n = 1024, block = 64, blocks = n / block;

template <class Mask>
void picture(const char* title, const char* call, const Mask& mask) {
  const auto m = tileattn::create_block_mask(mask, 1, 1, n, n, {block, block});
  std::printf("%s\n  %s\n", title, call);
  std::printf("  density %.3f: %ld full, %ld partial, %ld empty of %ld blocks\n\n", m.density(),
              static_cast<long>(m.count(BlockKind::full)), static_cast<long>(m.count(BlockKind::partial)),
              static_cast<long>(m.count(BlockKind::empty)), static_cast<long>(m.q_blocks() * m.kv_blocks()));
  for (index_t qb = 0; qb < m.q_blocks(); ++qb) {
    std::string row = "    ";
    for (index_t kb = 0; kb < m.kv_blocks(); ++kb) {
      const BlockKind k = m.kind(0, 0, qb, kb);
      row += k == BlockKind::full ? '#' : k == BlockKind::partial ? '+' : '.';
    }
    std::printf("%s\n", row.c_str());
  }
  std::printf("\n");
}

/// Attention-sink tokens (StreamingLLM): the first `count` keys, for the combination below.
struct sink_tokens {
  index_t count = 0;
  bool operator()(index_t, index_t, index_t, index_t kv) const { return kv < count; }
};

/// A speculative verify step (flex/tree_mask.hpp): 16 draft tokens in a tree, appended to a
/// cache of 1008 accepted positions. Its blocks, then each draft's row over the drafts.
void draft_tree_picture() {
  //            accepted ... 1007
  //           /        |        \    roots: parent -1
  //          0         1         2        three candidates for the next token,
  //        / | \      / \        |        then their continuations
  //       3  4  5    6   7       8
  //      /|  |       |          / \    16 drafts in all
  //     9 10 11     12        13  14
  //     |
  //    15
  const std::int32_t parents[] = {-1, -1, -1, 0, 0, 0, 1, 1, 2, 3, 3, 4, 6, 8, 8, 9};
  constexpr index_t tokens = 16;
  const std::int32_t seqlens[] = {static_cast<std::int32_t>(n)};
  const auto m = tileattn::draft_tree_mask(parents, tokens, seqlens, {16, block});
  std::printf("draft tree of a speculative verify step: 16 draft tokens after 1008 accepted positions\n"
              "  tileattn::draft_tree_mask(parents, 16, cache_seqlens, {16, 64}), parents =\n"
              "  {-1, -1, -1, 0, 0, 0, 1, 1, 2, 3, 3, 4, 6, 8, 8, 9} (-1: extends the last accepted token)\n");
  std::printf("  one query block (16 drafts) x %ld key blocks: %ld full, %ld partial, %ld empty\n\n    ",
              static_cast<long>(m.kv_blocks()), static_cast<long>(m.count(BlockKind::full)),
              static_cast<long>(m.count(BlockKind::partial)), static_cast<long>(m.count(BlockKind::empty)));
  for (index_t kb = 0; kb < m.kv_blocks(); ++kb) {
    const BlockKind k = m.kind(0, 0, 0, kb);
    std::printf("%c", k == BlockKind::full ? '#' : k == BlockKind::partial ? '+' : '.');
  }
  std::printf("\n\n  the partial block's last 16 keys (the drafts), one row per draft: 'x' visible\n"
              "  (itself and its ancestors); every accepted key is visible to every draft\n\n");
  for (index_t t = 0; t < tokens; ++t) {
    std::string row = "    " + std::string(t < 10 ? " " : "") + std::to_string(t) + "  ";
    for (index_t u = 0; u < tokens; ++u) row += m.mask_mod()(0, 0, t, n - tokens + u) ? 'x' : '.';
    std::printf("%s\n", row.c_str());
  }
  std::printf("\n");
}

}  // namespace

int main() {
  std::printf("Block masks of flexible attention (tileattn::create_block_mask), N = %ld queries x %ld keys\n"
              "in %ld x %ld blocks: one character per block, query blocks top to bottom, key blocks left\n"
              "to right. '#' full (no mask evaluated), '+' partial (mask_mod per score), '.' empty\n"
              "(never loaded). density: the fraction of blocks that are not empty.\n"
              "Printed by benchmarks/flex_block_mask_pictures.cpp.\n\n",
              static_cast<long>(n), static_cast<long>(n), static_cast<long>(block), static_cast<long>(block));

  picture("causal", "flex::causal{}", flex::causal{});
  picture("sliding window, 256 keys back (causal)", "flex::sliding_window{.left = 256, .right = 0}",
          flex::sliding_window{.left = 256, .right = 0});

  // 4 documents of unequal lengths packed back to back: boundaries inside blocks are partial.
  std::vector<std::int32_t> doc_ids(static_cast<std::size_t>(n));
  const index_t ends[] = {300, 500, 900, n};
  for (index_t i = 0, d = 0; i < n; ++i) {
    while (i >= ends[d]) ++d;
    doc_ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(d);
  }
  picture("document mask, 4 documents of 300, 200, 400 and 124 tokens", "flex::document{doc_ids}",
          flex::document{doc_ids});

  picture("prefix-LM, prefix of 300 tokens", "flex::prefix_lm{300}", flex::prefix_lm{300});
  picture("global tokens with a sliding window (Longformer): 64 globals, window 128 each side",
          "flex::global_window{.globals = 64, .window = 128}", flex::global_window{.globals = 64, .window = 128});
  picture("dilated causal window: distances 0, 4, 8, ..., 256", "flex::dilated_window{.window = 64, .dilation = 4}",
          flex::dilated_window{.window = 64, .dilation = 4});

  // A random layout of 64 x 64 blocks: every diagonal block, then 20% of the others (fixed seed).
  std::vector<std::uint8_t> layout(static_cast<std::size_t>(blocks * blocks), 0);
  std::mt19937 rng(2026);
  std::bernoulli_distribution pick(0.2);
  for (index_t qb = 0; qb < blocks; ++qb)
    for (index_t kb = 0; kb < blocks; ++kb)
      layout[static_cast<std::size_t>(qb * blocks + kb)] = qb == kb || pick(rng);
  picture("block-sparse, random layout of 64 x 64 blocks (diagonal + 20% of the rest, seed 2026)",
          "flex::block_sparse{layout, /*kv_blocks*/ 16, /*block*/ 64}", flex::block_sparse{layout, blocks, block});

  picture("and_masks: causal within each document (the 4 documents above)",
          "flex::and_masks{flex::causal{}, flex::document{doc_ids}}",
          flex::and_masks{flex::causal{}, flex::document{doc_ids}});
  picture("or_masks inside and_masks: causal, and either a 128-key window or the first 16 keys (attention sinks)",
          "flex::and_masks{flex::causal{}, flex::or_masks{flex::sliding_window{.left = 128}, sink_tokens{16}}}",
          flex::and_masks{flex::causal{}, flex::or_masks{flex::sliding_window{.left = 128}, sink_tokens{16}}});
  draft_tree_picture();
  return 0;
}
