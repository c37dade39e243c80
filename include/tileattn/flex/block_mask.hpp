// tileattn/flex/block_mask.hpp: the block mask of flexible attention (FlexAttention's
// BlockMask and create_block_mask): for each (sequence, query head, query block, key block),
// whether the block is empty (the kernels never load its keys), full (no mask evaluated)
// or partial (the mask_mod evaluated per score).
//
//   auto mask = tileattn::flex::causal{};
//   auto blocks = tileattn::create_block_mask(mask, 1, 1, seqlen_q, seqlen_k);  // B, H: 1 broadcasts
//   tileattn::forward_flex(q, k, v, o, lse, tileattn::flex::no_score_mod{}, blocks);
//
// Built once by evaluating the mask_mod on every (query, key) position (in parallel), and
// reusable across layers and calls of the same shape. Its block sizes are independent of
// the kernels' tile plan: a kernel tile skips when every block it overlaps is empty, skips
// mask evaluation in blocks that are full, and evaluates the mask in partial ones, so the
// result is the same bits for every plan (docs/flex.md). Blocks the size of the key tiles
// (64 to 128 keys) or larger skip best.
//
// The block mask decides which scores are hidden: empty blocks hide every score, full ones
// none, whatever the mask_mod would say there; a block mask built from the mask_mod it holds
// agrees with it everywhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/flex/mods.hpp"

namespace tileattn {

/// What a block holds: no visible score, some, or only visible scores.
enum class BlockKind : std::uint8_t { empty = 0, partial = 1, full = 2 };

/// A block's extent in query positions and keys.
struct BlockSize {
  index_t q = 128;
  index_t kv = 128;
};

/// The kinds of a block mask's blocks, as kernels read them: [batch or 1, heads or 1,
/// q_blocks, kv_blocks], contiguous (extent 1 broadcasts).
struct BlockKinds {
  const BlockKind* data = nullptr;
  index_t batch = 0, heads = 0, seqlen_q = 0, seqlen_k = 0;
  BlockSize block{};
  index_t q_blocks = 0, kv_blocks = 0;

  BlockKind operator()(index_t b, index_t h, index_t qb, index_t kb) const {
    const index_t bi = batch == 1 ? 0 : b, hi = heads == 1 ? 0 : h;
    return data[static_cast<std::size_t>(((bi * heads + hi) * q_blocks + qb) * kv_blocks + kb)];
  }
};

namespace detail {
/// Checks a block mask's extents and sizes its blocks: batch and heads >= 1, seqlens >= 0,
/// block sizes >= 1, and at most max_allocation_bytes stored blocks (one byte each: batch x
/// heads x q_blocks x kv_blocks), named after the extent whose factor passes the bound.
inline BlockKinds block_kinds(index_t batch, index_t heads, index_t seqlen_q, index_t seqlen_k, BlockSize block) {
  TILEATTN_REQUIRE(batch >= 1, "batch", "must be >= 1 (1: one mask for every sequence), got " + std::to_string(batch));
  TILEATTN_REQUIRE(heads >= 1, "heads", "must be >= 1 (1: one mask for every head), got " + std::to_string(heads));
  TILEATTN_REQUIRE(seqlen_q >= 0, "seqlen_q", "must be >= 0, got " + std::to_string(seqlen_q));
  TILEATTN_REQUIRE(seqlen_k >= 0, "seqlen_k", "must be >= 0, got " + std::to_string(seqlen_k));
  TILEATTN_REQUIRE(block.q >= 1 && block.kv >= 1, "block",
                   "sizes must be >= 1, got " + std::to_string(block.q) + " x " + std::to_string(block.kv));
  const BlockKinds k{nullptr, batch, heads, seqlen_q, seqlen_k, block, ceil_div(seqlen_q, block.q),
                     ceil_div(seqlen_k, block.kv)};
  index_t blocks = 1;
  for (const auto& [factor, name] : {std::pair{batch, "batch"}, std::pair{heads, "heads"},
                                     std::pair{k.q_blocks, "seqlen_q"}, std::pair{k.kv_blocks, "seqlen_k"}})
    TILEATTN_REQUIRE(!__builtin_mul_overflow(blocks, factor, &blocks) && blocks <= max_allocation_bytes, name,
                     "batch x heads x query blocks x key blocks = " + std::to_string(batch) + " x " +
                         std::to_string(heads) + " x " + std::to_string(k.q_blocks) + " x " + std::to_string(k.kv_blocks) +
                         " blocks: more than a block mask may store (max_allocation_bytes = 2^47)");
  return k;
}
}  // namespace detail

/// A mask_mod and the kinds of its blocks over [batch, heads, seqlen_q, seqlen_k] positions.
template <class MaskMod>
class BlockMask {
 public:
  /// Every block empty; checked as create_block_mask's arguments (detail::block_kinds).
  BlockMask(MaskMod mask_mod, index_t batch, index_t heads, index_t seqlen_q, index_t seqlen_k, BlockSize block)
      : mask_mod_(std::move(mask_mod)), kinds_(detail::block_kinds(batch, heads, seqlen_q, seqlen_k, block)) {
    store_.resize(static_cast<std::size_t>(batch * heads * kinds_.q_blocks * kinds_.kv_blocks), BlockKind::empty);
    kinds_.data = store_.data();
  }
  BlockMask(const BlockMask& other) : mask_mod_(other.mask_mod_), kinds_(other.kinds_), store_(other.store_) {
    kinds_.data = store_.data();
  }
  BlockMask& operator=(const BlockMask& other) {
    if (this != &other) *this = BlockMask(other);
    return *this;
  }
  BlockMask(BlockMask&&) noexcept = default;  // a moved vector keeps its buffer: data stays valid
  BlockMask& operator=(BlockMask&&) noexcept = default;

