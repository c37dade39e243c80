// tileattn/core/scale_source.hpp: where one (sequence, K/V head)'s dequantization scales
// of 8-bit K or V live, key by key.
//
// Contiguous K/V have one scale per (sequence, K/V head); a paged pool one per (page, K/V
// head), found through the sequence's block table: ScaleSource is that lookup, what
// MatrixView / PagedMatrixView are for the values themselves, through the same PageTable
// (core/paged_view.hpp: a gathered source, top-k's, has key r at cache position gather[r]).
// Tile IO's load_scales (memory/tile_io.hpp) fills a key tile's scales from it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tileattn/core/paged_view.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn {

struct ScaleSource : PageTable {
  const float* base = nullptr;  // the K/V head's scale (contiguous), or page 0's (paged)
  index_t page_stride = 0;      // floats between pages' scales (0: one for every key)

  /// One scale for every key: the (sequence, K/V head)'s.
  static ScaleSource contiguous(const float* scale) {
    ScaleSource s;
    s.base = scale;
    return s;
  }
  /// A scale per page: page0's scale, page_stride floats between pages', pages found
  /// through `pages` (a gathered sequence's too).
  static ScaleSource paged(const float* page0, index_t page_stride, const PageTable& pages) {
    ScaleSource s;
    static_cast<PageTable&>(s) = pages;
    s.base = page0;
    s.page_stride = page_stride;
    return s;
  }

  bool empty() const { return base == nullptr; }

  /// Calls f(scale, offset, count) for the runs of keys [row0, row0 + rows) that share a
  /// scale (one run when every key shares it; one per page otherwise, the keys of a
  /// gathered sequence whose positions lie in one page: PageTable::same_page_rows).
  template <class F>
  void for_each_run(index_t row0, index_t rows, F&& f) const {
    if (page_stride == 0 || table == nullptr) {
      f(*base, index_t{0}, rows);
      return;
    }
    for (index_t r = row0; r < row0 + rows;) {
      const index_t n = same_page_rows(r, row0 + rows);
      f(base[page(r) * page_stride], r - row0, n);
      r += n;
    }
  }
};

}  // namespace tileattn
