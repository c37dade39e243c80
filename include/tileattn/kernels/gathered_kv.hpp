// tileattn/kernels/gathered_kv.hpp: the K/V source of top-k sparse attention (topk.hpp):
// page pools read through the block table at the positions an indexer selected.
//
// The forward loop's third K/V source (kernels/kv_source.hpp), beside ContiguousKv and
// PagedKv. Its params' sequences are query rows (ForwardParams::gathered): row s attends
// the compact list of keys GatheredKeys names, so its K and V are a gathered
// PagedMatrixView (key j of the list at cache position positions[begin[s] + j] of its
// batch sequence, found through that sequence's block table) and 8-bit scales follow each
// key's page. The tile loads, the products and the online softmax run unchanged over the
// list, a key tile at a time; split-KV cuts the list as it cuts a sequence's keys.
#pragma once

#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/scale_source.hpp"
#include "tileattn/kernels/work_list.hpp"

namespace tileattn::kernels {

struct GatheredPagedKv {
  template <class T, class KV, class View>
  static auto matrix(const ForwardParams<T, KV>& p, const View& view, const QueryBlock& blk) {
    const GatheredKeys& g = *p.gathered;
    const auto& table = p.block_table;  // (k_len) selected rows
    auto m = paged_head_matrix(view, table.ptr(g.sequence_of[blk.sequence], 0), table.stride[1], blk.kv_head,
                               blk.range.k_len);
    m.gather = g.positions + g.begin[blk.sequence];
    return m;
  }
  /// 8-bit K/V scales per (page, K/V head): each selected key's page's.
  template <class T, class KV>
  static ScaleSource scales(const ForwardParams<T, KV>& p, const KvScaleView& s, const QueryBlock& blk) {
    if (!s.data) return {};
    const GatheredKeys& g = *p.gathered;
    const auto& table = p.block_table;
    return ScaleSource::paged(s.ptr(0, blk.kv_head), s.stride[0],
                              {table.ptr(g.sequence_of[blk.sequence], 0), table.stride[1], p.k.shape[dim::seqlen],
                               g.positions + g.begin[blk.sequence]});
  }
};

}  // namespace tileattn::kernels
