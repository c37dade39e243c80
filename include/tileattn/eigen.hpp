// tileattn/eigen.hpp: tileattn views of Eigen tensors and matrices, so that forward() runs on
// Eigen data in place (no copy). Optional: include it only where Eigen is used; the rest of
// tileattn never includes Eigen. Needs Eigen 3.4 (CMake: find_package(Eigen3 3.4 NO_MODULE),
// link Eigen3::Eigen).
//
//   #include <tileattn/tileattn.hpp>
//   #include <tileattn/eigen.hpp>
//
//   using Tensor4 = Eigen::Tensor<Eigen::bfloat16, 4, Eigen::RowMajor>;
//   Tensor4 q(B, N, H, D), k(B, N, Hkv, D), v(B, N, Hkv, D), o(B, N, H, D);  // [b, s, h, d]
//   Eigen::Tensor<float, 3, Eigen::RowMajor> lse(B, H, N);                  // [b, h, s]
//   namespace te = tileattn::eigen;
//   tileattn::forward(te::view(q), te::view(k), te::view(v), te::view(o), te::lse_view(lse));
//
// What it holds (all in namespace tileattn::eigen; every view aliases the Eigen object's
// memory, which must outlive it and not be resized):
//   view(x)       x an Eigen::Tensor<T, 4, Eigen::RowMajor> or a TensorMap of one, whose
//                 dimensions are [batch, seqlen, heads, head_dim] (FlashAttention's "bshd"
//                 layout) -> TensorView<element_t<T>>;
//                 x a row-major Eigen::Matrix / Array, or a Map, Ref or Block of one (any
//                 outer and inner stride): ONE head's [seqlen, head_dim] matrix -> a
//                 TensorView of shape [1, seqlen, 1, head_dim].
//   view_bhsd(x)  x a rank-4 RowMajor Tensor or TensorMap whose dimensions are [batch, heads,
//                 seqlen, head_dim] (PyTorch SDPA's layout) -> the same TensorView, by strides.
//   lse_view(x)   the float log-sum-exp output: a RowMajor Eigen::Tensor<float, 3> or TensorMap
//                 of one, [batch, heads, seqlen_q] -> LseView; or a float vector (VectorXf,
//                 RowVectorXf, a Map or Block of one) for one head -> LseView [1, 1, seqlen_q].
//   element_t<T>  float -> float, Eigen::bfloat16 -> tileattn::bf16, Eigen::half ->
//                 tileattn::fp16 (the same 16 bits); const T -> const element.
// Const Eigen objects (and TensorMap<const Tensor<...>>, Map<const Matrix<...>>) give views of
// const elements: usable for Q, K and V, not for O. A ColMajor tensor or matrix, a tensor of
// another rank or an element type other than float, Eigen::bfloat16 and Eigen::half is a
// compile-time error that says so; so is view() of a temporary Tensor or Matrix (it would dangle).
#pragma once

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

