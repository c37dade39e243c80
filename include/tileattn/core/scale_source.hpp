// tileattn/core/scale_source.hpp: where one (sequence, K/V head)'s dequantization scales
// of 8-bit K or V live, key by key.
//
// Contiguous K/V have one scale per (sequence, K/V head); a paged pool one per (page, K/V
// head), found through the sequence's block table: ScaleSource is that lookup, what
// MatrixView / PagedMatrixView are for the values themselves. Tile IO's load_scales
// (memory/tile_io.hpp) fills a key tile's scales from it. A gathered source (top-k sparse
// attention, topk.hpp) has key r at cache position gather[r], as PagedMatrixView::gather.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tileattn/core/types.hpp"

namespace tileattn {

struct ScaleSource {
  const float* base = nullptr;          // the K/V head's scale (contiguous), or page 0's (paged)
  index_t page_stride = 0;              // floats between pages' scales (0: one for every key)
  const std::int32_t* table = nullptr;  // the sequence's block table (paged)
  index_t table_stride = 1;
  index_t page_size = 1;
  const std::int32_t* gather = nullptr;  // key r is cache position gather[r] (nullptr: r)

  bool empty() const { return base == nullptr; }

  /// Calls f(scale, offset, count) for the runs of keys [row0, row0 + rows) that share a
  /// scale (one run when every key shares it; one per page otherwise).
  template <class F>
  void for_each_run(index_t row0, index_t rows, F&& f) const {
    if (page_stride == 0 || table == nullptr) {
      f(*base, index_t{0}, rows);
      return;
    }
    if (gather) {  // runs of keys whose positions lie in one page
      for (index_t r = row0; r < row0 + rows;) {
        const index_t page = gather[r] / page_size;
        index_t end = r + 1;
        while (end < row0 + rows && gather[end] / page_size == page) ++end;
        f(base[static_cast<index_t>(table[page * table_stride]) * page_stride], r - row0, end - r);
        r = end;
      }
      return;
    }
    for (index_t r = row0; r < row0 + rows;) {
      const index_t page = r / page_size, end = std::min(row0 + rows, (page + 1) * page_size);
      f(base[static_cast<index_t>(table[page * table_stride]) * page_stride], r - row0, end - r);
      r = end;
    }
  }
};

}  // namespace tileattn
