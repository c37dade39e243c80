// tileattn/memory/line_aligned.hpp: an allocator of cache-line aligned memory, so that main-
// memory buffers tileattn owns (a KV cache's page pools) start rows on line boundaries and
// the kernels that read them in place never split a vector load across two lines.
#pragma once

#include <cstddef>
#include <new>

#include "tileattn/memory/scratch_arena.hpp"

namespace tileattn {

template <class T>
struct LineAlignedAllocator {
  using value_type = T;
  LineAlignedAllocator() = default;
  template <class U>
  constexpr LineAlignedAllocator(const LineAlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{cache_line_bytes}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{cache_line_bytes}); }
  template <class U>
  bool operator==(const LineAlignedAllocator<U>&) const noexcept { return true; }
};

}  // namespace tileattn
