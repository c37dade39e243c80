// tileattn/detail/view_checks.hpp: argument checks on strided views (null data, sizes,
// strides, element counts and address ranges that must not overflow, shape agreement,
// memory overlap) that every public entry point shares.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::detail {

/// A float for an error message: the shortest text that reads back as x ("2.3587e+38",
/// "0.125"), not std::to_string's fixed %f (39 digits for a bound near FLT_MAX, "0.000000"
/// for a tiny value).
inline std::string readable(float x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::string(text, end);
}

/// Address range [begin, end) that a view's elements occupy; empty for a view with an
/// extent of 0. Only meaningful for views that passed check_view (no overflow).
struct ByteSpan {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  bool overlaps(const ByteSpan& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};

template <class T, int R>
ByteSpan byte_span(const StridedView<T, R>& v) {
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data);
  if (v.empty()) return {begin, begin};
  index_t last = 0;
  for (std::size_t d = 0; d < R; ++d) last += (v.shape[d] - 1) * v.stride[d];
  return {begin, begin + static_cast<std::uintptr_t>(last + 1) * sizeof(T)};
}

inline std::string dim_name(const std::string& view, const char* field, std::size_t d,
                            const char* meaning) {
  return view + "." + field + "[" + std::to_string(d) + "] (" + meaning + ")";
}

/// Which extents of a view may be 0 (an empty side of a variable-length batch).
template <int R>
using EmptyExtents = std::array<bool, static_cast<std::size_t>(R)>;

/// The view's element count and its address range both fit: the product of the extents
/// and the last element's offset fit in int64, the bytes it spans in PTRDIFF_MAX (no
/// object is larger, so pointer arithmetic across the view stays defined), and its last
/// byte in the address space.
template <class T, int R>
void check_view_fits(const StridedView<T, R>& v, const std::string& name) {
  index_t count = 1, last = 0;
  for (std::size_t d = 0; d < R; ++d) {
    TILEATTN_REQUIRE(!__builtin_mul_overflow(count, v.shape[d], &count), name,
            "has more than 2^63 elements (the product of its extents overflows)");
    index_t reach = 0;
    TILEATTN_REQUIRE(!__builtin_mul_overflow(std::max<index_t>(v.shape[d] - 1, 0), v.stride[d], &reach) &&
                !__builtin_add_overflow(last, reach, &last),
            name, "its extents and strides reach past 2^63 elements");
  }
  std::uintptr_t bytes = 0, end = 0;
  TILEATTN_REQUIRE(!__builtin_mul_overflow(static_cast<std::uintptr_t>(last) + 1, sizeof(T), &bytes) &&
              bytes <= static_cast<std::uintptr_t>(std::numeric_limits<std::ptrdiff_t>::max()) &&
              !__builtin_add_overflow(reinterpret_cast<std::uintptr_t>(v.data), bytes, &end),
          name, "its extents and strides span more than PTRDIFF_MAX bytes or reach past the end of the address space");
}

/// Non-null data, every size > 0 (or >= 0 where `may_be_empty` says), every stride >= 0,
/// and no overflow in its element count or address range.
template <class T, int R>
void check_view(const StridedView<T, R>& v, const std::string& name,
                const std::array<const char*, static_cast<std::size_t>(R)>& dim_meanings,
                const EmptyExtents<R>& may_be_empty = {}) {
  TILEATTN_REQUIRE(v.data != nullptr, name, "data is null");
  for (std::size_t d = 0; d < R; ++d) {
    const bool empty_ok = may_be_empty[static_cast<std::size_t>(d)];
    TILEATTN_REQUIRE(v.shape[d] > 0 || (empty_ok && v.shape[d] == 0), dim_name(name, "shape", d, dim_meanings[d]),
            std::string("must be ") + (empty_ok ? ">= 0" : "> 0") + ", got " + std::to_string(v.shape[d]));
    TILEATTN_REQUIRE(v.stride[d] >= 0, dim_name(name, "stride", d, dim_meanings[d]),
            "must be >= 0, got " + std::to_string(v.stride[d]));
  }
  check_view_fits(v, name);
}