#include <type_traits>

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::eigen {

namespace detail {

/// The tileattn storage type with the same bits as Eigen scalar S (S itself if none).
template <class S>
struct element {
  static constexpr bool supported = false;
  using type = S;
};
template <>
struct element<float> {
  static constexpr bool supported = true;
  using type = float;
};
template <>
struct element<Eigen::bfloat16> {
  static constexpr bool supported = true;
  using type = bf16;
};
template <>
struct element<Eigen::half> {
  static constexpr bool supported = true;
  using type = fp16;
};
template <class S>
struct element<const S> {
  static constexpr bool supported = element<S>::supported;
  using type = const typename element<S>::type;
};

// The mapping reinterprets memory, so each pair must agree in size and alignment (the bits
// agree by definition: IEEE binary16, and the upper half of a binary32).
static_assert(sizeof(Eigen::bfloat16) == sizeof(bf16) && alignof(Eigen::bfloat16) == alignof(bf16) &&
                  std::is_trivially_copyable_v<Eigen::bfloat16>,
              "tileattn::eigen: Eigen::bfloat16 must be a trivially copyable 16-bit type, as tileattn::bf16");
static_assert(sizeof(Eigen::half) == sizeof(fp16) && alignof(Eigen::half) == alignof(fp16) &&
                  std::is_trivially_copyable_v<Eigen::half>,
              "tileattn::eigen: Eigen::half must be a trivially copyable 16-bit type, as tileattn::fp16");

template <class S>
constexpr void check_scalar() {
  static_assert(element<S>::supported,
                "tileattn::eigen: the element type must be float, Eigen::bfloat16 or Eigen::half");
}

/// A Q/K/V/O view of a rank-`Rank` tensor of layout `Layout` at `data` with dimensions `dims`,
/// read as [batch, seqlen, heads, head_dim] (Bhsd: [batch, heads, seqlen, head_dim]).
template <int Rank, int Layout, bool Bhsd, class S, class Dims>
auto tensor_view(S* data, const Dims& dims) {
  static_assert(Layout == static_cast<int>(Eigen::RowMajor),
                "tileattn::eigen: tensors must be RowMajor (Eigen::Tensor<T, 4, Eigen::RowMajor>), so "
                "that the last dimension, head_dim, is the contiguous one; the bytes of a ColMajor "
                "[head_dim, heads, seqlen, batch] tensor are a RowMajor TensorMap [batch, seqlen, heads, "
                "head_dim]");
  static_assert(Rank == 4,
                "tileattn::eigen: Q, K, V and O tensors must have rank 4, [batch, seqlen, heads, head_dim] "
                "(view_bhsd: [batch, heads, seqlen, head_dim]); one head is a row-major Eigen::Matrix, "
                "the LSE goes through lse_view()");
  check_scalar<std::remove_const_t<S>>();
  using E = typename element<S>::type;
  TensorView<E> out;
  if constexpr (Rank == 4) {
    const index_t b = dims[0], d1 = dims[1], d2 = dims[2], d = dims[3];
    const StridedView<S, 4> raw = Bhsd ? make_bhsd(data, b, d1, d2, d) : make_bshd(data, b, d1, d2, d);
    out = reinterpret_view<std::remove_const_t<E>>(raw);
  }
  return out;
}

/// One head: [1, rows, 1, cols] over a row-major matrix with the given strides.
template <bool RowMajor, class S>
auto matrix_view(S* data, index_t rows, index_t cols, index_t outer_stride, index_t inner_stride) {
  static_assert(RowMajor,
                "tileattn::eigen: matrices must be RowMajor (Eigen::Matrix<T, Eigen::Dynamic, "
                "Eigen::Dynamic, Eigen::RowMajor>): one head's [seqlen, head_dim] matrix with "
                "rows of head_dim elements");
  check_scalar<std::remove_const_t<S>>();
  const StridedView<S, 4> raw{
      data, {1, rows, 1, cols}, {rows * outer_stride, outer_stride, cols * inner_stride, inner_stride}};
  return reinterpret_view<std::remove_const_t<typename element<S>::type>>(raw);
}

template <int Rank, int Layout, class S, class Dims>
LseView lse_tensor_view(S* data, const Dims& dims) {
  static_assert(std::is_same_v<S, float>,
                "tileattn::eigen: the LSE must be a (non-const) float tensor, Eigen::Tensor<float, 3, Eigen::RowMajor>");
  static_assert(Layout == static_cast<int>(Eigen::RowMajor),
                "tileattn::eigen: tensors must be RowMajor (the LSE: Eigen::Tensor<float, 3, Eigen::RowMajor>)");
  static_assert(Rank == 3, "tileattn::eigen: the LSE tensor must have rank 3, [batch, heads, seqlen_q]");
  LseView out;
  if constexpr (Rank == 3 && std::is_same_v<S, float>) out = make_lse(data, dims[0], dims[1], dims[2]);
  return out;
}

template <bool IsVector, class S>
LseView lse_vector_view(S* data, index_t size, index_t inner_stride) {
  static_assert(std::is_same_v<S, float>,
                "tileattn::eigen: the LSE must be a (non-const) float vector, Eigen::VectorXf");
  static_assert(IsVector, "tileattn::eigen: one head's LSE must be a vector (Eigen::VectorXf), [seqlen_q]");
  LseView out;
  if constexpr (std::is_same_v<S, float>)
    out = {data, {1, 1, size}, {size * inner_stride, size * inner_stride, inner_stride}};
  return out;
}

/// The data pointer of an Eigen map-like object (Map, Ref, Block), const unless it is writable.
template <class Derived>
auto map_data(const Eigen::MapBase<Derived, Eigen::ReadOnlyAccessors>& m) {
  using Scalar = typename Derived::Scalar;
  if constexpr ((Derived::Flags & Eigen::LvalueBit) != 0)
    return const_cast<Scalar*>(m.data());  // the map was made over mutable memory
  else
    return m.data();
}

}  // namespace detail

/// The tileattn element type of Eigen scalar S (float, tileattn::bf16, tileattn::fp16; const kept).
template <class S>
using element_t = typename detail::element<S>::type;

// ---- Rank-4 tensors: [batch, seqlen, heads, head_dim] ---------------------------------------

template <class S, int Rank, int Options, class Index>
auto view(Eigen::Tensor<S, Rank, Options, Index>& t) {
  return detail::tensor_view<Rank, (Options & Eigen::RowMajor), false>(t.data(), t.dimensions());
}
template <class S, int Rank, int Options, class Index>
auto view(const Eigen::Tensor<S, Rank, Options, Index>& t) {
  return detail::tensor_view<Rank, (Options & Eigen::RowMajor), false>(t.data(), t.dimensions());
}
/// A view of a temporary tensor would dangle.
template <class S, int Rank, int Options, class Index>
void view(const Eigen::Tensor<S, Rank, Options, Index>&&) = delete;

template <class Plain, int MapOptions, template <class> class MakePointer>
auto view(const Eigen::TensorMap<Plain, MapOptions, MakePointer>& m) {
  using Map = Eigen::TensorMap<Plain, MapOptions, MakePointer>;
  return detail::tensor_view<static_cast<int>(Map::NumIndices), static_cast<int>(Map::Layout), false>(
      m.data(), m.dimensions());
}

// ---- Rank-4 tensors: [batch, heads, seqlen, head_dim] ---------------------------------------

template <class S, int Rank, int Options, class Index>
auto view_bhsd(Eigen::Tensor<S, Rank, Options, Index>& t) {
  return detail::tensor_view<Rank, (Options & Eigen::RowMajor), true>(t.data(), t.dimensions());
}
template <class S, int Rank, int Options, class Index>
auto view_bhsd(const Eigen::Tensor<S, Rank, Options, Index>& t) {
  return detail::tensor_view<Rank, (Options & Eigen::RowMajor), true>(t.data(), t.dimensions());
}
/// A view of a temporary tensor would dangle.
template <class S, int Rank, int Options, class Index>
void view_bhsd(const Eigen::Tensor<S, Rank, Options, Index>&&) = delete;

template <class Plain, int MapOptions, template <class> class MakePointer>
auto view_bhsd(const Eigen::TensorMap<Plain, MapOptions, MakePointer>& m) {
  using Map = Eigen::TensorMap<Plain, MapOptions, MakePointer>;
  return detail::tensor_view<static_cast<int>(Map::NumIndices), static_cast<int>(Map::Layout), true>(
      m.data(), m.dimensions());
}

// ---- One head: a row-major [seqlen, head_dim] matrix -> [1, seqlen, 1, head_dim] ------------

template <class Derived>
auto view(Eigen::PlainObjectBase<Derived>& m) {
  return detail::matrix_view<bool(Derived::IsRowMajor)>(m.data(), m.rows(), m.cols(), m.outerStride(),
                                                        m.innerStride());
}
template <class Derived>
auto view(const Eigen::PlainObjectBase<Derived>& m) {
  return detail::matrix_view<bool(Derived::IsRowMajor)>(m.data(), m.rows(), m.cols(), m.outerStride(),
                                                        m.innerStride());
}
/// A view of a temporary matrix would dangle.
template <class Derived>
void view(const Eigen::PlainObjectBase<Derived>&&) = delete;

/// Map, Ref and Block (of a matrix with direct access): their own outer and inner strides.
template <class Derived>
auto view(const Eigen::MapBase<Derived, Eigen::ReadOnlyAccessors>& m) {
  return detail::matrix_view<bool(Derived::IsRowMajor)>(detail::map_data(m), m.rows(), m.cols(),
                                                        m.outerStride(), m.innerStride());
}

// ---- The log-sum-exp output -----------------------------------------------------------------

template <class S, int Rank, int Options, class Index>
LseView lse_view(Eigen::Tensor<S, Rank, Options, Index>& t) {
  return detail::lse_tensor_view<Rank, (Options & Eigen::RowMajor)>(t.data(), t.dimensions());
}
template <class Plain, int MapOptions, template <class> class MakePointer>
LseView lse_view(const Eigen::TensorMap<Plain, MapOptions, MakePointer>& m) {
  using Map = Eigen::TensorMap<Plain, MapOptions, MakePointer>;
  return detail::lse_tensor_view<static_cast<int>(Map::NumIndices), static_cast<int>(Map::Layout)>(
      m.data(), m.dimensions());
}
/// One head's LSE: a float vector of seqlen_q entries -> [1, 1, seqlen_q].
template <class Derived>
LseView lse_view(Eigen::PlainObjectBase<Derived>& v) {
  return detail::lse_vector_view<bool(Derived::IsVectorAtCompileTime)>(v.data(), v.size(), v.innerStride());
}
template <class Derived>
LseView lse_view(const Eigen::MapBase<Derived, Eigen::ReadOnlyAccessors>& v) {
  return detail::lse_vector_view<bool(Derived::IsVectorAtCompileTime)>(detail::map_data(v), v.size(),
                                                                       v.innerStride());
}

}  // namespace tileattn::eigen
