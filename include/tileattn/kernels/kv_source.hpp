// tileattn/kernels/kv_source.hpp: where K and V live: the contract of a K/V source, as a
// concept (what the forward's loaders, kernels/key_loaders.hpp, ask of the `Kv` policy), and
// the two plain sources, kernels::ContiguousKv (contiguous views, fixed or variable length)
// and kernels::PagedKv (page pools through a block table); top-k's gathered source is
// kernels/gathered_kv.hpp's. A plug-in that lacks a member fails at run_forward's template
// head with the name kv_source, not inside a tile load.
//
// For one work item (a QueryBlock) of the params p, a source gives
//   Kv::matrix(p, p.k, blk), Kv::matrix(p, p.v, blk)   the item's K and V rows as an HBM view
//       the tile loads read (memory/tile_io.hpp): a MatrixView or a PagedMatrixView of the
//       K/V storage type, the same type for K and V;
//   Kv::scales(p, p.k_scale, blk), Kv::scales(p, p.v_scale, blk)   where the item's
//       dequantization scales live (a ScaleSource), asked only when K/V are 8-bit.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/kernels/operands.hpp"
#include "tileattn/kernels/work_list.hpp"

namespace tileattn::kernels {

/// The HBM views of K or V rows that the tile loads read: plain or paged, of storage type KV.
template <class M, class KV>
concept kv_matrix = std::same_as<M, MatrixView<const KV>> || std::same_as<M, PagedMatrixView<const KV>>;

/// A K/V source for ForwardParams P (K/V storage type P::kv_type).
template <class Kv, class P>
concept kv_source =
    requires(const P& p, const TensorView<const typename P::kv_type>& view, const QueryBlock& blk) {
      { Kv::matrix(p, view, blk) } -> kv_matrix<typename P::kv_type>;
    } &&
    (!quantized_type<typename P::kv_type> ||  // 8-bit K/V: Kv::scales must place their scales
     requires(const P& p, const KvScaleView& scales, const QueryBlock& blk) {
       { Kv::scales(p, scales, blk) } -> std::convertible_to<ScaleSource>;
     });

/// The HBM view of an item's K (or V) rows that source Kv gives for ForwardParams<T, KV>.
template <class Kv, class T, class KV>
using source_matrix_t = decltype(Kv::matrix(std::declval<const ForwardParams<T, KV>&>(),
                                            std::declval<const TensorView<const KV>&>(), std::declval<const QueryBlock&>()));

/// K and V of a work item in contiguous [batch, seqlen, heads, head_dim] views; 8-bit ones'
/// scales per (sequence, K/V head).
struct ContiguousKv {
  template <class T, class KV, class View>
  static auto matrix(const ForwardParams<T, KV>&, const View& view, const QueryBlock& blk) {
    return sequence_matrix(view, blk.range.view_batch, blk.kv_head, blk.range.k_start, blk.range.k_len);
  }
  template <class T, class KV>
  static ScaleSource scales(const ForwardParams<T, KV>&, const KvScaleView& s, const QueryBlock& blk) {
    if (!s.data) return {};
    return ScaleSource::contiguous(&s(blk.sequence, blk.kv_head));
  }
};

/// K and V of a work item in page pools, through the sequence's row of the block table.
struct PagedKv {
  template <class T, class KV, class View>
  static auto matrix(const ForwardParams<T, KV>& p, const View& view, const QueryBlock& blk) {
    const auto& table = p.block_table;
    return paged_head_matrix(view, table.ptr(blk.sequence, 0), table.stride[1], blk.kv_head, blk.range.k_len);
  }
  /// 8-bit K/V scales per (page, K/V head), through the block table.
  template <class T, class KV>
  static ScaleSource scales(const ForwardParams<T, KV>& p, const KvScaleView& s, const QueryBlock& blk) {
    if (!s.data) return {};
    const auto& table = p.block_table;
    return ScaleSource::paged(s.ptr(0, blk.kv_head), s.stride[0],
                              {table.ptr(blk.sequence, 0), table.stride[1], p.k.shape[dim::seqlen]});
  }
};

}  // namespace tileattn::kernels
