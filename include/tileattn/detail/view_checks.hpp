// tileattn/detail/view_checks.hpp: argument checks on strided views (null data, sizes,
// strides, shape agreement, memory overlap) that every public entry point shares.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::detail {

/// Address range [begin, end) that a view's elements occupy.
struct ByteSpan {
  std::uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteSpan& other) const { return begin < other.end && other.begin < end; }
};

template <class T, int R>
ByteSpan byte_span(const StridedView<T, R>& v) {
  index_t last = 0;
  for (int d = 0; d < R; ++d) last += (v.shape[d] - 1) * v.stride[d];
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data);
  return {begin, begin + static_cast<std::uintptr_t>((last + 1) * sizeof(T))};
}

inline std::string dim_name(const std::string& view, const char* field, int d,
                            const char* meaning) {
  return view + "." + field + "[" + std::to_string(d) + "] (" + meaning + ")";
}

/// Non-null data, every size > 0, every stride >= 0.
template <class T, int R>
void check_view(const StridedView<T, R>& v, const std::string& name,
                const std::array<const char*, static_cast<std::size_t>(R)>& dim_meanings) {
  require(v.data != nullptr, name, "data is null");
  for (int d = 0; d < R; ++d) {
    require(v.shape[d] > 0, dim_name(name, "shape", d, dim_meanings[d]),
            "must be > 0, got " + std::to_string(v.shape[d]));
    require(v.stride[d] >= 0, dim_name(name, "stride", d, dim_meanings[d]),
            "must be >= 0, got " + std::to_string(v.stride[d]));
  }
}

/// a.shape[d] == b.shape[d], named after b.
template <class A, class B>
void check_same_extent(const A& a, const std::string& a_name, const B& b,
                       const std::string& b_name, int d, const char* meaning) {
  require(a.shape[d] == b.shape[d], dim_name(b_name, "shape", d, meaning),
          "must equal " + a_name + ".shape[" + std::to_string(d) + "] = " +
              std::to_string(a.shape[d]) + ", got " + std::to_string(b.shape[d]));
}

/// An output must not map two indices to one element, or threads would race on it.
template <class T, int R>
void check_no_self_overlap(const StridedView<T, R>& v, const std::string& name) {
  std::array<int, R> order{};
  for (int d = 0; d < R; ++d) order[d] = d;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return v.stride[a] < v.stride[b]; });
  index_t reach = 0;  // furthest element offset reachable by the dimensions seen so far
  for (int d : order) {
    if (v.shape[d] == 1) continue;
    require(v.stride[d] > reach, name + ".stride",
            "dimension " + std::to_string(d) + " overlaps the dimensions inside it");
    reach += (v.shape[d] - 1) * v.stride[d];
  }
}

template <class Out, class In>
void check_disjoint(const Out& out, const std::string& out_name, const In& in,
                    const std::string& in_name) {
  require(!byte_span(out).overlaps(byte_span(in)), out_name,
          "overlaps " + in_name + " in memory (outputs must not alias inputs)");
}

}  // namespace tileattn::detail
