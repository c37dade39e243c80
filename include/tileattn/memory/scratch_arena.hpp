// tileattn/memory/scratch_arena.hpp: one worker's SRAM: a byte budget that every tile is carved from.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn {

/// Rounds a byte count up to whole cache lines: the granule of every carve.
constexpr std::size_t round_up_to_line(std::size_t bytes) {
  return (bytes + cache_line_bytes - 1) / cache_line_bytes * cache_line_bytes;
}

/// A worker's scratch. Owns exactly `budget` bytes (cache-line aligned); carve() hands out
/// cache-line-aligned pieces and throws budget_error past the budget. reset() frees all
/// pieces at once, between work items.
class ScratchArena {
 public:
  explicit ScratchArena(std::size_t budget_bytes)
      : budget_(round_up_to_line(budget_bytes)),
        storage_(static_cast<std::byte*>(
            budget_ ? std::aligned_alloc(cache_line_bytes, budget_) : nullptr)) {
    if (budget_ && !storage_) throw std::bad_alloc();
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
  std::size_t budget() const { return budget_; }
  std::size_t used() const { return used_; }
  std::size_t high_water() const { return high_water_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t budget_;
  std::unique_ptr<std::byte, Free> storage_;
  std::size_t used_ = 0;
  std::size_t high_water_ = 0;
};

}  // namespace tileattn

namespace tileattn {

/// The calling thread's scratch, holding at least `budget_bytes` (made or regrown on first
/// use, then kept for later calls so that a kernel call allocates nothing). Each worker
/// thread owns one; a kernel resets it per work item.
inline ScratchArena& worker_scratch(std::size_t budget_bytes) {
  thread_local std::unique_ptr<ScratchArena> arena;
  if (!arena || arena->budget() != round_up_to_line(budget_bytes))
    arena = std::make_unique<ScratchArena>(budget_bytes);
  arena->reset();
  return *arena;
}

}  // namespace tileattn