/// a.shape[d] == b.shape[d], named after b.
template <class A, class B>
void check_same_extent(const A& a, const std::string& a_name, const B& b,
                       const std::string& b_name, std::size_t d, const char* meaning) {
  TILEATTN_REQUIRE(a.shape[d] == b.shape[d], dim_name(b_name, "shape", d, meaning),
          "must equal " + a_name + ".shape[" + std::to_string(d) + "] = " +
              std::to_string(a.shape[d]) + ", got " + std::to_string(b.shape[d]));
}

/// The first dimension (by stride) whose indices may reach an element that the dimensions
/// inside it reach too, or -1 when every index maps to its own element (a sufficient test:
/// each stride must pass the furthest offset of the smaller ones).
template <class T, int R>
int overlapping_dimension(const StridedView<T, R>& v) {
  if (v.empty()) return -1;  // no element: nothing to overlap
  std::array<std::size_t, static_cast<std::size_t>(R)> order{};
  for (std::size_t d = 0; d < R; ++d) order[d] = d;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v.stride[a] < v.stride[b]; });
  index_t reach = 0;  // furthest element offset reachable by the dimensions seen so far
  for (std::size_t d : order) {
    if (v.shape[d] == 1) continue;
    index_t span = 0;
    if (v.stride[d] <= reach || __builtin_mul_overflow(v.shape[d] - 1, v.stride[d], &span) ||
        __builtin_add_overflow(reach, span, &reach))
      return static_cast<int>(d);
  }
  return -1;
}

/// An output must not map two indices to one element, or threads would race on it.
template <class T, int R>
void check_no_self_overlap(const StridedView<T, R>& v, const std::string& name) {
  const int d = overlapping_dimension(v);
  TILEATTN_REQUIRE(d < 0, name + ".stride", "dimension " + std::to_string(d) + " overlaps the dimensions inside it");
}

/// Whether two views with overlapping address ranges still share no element: they have
/// the same strides and the view that stacks them (one more dimension, whose stride is the
/// distance between their bases) maps every index to its own element. So K and V pages
/// interleaved in one buffer ([pages, 2, page_size, heads, dim], FlashInfer's layout) are
/// disjoint; other interleavings are taken to overlap.
template <class T, int R>
bool interleaved(const StridedView<T, R>& a, const StridedView<T, R>& b) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a.data), pb = reinterpret_cast<std::uintptr_t>(b.data);
  const std::uintptr_t gap = pa < pb ? pb - pa : pa - pb;
  if (a.stride != b.stride || gap % sizeof(T) != 0) return false;
  StridedView<T, R + 1> both{a.data, {2}, {static_cast<index_t>(gap / sizeof(T))}};
  for (std::size_t d = 0; d < R; ++d) {
    both.shape[d + 1] = std::max(a.shape[d], b.shape[d]);
    both.stride[d + 1] = a.stride[d];
  }
  return overlapping_dimension(both) < 0;
}

/// A contiguous array (data and a count, or a span) as a 1-D view, for the overlap checks.
template <class E>
StridedView<const E, 1> array_view(const E* data, index_t n) {
  return {data, {n}, {1}};
}
template <class E>
StridedView<const E, 1> array_view(std::span<E> s) {
  return array_view<E>(s.data(), static_cast<index_t>(s.size()));
}

template <class Out, class In>
void check_disjoint(const Out& out, const std::string& out_name, const In& in,
                    const std::string& in_name) {
  TILEATTN_REQUIRE(!byte_span(out).overlaps(byte_span(in)), out_name,
          "overlaps " + in_name + " in memory (an output must not overlap another argument)");
}

/// check_disjoint for two views of one element type that may interleave (interleaved()):
/// they must not share an element.
template <class T, int R>
void check_no_shared_element(const StridedView<T, R>& out, const std::string& out_name, const StridedView<T, R>& other,
                             const std::string& other_name) {
  TILEATTN_REQUIRE(!byte_span(out).overlaps(byte_span(other)) || interleaved(out, other), out_name,
                   "shares elements with " + other_name + " (an output must not overlap another argument)");
}

}  // namespace tileattn::detail