  const MaskMod& mask_mod() const { return mask_mod_; }
  const BlockKinds& kinds() const { return kinds_; }
  BlockKind kind(index_t b, index_t h, index_t qb, index_t kb) const { return kinds_(b, h, qb, kb); }
  index_t batch() const { return kinds_.batch; }
  index_t heads() const { return kinds_.heads; }
  index_t seqlen_q() const { return kinds_.seqlen_q; }
  index_t seqlen_k() const { return kinds_.seqlen_k; }
  BlockSize block_size() const { return kinds_.block; }
  index_t q_blocks() const { return kinds_.q_blocks; }
  index_t kv_blocks() const { return kinds_.kv_blocks; }

  /// How many blocks have kind k.
  index_t count(BlockKind k) const { return static_cast<index_t>(std::count(store_.begin(), store_.end(), k)); }
  /// The fraction of blocks that are not empty (what the kernels visit).
  double density() const {
    return store_.empty() ? 0.0 : 1.0 - static_cast<double>(count(BlockKind::empty)) / static_cast<double>(store_.size());
  }

  /// Sets one block's kind (create_block_mask does; so may code that knows its layout).
  void set_kind(index_t b, index_t h, index_t qb, index_t kb, BlockKind k) {
    store_[static_cast<std::size_t>(((b * kinds_.heads + h) * kinds_.q_blocks + qb) * kinds_.kv_blocks + kb)] = k;
  }

 private:
  MaskMod mask_mod_;
  BlockKinds kinds_;
  std::vector<BlockKind> store_;
};

/// The kind of one block of `mask_mod` for sequence b, head h: evaluates its positions until
/// it has seen both a visible and a hidden one.
template <class MaskMod>
BlockKind classify_block(const MaskMod& mask_mod, index_t b, index_t h, index_t q0, index_t q1, index_t k0,
                         index_t k1) {
  bool seen = false, hidden = false;
  for (index_t i = q0; i < q1; ++i)
    for (index_t j = k0; j < k1; ++j) {
      if (mask_mod(b, h, i, j)) seen = true;
      else hidden = true;
      if (seen && hidden) return BlockKind::partial;
    }
  return seen ? BlockKind::full : BlockKind::empty;
}

/// The block mask of `mask_mod` over batch x heads sequences of seqlen_q queries and
/// seqlen_k keys (varlen: the longest ones). batch or heads 1: one mask shared by every
/// sequence or head (the mask_mod is evaluated with b = 0 or h = 0 and must not depend on
/// it). Costs batch x heads x seqlen_q x seqlen_k mask evaluations, run under `exec`.
template <mask_mod_function MaskMod>
BlockMask<MaskMod> create_block_mask(MaskMod mask_mod, index_t batch, index_t heads, index_t seqlen_q,
                                     index_t seqlen_k, BlockSize block = {}, const Execution& exec = {}) {
  detail::validate_execution(exec);
  BlockMask<MaskMod> mask(std::move(mask_mod), batch, heads, seqlen_q, seqlen_k, block);  // checks the rest
  // No key blocks (seqlen_k 0): nothing to classify, though batch x heads x q_blocks may be 2^47.
  const index_t rows = mask.kv_blocks() == 0 ? 0 : batch * heads * mask.q_blocks();
  parallel_for(exec, rows, [&](index_t row, int) {
    const index_t qb = row % mask.q_blocks(), bh = row / mask.q_blocks(), b = bh / heads, h = bh % heads;
    const index_t q0 = qb * block.q, q1 = q0 + std::min(block.q, seqlen_q - q0);  // q0 + block.q may overflow
    for (index_t kb = 0; kb < mask.kv_blocks(); ++kb) {
      const index_t k0 = kb * block.kv, k1 = k0 + std::min(block.kv, seqlen_k - k0);
      mask.set_kind(b, h, qb, kb, classify_block(mask.mask_mod(), b, h, q0, q1, k0, k1));
    }
  });
  return mask;
}

}  // namespace tileattn
