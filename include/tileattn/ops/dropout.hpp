// tileattn/ops/dropout.hpp: attention dropout on tiles of probabilities (DropoutOptions,
// core/params.hpp). A work item resolves its sequence's stream once (Dropout), then each
// softmax step drops the entries of its P tile (float rows or bf16 pairs) that the Philox
// stream of arch/philox.hpp drops: row (head, query position), column key position. The
// forward applies the kept probabilities as they are and folds 1 / (1 - p') into O's final
// normalization (p' the probability dropped: p in steps of 1/256); the backward drops dP
// (times 1 / (1 - p')) and the P that dV sums. A dropped entry is multiplied by 0, not set
// to 0 (arch/philox.hpp's apply_keep_bits), so a NaN there stays NaN, as in PyTorch's P * mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::ops {

/// The byte threshold of a drop probability: a key is dropped iff its byte u < min(round(256 p),
/// 255) (arch/philox.hpp): the probability dropped is that over 256.
inline std::uint32_t dropout_threshold(float p) {
  return static_cast<std::uint32_t>(std::min(std::lround(static_cast<double>(p) * 256.0), 255L));
}

/// One sequence's dropout: its rows' streams and the scale of what is kept.
class Dropout {
 public:
  /// No dropout.
  Dropout() = default;
  /// Sequence `sequence` (batch index, or a packed batch's sequence) of a call with `heads`
  /// query heads.
  Dropout(const DropoutOptions& options, index_t sequence, index_t heads)
      : enabled_(options.enabled()),
        scale_(static_cast<float>(256.0 / (256.0 - dropout_threshold(options.p)))),
        seed_(options.seed),
        offset_(static_cast<std::uint32_t>(options.offset)),
        threshold_(dropout_threshold(options.p)),
        stream0_(static_cast<std::uint32_t>(sequence * heads)) {}

  bool enabled() const { return enabled_; }
  /// 1 / (1 - p'), the scale of the kept probabilities, p' = threshold / 256 the probability
  /// dropped (1 without dropout).
  float kept_scale() const { return scale_; }

  /// The stream of query `position` of query head `head`.
  arch::DropoutRow row(index_t head, index_t position) const {
    return {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32),
            static_cast<std::uint32_t>(position), stream0_ + static_cast<std::uint32_t>(head), offset_, threshold_};
  }

  /// A slab's view: the packed rows [r0, ...) of `rows`, from key col0 on.
  struct Slab {
    const Dropout& dropout;
    const PackedRows& rows;
    index_t r0, col0;
    /// Drops the entries of t, whose row i is the slab's row first + i (apply, below).
    template <class E>
    void operator()(Tile<E>& t, index_t keys, float scale = 1.0f, index_t first = 0) const {
      dropout.apply(t, rows, r0 + first, col0, keys, scale);
    }
  };
  Slab slab(const PackedRows& rows, index_t r0, index_t col0) const { return {*this, rows, r0, col0}; }

  /// Drops the entries of t's rows: t's row i is packed row r0 + i of `rows`, its first
  /// `keys` entries keys [col0, col0 + keys) (t float, or bf16 pairs: two keys a pair). Kept
  /// float entries are multiplied by `scale` (1: left as they are); kept pairs stay.
  template <class E>
  void apply(Tile<E>& t, const PackedRows& rows, index_t r0, index_t col0, index_t keys, float scale = 1.0f) const {
    if (!enabled_ || keys == 0) return;
    constexpr index_t ld = arch::dropout_block_words * (chunk_keys / arch::dropout_block_keys + 1) + 1;  // + 1: read past
    std::uint64_t bits[chunk_rows * ld];
    arch::DropoutRow streams[chunk_rows];
    for (index_t i0 = 0; i0 < t.rows(); i0 += chunk_rows) {
      const index_t n_rows = std::min(chunk_rows, t.rows() - i0);
      for (index_t i = 0; i < n_rows; ++i) streams[i] = row(rows.head(r0 + i0 + i), rows.position(r0 + i0 + i));
      for (index_t k0 = 0; k0 < keys; k0 += chunk_keys) {
        const index_t n = std::min(chunk_keys, keys - k0), first = col0 + k0;
        const index_t block = first / arch::dropout_block_keys;
        const index_t blocks = (first + n - 1) / arch::dropout_block_keys - block + 1;
        for (index_t i = 0; i < n_rows; ++i) bits[i * ld + arch::dropout_block_words * blocks] = 0;
        arch::native::dropout_keep_bits(streams, n_rows, block, blocks, bits, ld);
        const index_t bit0 = first - block * arch::dropout_block_keys;
        for (index_t i = 0; i < n_rows; ++i) {
          if constexpr (std::is_same_v<E, float>)
            arch::native::apply_keep_bits(t.row(i0 + i) + k0, n, bits + i * ld, bit0, scale);
          else
            arch::native::apply_keep_bits(t.row(i0 + i) + k0 / 2, n, bits + i * ld, bit0);
        }
      }
    }
  }

 private:
  static constexpr index_t chunk_keys = 1024;  // keys a row's bits are made for at a time (even: whole pairs)
  static constexpr index_t chunk_rows = 8;     // rows whose bits are made in one call

  bool enabled_ = false;
  float scale_ = 1.0f;
  std::uint64_t seed_ = 0;
  std::uint32_t offset_ = 0, threshold_ = 0, stream0_ = 0;
};

}  // namespace tileattn::ops
