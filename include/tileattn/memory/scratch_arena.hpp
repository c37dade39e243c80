// tileattn/memory/scratch_arena.hpp: one worker's SRAM: a byte budget that every tile is carved from,
// and the carving of tiles, row references and tile vectors out of it, one by one or as a
// kernel's whole tile list.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/tile.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn {

/// A worker's scratch: `capacity()` bytes allocated (cache-line aligned) and a byte budget
/// of at most that much. carve() hands out cache-line-aligned pieces and throws
/// budget_error past the budget. reset() frees all pieces at once, between work items, and
/// may set a new budget within the capacity.
class ScratchArena {
 public:
  explicit ScratchArena(std::size_t budget_bytes)
      : capacity_(round_up_to_line(budget_bytes)),
        budget_(capacity_),
        storage_(static_cast<std::byte*>(
            capacity_ ? std::aligned_alloc(cache_line_bytes, capacity_) : nullptr)) {
    if (capacity_ < budget_bytes) throw std::bad_alloc();  // the rounding wrapped around
    if (capacity_ && !storage_) throw std::bad_alloc();
  }

  template <class T>
  T* carve(std::size_t count) {
    const std::size_t bytes = round_up_to_line(count * sizeof(T));
    if (bytes > budget_ - used_)
      throw budget_error("sram_budget_bytes",
                         "carving " + std::to_string(bytes) + " bytes with " +
                             std::to_string(budget_ - used_) + " of " + std::to_string(budget_) +
                             " left");
    T* piece = reinterpret_cast<T*>(storage_.get() + used_);
    used_ += bytes;
    if (used_ > high_water_) high_water_ = used_;
    return piece;
  }

  void reset() { used_ = 0; }
  /// Frees every piece and makes the budget `budget_bytes` (rounded to lines, <= capacity).
  void reset(std::size_t budget_bytes) {
    assert(round_up_to_line(budget_bytes) <= capacity_);
    budget_ = round_up_to_line(budget_bytes);
    used_ = 0;
  }
  std::size_t capacity() const { return capacity_; }
  std::size_t budget() const { return budget_; }
  std::size_t used() const { return used_; }
  std::size_t high_water() const { return high_water_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t capacity_;
  std::size_t budget_;
  std::unique_ptr<std::byte, Free> storage_;
  std::size_t used_ = 0;
  std::size_t high_water_ = 0;
};

}  // namespace tileattn

namespace tileattn {

/// The calling thread's scratch with a budget of `budget_bytes` (a kernel passes its plan's
/// working set, not the whole SRAM budget). Made on first use and regrown only when a call
/// needs more, then kept for later calls, so that a kernel call allocates nothing: each
/// worker thread holds the largest working set it has run. A kernel resets it per work item.
inline ScratchArena& worker_scratch(std::size_t budget_bytes) {
  thread_local std::unique_ptr<ScratchArena> arena;
  if (!arena || arena->capacity() < round_up_to_line(budget_bytes))
    arena = std::make_unique<ScratchArena>(budget_bytes);
  arena->reset(budget_bytes);
  return *arena;
}

/// A rows x cols tile carved from `arena`: Tile<T>::footprint(rows, cols) bytes, rows
/// padded to whole cache lines, its extent the whole capacity.
template <class T>
Tile<T> carve_tile(ScratchArena& arena, index_t rows, index_t cols) {
  assert(rows > 0 && cols > 0);
  const index_t ld = Tile<T>::leading_dim(cols);
  return Tile<T>::wrap(arena.carve<T>(static_cast<std::size_t>(rows * ld)), rows, cols, ld);
}

/// Room for `capacity` row addresses (RowRefs<T>::footprint(capacity) bytes).
template <class T>
RowRefs<T> carve_row_refs(ScratchArena& arena, index_t capacity) {
  return RowRefs<T>::wrap(arena.carve<const T*>(static_cast<std::size_t>(capacity)), capacity);
}

/// A vector of `size` elements (TileVector<T>::footprint(size) bytes).
template <class T>
TileVector<T> carve_tile_vector(ScratchArena& arena, index_t size) {
  return TileVector<T>::wrap(arena.carve<T>(static_cast<std::size_t>(size)), size);
}

/// A kernel's scratch tiles are listed once, in a member `pieces(piece, dims...)` that calls
/// piece(tile, rows, cols), piece(vector, size) or piece(row_refs, capacity) for each, in
/// carving order. PieceBytes walks that list to count the bytes the planner budgets,
/// PieceCarver to carve the pieces, so that the byte count and the carve cannot disagree.
struct PieceBytes {
  std::size_t bytes = 0;
  template <class T>
  constexpr void operator()(const Tile<T>&, index_t rows, index_t cols) { bytes += Tile<T>::footprint(rows, cols); }
  template <class T>
  constexpr void operator()(const TileVector<T>&, index_t size) { bytes += TileVector<T>::footprint(size); }
  template <class T>
  constexpr void operator()(const RowRefs<T>&, index_t capacity) { bytes += RowRefs<T>::footprint(capacity); }
};

struct PieceCarver {
  ScratchArena& arena;
  template <class T>
  void operator()(Tile<T>& t, index_t rows, index_t cols) { t = carve_tile<T>(arena, rows, cols); }
  template <class T>
  void operator()(TileVector<T>& v, index_t size) { v = carve_tile_vector<T>(arena, size); }
  template <class T>
  void operator()(RowRefs<T>& r, index_t capacity) { r = carve_row_refs<T>(arena, capacity); }
};

/// The bytes the pieces of Tiles take for `dims` (the arguments of Tiles::pieces after the visitor).
template <class Tiles, class... Dims>
constexpr std::size_t pieces_bytes(Dims... dims) {
  Tiles t;
  PieceBytes count;
  t.pieces(count, dims...);
  return count.bytes;
}

/// Tiles carved from `arena` for `dims`, piece by piece in the order Tiles::pieces lists them.
template <class Tiles, class... Dims>
Tiles carve_pieces(ScratchArena& arena, Dims... dims) {
  Tiles t;
  PieceCarver carver{arena};
  t.pieces(carver, dims...);
  return t;
}

}  // namespace tileattn
