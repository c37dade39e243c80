// tileattn/kernels/kv_source.hpp: the contract of a K/V source, as a concept: what the
// forward loop (kernels/forward.hpp) asks of the `Kv` policy that says where K and V live.
// kernels::ContiguousKv (contiguous views, fixed or variable length) and kernels::PagedKv
// (page pools through a block table) are the two sources; a plug-in that lacks a member
// fails at run_forward's template head with the name kv_source, not inside a tile load.
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

#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/core/strided_view.hpp"
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

}  // namespace tileattn::kernels
