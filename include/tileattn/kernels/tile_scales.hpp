// tileattn/kernels/tile_scales.hpp: the quantization model of the forward's key tiles: the
// scales a loader yields with a tile's K and V, and the stages of the loop that apply them.
//
// A quantized cache stores codes and scales; where a scale enters follows from what it
// scales:
//   - One scale per key (8-bit K and V: a page's scale for a head, core/scale_source.hpp).
//     It factors out of the key's dot products, so the products run on the codes (exact in
//     float) and the loop applies the scales to their results: K's to the key's column of
//     S = Q K^T (TileScalesRef::scale_scores, right after the product), V's to the key's
//     column of P before P meets V (scale_probabilities, after the softmax step; the visible-
//     values path for a V with Inf or NaN takes them with the row).
//   - One scale per block of values along a row (4-bit: q4_0 and MXFP4 per 32 values, NVFP4
//     per 16). A block scale does not factor out of a dot product over the whole row, so the
//     loaders yield the values, code x scale, exact in float, dequantized as they load
//     (arch::native::dequantize_blocks, memory/block_tile_io.hpp; InPlaceTiles::staged). Their
//     TileScalesRef is empty, and so is that of 16- and 32-bit K and V.
// A Hadamard-rotated 4-bit pool (ops/hadamard.hpp) is a 4-bit pool whose scales are its
// blocks'; the rotation is applied to Q and O, not to the scales.
// The next issue's integer and code products multiply codes where scales of both kinds then
// reach the products' partial sums; this is where their stages go.
#pragma once

#include <cassert>
#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/limits.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/kernels/work_list.hpp"
#include "tileattn/memory/tile_io.hpp"
#include "tileattn/ops/online_softmax.hpp"

namespace tileattn::kernels {

/// The largest key tile a plan makes (Bc <= max(head_dim, 64)): the bound of a tile's
/// scale vectors.
inline constexpr index_t max_key_tile_rows = std::max<index_t>(max_head_dim, 64);

/// A key tile's per-key dequantization scales of K and V (8-bit; nullptr: none), and the
/// stages that apply them.
struct TileScalesRef {
  const float* k = nullptr;
  const float* v = nullptr;

  /// S's column j times K's scale of key j: S = Q (scale K_codes)^T.
  void scale_scores(Tile<float>& s) const {
    if (k) ops::scale_columns(s, k);
  }
  /// Whether P meets V's codes through per-key scales (scale_probabilities).
  bool scales_values() const { return v != nullptr; }
  /// P's column j times V's scale of key j, before P V: P (scale V_codes) = (P scale) V_codes.
  void scale_probabilities(Tile<float>& p) const {
    if (v) ops::scale_columns(p, v);
  }
  /// True when V's scales of the tile's `keys` keys are finite (a NaN scale is a NaN value).
  bool values_finite(index_t keys) const { return !v || arch::native::all_finite(v, keys); }
};

/// The scales of one work item's key tiles, loaded tile by tile (8-bit K/V with scales):
/// two vectors of at most max_key_tile_rows floats, on the stack as the transposed load's
/// staging block.
struct TileScales {
  ScaleSource k_source, v_source;
  bool v_is_k = false;  // MLA's latent: V's scales are K's, loaded once
  alignas(64) float k[max_key_tile_rows];
  alignas(64) float v[max_key_tile_rows];

  template <class Io>
  TileScalesRef load(index_t col0, index_t cols, Io& io) {
    assert(cols <= max_key_tile_rows);
    TileScalesRef ref;
    if (!k_source.empty()) {
      load_scales(k, k_source, col0, cols, io);
      ref.k = k;
    }
    if (v_is_k) {
      ref.v = ref.k;
    } else if (!v_source.empty()) {
      load_scales(v, v_source, col0, cols, io);
      ref.v = v;
    }
    return ref;
  }
};

/// What 16- and 32-bit K/V and 4-bit blocks have instead: no per-key scales.
struct NoTileScales {
  template <class Io>
  TileScalesRef load(index_t, index_t, Io&) { return {}; }
};

/// The scales of an item's K and V (8-bit K/V; nothing otherwise).
template <class Kv, class T, class KV>
auto item_scales(const ForwardParams<T, KV>& p, const QueryBlock& blk) {
  std::conditional_t<quantized_type<KV>, TileScales, NoTileScales> scales;
  if constexpr (quantized_type<KV>) {
    scales.k_source = Kv::scales(p, p.k_scale, blk);
    scales.v_source = Kv::scales(p, p.v_scale, blk);
    scales.v_is_k = p.v_in_k && p.v_scale.data == p.k_scale.data && p.v_scale.stride == p.k_scale.stride &&
                    p.v_scale.shape == p.k_scale.shape;
  }
  return scales;
}

}  // namespace tileattn::kernels
