// tileattn/core/tile.hpp: SRAM tiles: aligned row-major matrices carved from a worker's scratch.
//
// The types only: carving them out of a ScratchArena (carve_tile, carve_row_refs,
// carve_tile_vector) is memory/scratch_arena.hpp's, so that core needs nothing above it.
//
// A Tile has a capacity fixed when it is carved and a current extent (rows x cols) that a
// kernel shrinks for the partial tiles at the end of a sequence. Rows are padded to whole
// cache lines: row(r) is always 64-byte aligned. RowRefs is the tile a load fills without
// copying: pointers to rows that stay in main memory (K and V read in place when few
// query rows share them).
#pragma once

#include <cassert>
#include <cstddef>

#include "tileattn/core/types.hpp"

namespace tileattn {

template <class T>
class Tile {
 public:
  using element_type = T;
  static constexpr index_t row_granule = static_cast<index_t>(cache_line_bytes / sizeof(T));

  /// Elements between consecutive rows for a tile of `cols` columns.
  static constexpr index_t leading_dim(index_t cols) {
    return (cols + row_granule - 1) / row_granule * row_granule;
  }

  /// Scratch bytes a rows x cols tile takes: what the planner budgets for it.
  static constexpr std::size_t footprint(index_t rows, index_t cols) {
    return round_up_to_line(static_cast<std::size_t>(rows * leading_dim(cols)) * sizeof(T));
  }

  Tile() = default;

  /// A rows x cols window onto memory the caller owns, ld elements between rows: how
  /// carve_tile hands out scratch, and how a kernel hands a main-memory accumulator (the
  /// backward's fp32 dQ) to the tile products.
  static Tile wrap(T* data, index_t rows, index_t cols, index_t ld) {
    Tile t;
    t.data_ = data;
    t.capacity_rows_ = t.rows_ = rows;
    t.capacity_cols_ = t.cols_ = cols;
    t.ld_ = ld;
    return t;
  }

  /// Shrinks (or restores) the extent in use, within the capacity carved.
  void set_extent(index_t rows, index_t cols) {
    assert(rows >= 0 && rows <= capacity_rows_ && cols >= 0 && cols <= capacity_cols_);
    rows_ = rows;
    cols_ = cols;
  }

  /// Rows [first, first + count) as a tile of their own (same columns and row stride).
  Tile slice_rows(index_t first, index_t count) const {
    assert(first >= 0 && count >= 0 && first + count <= capacity_rows_);
    Tile t = *this;
    t.data_ = row(first);
    t.rows_ = t.capacity_rows_ = count;
    return t;
  }

  /// Columns [first, first + count) of the current extent as a tile of their own (same rows
  /// and row stride). Its rows start `first` elements past a cache line: for operands read
  /// with unaligned loads (the backward narrows its resident key tiles to the keys a query
  /// tile sees).
  Tile slice_cols(index_t first, index_t count) const {
    assert(first >= 0 && count >= 0 && first + count <= capacity_cols_);
    Tile t = *this;
    t.data_ = data_ + first;
    t.cols_ = t.capacity_cols_ = count;
    return t;
  }

  index_t rows() const { return rows_; }
  index_t cols() const { return cols_; }
  index_t ld() const { return ld_; }
  index_t capacity_rows() const { return capacity_rows_; }
  index_t capacity_cols() const { return capacity_cols_; }

  T* data() const { return data_; }
  T* row(index_t r) const { return data_ + r * ld_; }
  T& operator()(index_t r, index_t c) const { return data_[r * ld_ + c]; }

 private:
  T* data_ = nullptr;
  index_t rows_ = 0, cols_ = 0;
  index_t capacity_rows_ = 0, capacity_cols_ = 0;
  index_t ld_ = 0;
};

/// A tile of rows read in place: row r is the main-memory row rows[r] (cols contiguous
/// elements). Carved like a tile (Bc pointers: carve_row_refs); tile IO's load_row_refs fills
/// it and counts the bytes the products will read.
template <class T>
class RowRefs {
 public:
  using element_type = T;
  static constexpr std::size_t footprint(index_t rows) {
    return round_up_to_line(static_cast<std::size_t>(rows) * sizeof(const T*));
  }
  /// Room for `capacity` row addresses at `rows` (memory the caller owns), none set yet.
  static RowRefs wrap(const T** rows, index_t capacity) {
    RowRefs t;
    t.rows_ = rows;
    t.capacity_ = capacity;
    return t;
  }
  void set_extent(index_t rows, index_t cols) {
    assert(rows >= 0 && rows <= capacity_);
    count_ = rows;
    cols_ = cols;
  }
  index_t rows() const { return count_; }
  index_t cols() const { return cols_; }
  const T* const* data() const { return rows_; }
  const T*& row_ref(index_t r) const { return rows_[r]; }
  const T* row(index_t r) const { return rows_[r]; }
  T operator()(index_t r, index_t c) const { return rows_[r][c]; }

 private:
  const T** rows_ = nullptr;
  index_t count_ = 0, cols_ = 0, capacity_ = 0;
};

/// A per-row statistic of a query tile (running max, running sum): one float per row
/// (carve_tile_vector).
template <class T>
class TileVector {
 public:
  static constexpr std::size_t footprint(index_t size) {
    return round_up_to_line(static_cast<std::size_t>(size) * sizeof(T));
  }
  /// `size` elements at `data` (memory the caller owns).
  static TileVector wrap(T* data, index_t size) {
    TileVector v;
    v.data_ = data;
    v.size_ = size;
    return v;
  }
  TileVector slice(index_t first, index_t count) const {
    assert(first >= 0 && count >= 0 && first + count <= size_);
    TileVector v;
    v.data_ = data_ + first;
    v.size_ = count;
    return v;
  }
  index_t size() const { return size_; }
  T* data() const { return data_; }
  T& operator[](index_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace tileattn
