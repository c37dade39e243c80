// tileattn/core/types.hpp: the index type and small vocabulary shared by every header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tileattn {

/// All shape and stride arithmetic is 64-bit, so batch x seqlen x heads x head_dim
/// products never overflow.
using index_t = std::int64_t;

/// Every SRAM tile row starts on a cache line (and a full AVX-512 vector).
inline constexpr std::size_t cache_line_bytes = 64;

/// Rounds a byte count up to whole cache lines: the granule of every carve.
constexpr std::size_t round_up_to_line(std::size_t bytes) {
  return (bytes + cache_line_bytes - 1) / cache_line_bytes * cache_line_bytes;
}

namespace detail {
/// ceil(a / b) for b >= 1, without the overflow of (a + b - 1) / b near INT64_MAX.
constexpr index_t ceil_div(index_t a, index_t b) { return a / b + (a % b > 0); }

/// A sum of products of sizes that arguments choose, in int64, noting whether any step
/// overflowed (then `value` means nothing).
struct CheckedSum {
  index_t value = 0;
  bool overflow = false;

  CheckedSum& add(std::initializer_list<index_t> factors) {
    index_t product = 1;
    for (index_t f : factors) overflow |= __builtin_mul_overflow(product, f, &product);
    overflow |= __builtin_add_overflow(value, product, &value);
    return *this;
  }
  bool at_most(index_t limit) const { return !overflow && value <= limit; }
};
}  // namespace detail

}  // namespace tileattn
