// tests/fuzz/fuzz_layouts.hpp: how the harnesses lay a tensor out from one input byte
// (Relayout: a shifted start, a dimension order, an inner stride, gaps), and, for 4-D
// tensors drawn in float, the copy into a storage type T in that layout (make_stored) and
// the exact float mirror the reference reads (mirror).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "support/test_support.hpp"

namespace tileattn::fuzz {

/// Where a tensor goes in its final buffer.
struct Relayout {
  int shift = 0;             // elements between the allocation's start and the buffer's
  bool fresh = false;        // copied into a layout of its own (else: the generated one)
  int order = 0;             // fresh: dimension order, outermost first (orders below)
  index_t inner_stride = 1;  // fresh: stride of the innermost dimension
  index_t pad = 0;           // fresh: gap after each dimension's span
};

/// Dimension orders, outermost first, of a 4-D tensor's dimensions 0 to 3 (for Q/K/V/O:
/// bshd, bhsd, bhds with head_dim strided by the sequence, sbdh with heads innermost).
inline constexpr std::array<std::array<int, 4>, 4> orders{{{0, 1, 2, 3}, {0, 2, 1, 3}, {0, 2, 3, 1}, {1, 0, 3, 2}}};

/// The layout one input byte asks for.
inline Relayout relayout_of(std::uint8_t b) {
  Relayout r;
  r.shift = b & 3;
  r.fresh = (b >> 2) & 1;
  r.order = (b >> 3) & 3;
  r.inner_stride = 1 + ((b >> 5) & 1);
  r.pad = (b >> 6) & 3;
  return r;
}

/// A buffer of float values with a view over it, as a harness generated it.
struct Buffer {
  std::vector<float> data;
  TensorView<float> view;
};

/// A tensor in storage type T: its buffer and its view.
template <class T>
struct Stored {
  std::vector<T> data;
  TensorView<T> view;
};

/// `src` in type T, laid out as `r` says; elements outside the view hold `gap` (fresh
/// layouts, shift) or src's own padding, rounded (the generated layout).
template <class T>
Stored<T> make_stored(const Buffer& src, const Relayout& r, T gap) {
  Stored<T> s;
  const TensorView<float>& from = src.view;
  const auto shift = static_cast<std::size_t>(r.shift);
  if (!r.fresh) {
    s.data.assign(src.data.size() + shift, gap);
    for (std::size_t i = 0; i < src.data.size(); ++i) s.data[shift + i] = from_float<T>(src.data[i]);
    s.view = {s.data.data() + shift + (from.data - src.data.data()), from.shape, from.stride};
    return s;
  }
  std::array<index_t, 4> stride{};
  index_t span = r.inner_stride, last = 0;
  for (int i = 3; i >= 0; --i) {
    const int d = orders[static_cast<std::size_t>(r.order)][static_cast<std::size_t>(i)];
    if (from.stride[d] == 0) continue;  // a broadcast dimension stays one
    stride[d] = span;
    span = span * from.shape[d] + r.pad;
    last += (from.shape[d] - 1) * stride[d];
  }
  s.data.assign(static_cast<std::size_t>(last + 1) + shift, gap);
  s.view = {s.data.data() + shift, from.shape, stride};
  test::for_each_index(from.shape, [&](index_t b, index_t n, index_t h, index_t c) {
    s.view(b, n, h, c) = from_float<T>(from(b, n, h, c));
  });
  return s;
}

/// A float copy of a T buffer (exact) with the same view over it, for the reference.
template <class T>
Buffer mirror(const Stored<T>& s) {
  Buffer m;
  m.data.resize(s.data.size());
  for (std::size_t i = 0; i < s.data.size(); ++i) m.data[i] = to_float(s.data[i]);
  m.view = {m.data.data() + (s.view.data - s.data.data()), s.view.shape, s.view.stride};
  return m;
}

}  // namespace tileattn::fuzz
