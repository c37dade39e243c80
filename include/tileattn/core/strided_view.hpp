// tileattn/core/strided_view.hpp: non-owning strided views over main memory ("HBM").
//
// A TensorView is how tileattn sees Q, K, V and O: a pointer, a shape and a stride per
// dimension, always in the logical order [batch, seqlen, heads, head_dim]. Any physical
// layout whose strides are non-negative works; make_bhsd() shows the common
// [batch, heads, seqlen, head_dim] buffer described by strides alone.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "tileattn/core/types.hpp"

namespace tileattn {

/// A non-owning view of a Rank-dimensional strided tensor. Strides count elements.
template <class T, int Rank>
struct StridedView {
  static_assert(Rank >= 1);
  using element_type = T;
  static constexpr int rank = Rank;

  T* data = nullptr;
  std::array<index_t, static_cast<std::size_t>(Rank)> shape{};
  std::array<index_t, static_cast<std::size_t>(Rank)> stride{};

  template <class... I>
  T& operator()(I... i) const {
    static_assert(sizeof...(I) == Rank, "one index per dimension");
    const std::array<index_t, sizeof...(I)> idx{static_cast<index_t>(i)...};
    index_t offset = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) offset += idx[d] * stride[d];
    return data[offset];
  }

  /// The same view with const elements, so outputs can be passed where inputs are read.
  operator StridedView<const T, Rank>() const
    requires(!std::is_const_v<T>)
  {
    return {data, shape, stride};
  }

  bool empty() const {
    for (index_t s : shape)
      if (s == 0) return true;
    return false;
  }
};

/// Q, K, V and O: [batch, seqlen, heads, head_dim].
template <class T>
using TensorView = StridedView<T, 4>;

/// Log-sum-exp output: [batch, heads, seqlen_q], float, natural log.
using LseView = StridedView<float, 3>;

/// A 2-D slice: one (batch, head) pair's [seqlen, head_dim] matrix.
template <class T>
struct MatrixView {
  using element_type = T;
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t row_stride = 0;
  index_t col_stride = 1;

  T* row(index_t r) const { return data + r * row_stride; }
  T& operator()(index_t r, index_t c) const { return data[r * row_stride + c * col_stride]; }
};

namespace dim {
inline constexpr int batch = 0;
inline constexpr int seqlen = 1;
inline constexpr int heads = 2;
inline constexpr int head_dim = 3;
}  // namespace dim

/// The [seqlen, head_dim] matrix of one (batch, head) pair.
template <class T>
MatrixView<T> head_matrix(const TensorView<T>& t, index_t batch, index_t head) {
  return {t.data + batch * t.stride[dim::batch] + head * t.stride[dim::heads],
          t.shape[dim::seqlen], t.shape[dim::head_dim], t.stride[dim::seqlen],
          t.stride[dim::head_dim]};
}

/// The same view over elements of type To that have From's size and alignment: how a
/// buffer of Eigen::bfloat16, std::bfloat16_t or raw std::uint16_t is seen as tileattn::bf16
/// (core/half_types.hpp). Const stays const. Strides and shape are unchanged.
template <class To, class From, int Rank>
auto reinterpret_view(const StridedView<From, Rank>& v) {
  using Target = std::conditional_t<std::is_const_v<From>, const To, To>;
  static_assert(sizeof(To) == sizeof(From) && alignof(To) <= alignof(From),
                "reinterpret_view: the element types must have the same size (and To no stricter alignment)");
  static_assert(std::is_trivially_copyable_v<To> && std::is_trivially_copyable_v<std::remove_const_t<From>>,
                "reinterpret_view: both element types must be trivially copyable");
  return StridedView<Target, Rank>{reinterpret_cast<Target*>(v.data), v.shape, v.stride};
}

/// A view over a contiguous [batch, seqlen, heads, head_dim] buffer (FlashAttention's layout).
template <class T>
TensorView<T> make_bshd(T* data, index_t batch, index_t seqlen, index_t heads, index_t head_dim) {
  return {data,
          {batch, seqlen, heads, head_dim},
          {seqlen * heads * head_dim, heads * head_dim, head_dim, 1}};
}

/// A view over a contiguous [batch, heads, seqlen, head_dim] buffer (PyTorch SDPA's
/// layout), still indexed as [batch, seqlen, heads, head_dim].
template <class T>
TensorView<T> make_bhsd(T* data, index_t batch, index_t heads, index_t seqlen, index_t head_dim) {
  return {data,
          {batch, seqlen, heads, head_dim},
          {heads * seqlen * head_dim, head_dim, seqlen * head_dim, 1}};
}

/// A view over a contiguous [batch, heads, seqlen_q] log-sum-exp buffer.
inline LseView make_lse(float* data, index_t batch, index_t heads, index_t seqlen_q) {
  return {data, {batch, heads, seqlen_q}, {heads * seqlen_q, seqlen_q, 1}};
}

}  // namespace tileattn
