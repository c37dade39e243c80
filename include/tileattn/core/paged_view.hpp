// tileattn/core/paged_view.hpp: one (sequence, K/V head)'s keys or values in a paged cache.
//
// A paged cache keeps K and V in page pools [num_pages, page_size, heads_kv, head_dim]
// (FlashAttention's flash_attn_with_kvcache and vLLM's layout); a sequence's block table
// lists its pages in order, so its row r lives in page table[r / page_size] at row
// r % page_size. PagedMatrixView is that [rows, head_dim] matrix: what MatrixView is for a
// contiguous tensor, with the row lookup going through the table. Rows within one page are
// a plain MatrixView (page_run), which is how the tile loads (memory/tile_io.hpp) read it.
//
// A gathered view (gather != nullptr: top-k sparse attention, topk.hpp) has row r at the
// sequence's cache position gather[r]: the indexer's selected keys as one compact matrix,
// so the same loads read them. Its page runs are the runs of consecutive positions within
// one page (one row each where the selection is scattered). The table, page size and gather
// list are a PageTable, which the per-page 8-bit scales (core/scale_source.hpp) address
// their pages through as well.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tileattn/core/strided_view.hpp"

namespace tileattn {

/// Where a sequence's rows lie in a paged cache: its block table and page size, and, for a
/// gathered sequence (top-k), each row's cache position. The one page addressing of the
/// K/V rows (PagedMatrixView) and of 8-bit scales kept per page (ScaleSource,
/// core/scale_source.hpp).
struct PageTable {
  const std::int32_t* table = nullptr;   // the sequence's block table
  index_t table_stride = 1;              // between consecutive table entries
  index_t page_size = 1;
  const std::int32_t* gather = nullptr;  // row r is cache position gather[r] (nullptr: r)

  /// Row r's cache position in the sequence.
  index_t position(index_t r) const { return gather ? static_cast<index_t>(gather[r]) : r; }
  /// The id of the page that holds row r.
  index_t page(index_t r) const { return static_cast<index_t>(table[(position(r) / page_size) * table_stride]); }

  /// The rows from r (before end) that follow r's position one by one within its page: a
  /// run of consecutive rows of one page (one row each where a gathered selection is
  /// scattered).
  index_t page_run(index_t r, index_t end) const {
    if (!gather) return std::min(end - r, page_size - r % page_size);
    const index_t at = gather[r];
    index_t n = 1;
    while (r + n < end && gather[r + n] == at + n && (at + n) % page_size != 0) ++n;
    return n;
  }
  /// The rows from r (before end) whose positions lie in r's page, in any order: what
  /// shares a per-page value (a scale).
  index_t same_page_rows(index_t r, index_t end) const {
    if (!gather) return page_run(r, end);
    const index_t page_of_r = gather[r] / page_size;
    index_t n = 1;
    while (r + n < end && gather[r + n] / page_size == page_of_r) ++n;
    return n;
  }
};

template <class T>
struct PagedMatrixView : PageTable {
  using element_type = T;
  T* pool = nullptr;                    // element (0, 0) of page 0 for this head
  index_t page_stride = 0;              // elements between pages
  index_t rows = 0;                     // the sequence's keys
  index_t cols = 0;
  index_t row_stride = 0;               // within a page
  index_t col_stride = 1;

  T* row(index_t r) const { return pool + page(r) * page_stride + (position(r) % page_size) * row_stride; }
  T& operator()(index_t r, index_t c) const { return row(r)[c * col_stride]; }

  /// Rows [r0, r0 + n) that lie in one page, as a plain matrix.
  MatrixView<T> page_run_matrix(index_t r0, index_t n) const { return {row(r0), n, cols, row_stride, col_stride}; }

  /// Calls f(run, offset) for the page runs that make up rows [row0, row0 + n): run is a
  /// MatrixView of consecutive rows within one page (PageTable::page_run), offset its first
  /// row's distance from row0.
  template <class F>
  void for_each_page_run(index_t row0, index_t n, F&& f) const {
    for (index_t r = row0; r < row0 + n;) {
      const index_t run = page_run(r, row0 + n);
      f(page_run_matrix(r, run), r - row0);
      r += run;
    }
  }
};

/// Head `head`'s [rows, head_dim] matrix of a sequence whose block table is `table`
/// (table_stride apart) in the page pool `pool` [num_pages, page_size, heads_kv, head_dim].
template <class T>
PagedMatrixView<T> paged_head_matrix(const TensorView<T>& pool, const std::int32_t* table,
                                     index_t table_stride, index_t head, index_t rows) {
  return {{table, table_stride, pool.shape[dim::seqlen]}, pool.ptr(0, 0, head, 0), pool.stride[dim::batch], rows,
          pool.shape[dim::head_dim], pool.stride[dim::seqlen], pool.stride[dim::head_dim]};
}

}  // namespace tileattn
