// python/src/arrays.hpp: how the extension sees the arrays Python hands it (NumPy arrays,
// PyTorch tensors, anything with __dlpack__): nanobind ndarrays, turned into tileattn's
// strided views without a copy. A wrong rank or element type is a tileattn::invalid_argument
// naming the parameter, as every other bad argument (the kernels check the rest).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tileattn/core/error.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::python {

namespace nb = nanobind;

/// An array read by a kernel (read-only NumPy arrays are accepted) and one it writes. Any
/// device is taken here, so that check_array can name the argument that is not in CPU memory.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;
using OptionalIn = std::optional<InArray>;
using OptionalOut = std::optional<OutArray>;

/// The element types the extension takes, as DLPack codes them.
enum class Element { float32, bfloat16, float16, float64, int8, uint8, int32, int64, boolean, other };

inline Element element_of(nb::dlpack::dtype t) {
  using code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return Element::other;
  const auto c = static_cast<code>(t.code);
  if (c == code::Float && t.bits == 32) return Element::float32;
  if (c == code::Float && t.bits == 16) return Element::float16;
  if (c == code::Float && t.bits == 64) return Element::float64;
  if (c == code::Bfloat && t.bits == 16) return Element::bfloat16;
  if (c == code::Int && t.bits == 8) return Element::int8;
  if (c == code::Int && t.bits == 32) return Element::int32;
  if (c == code::Int && t.bits == 64) return Element::int64;
  if (c == code::UInt && t.bits == 8) return Element::uint8;
  if (c == code::Bool && t.bits == 8) return Element::boolean;
  return Element::other;
}

inline const char* element_name(Element e) {
  switch (e) {
    case Element::float32: return "float32";
    case Element::bfloat16: return "bfloat16";
    case Element::float16: return "float16";
    case Element::float64: return "float64";
    case Element::int8: return "int8";
    case Element::uint8: return "uint8";
    case Element::int32: return "int32";
    case Element::int64: return "int64";
    case Element::boolean: return "bool";
    case Element::other: return "an unsupported type";
  }
  return "an unsupported type";
}

/// The DLPack element each C++ element type is seen as. fp8 is carried as uint8 bytes (the
/// caller says which 8-bit format the bytes hold).
template <class T>
constexpr Element element_for() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) return Element::float32;
  else if constexpr (std::is_same_v<U, bf16>) return Element::bfloat16;
  else if constexpr (std::is_same_v<U, fp16>) return Element::float16;
  else if constexpr (std::is_same_v<U, std::int8_t>) return Element::int8;
  else if constexpr (std::is_same_v<U, fp8_e4m3> || std::is_same_v<U, fp8_e5m2> || std::is_same_v<U, std::uint8_t>)
    return Element::uint8;
  else if constexpr (std::is_same_v<U, std::int32_t>) return Element::int32;
  else if constexpr (std::is_same_v<U, std::int64_t>) return Element::int64;
  else if constexpr (std::is_same_v<U, bool>) return Element::boolean;
  else return Element::other;
}

template <class A>
Element element_of(const A& a) {
  return element_of(a.dtype());
}

/// Checks `a` is in CPU memory, has rank R and holds T; names `name` otherwise.
template <class T, int R, class A>
void check_array(const A& a, const std::string& name) {
  if (a.device_type() != nb::device::cpu::value)
    throw invalid_argument(name, "must be in CPU memory, got DLPack device type " + std::to_string(a.device_type()));
  if (a.ndim() != static_cast<std::size_t>(R))
    throw invalid_argument(name, "must have " + std::to_string(R) + " dimensions, got " + std::to_string(a.ndim()));
  if (element_of(a) != element_for<T>())
    throw invalid_argument(name, std::string("must hold ") + element_name(element_for<T>()) + ", got " +
                                     element_name(element_of(a)));
}

/// The view of `a` (rank R, elements T): its data, shape and strides (in elements), no copy.
template <class T, int R, class A>
StridedView<T, R> view_of(const A& a, const std::string& name) {
  check_array<T, R>(a, name);
  StridedView<T, R> v{};
  v.data = reinterpret_cast<T*>(const_cast<void*>(static_cast<const void*>(a.data())));
  for (int d = 0; d < R; ++d) {
    v.shape[static_cast<std::size_t>(d)] = static_cast<index_t>(a.shape(static_cast<std::size_t>(d)));
    v.stride[static_cast<std::size_t>(d)] = static_cast<index_t>(a.stride(static_cast<std::size_t>(d)));
  }
  return v;
}

/// The same for an optional array: an empty view (data == nullptr) when absent.
template <class T, int R, class A>
StridedView<T, R> view_of(const std::optional<A>& a, const std::string& name) {
  return a ? view_of<T, R>(*a, name) : StridedView<T, R>{};
}

/// A contiguous one-dimensional array as a span (ALiBi slopes, sinks, cu_seqlens...).
template <class T, class A>
std::span<T> span_of(const std::optional<A>& a, const std::string& name) {
  if (!a) return {};
  const StridedView<T, 1> v = view_of<T, 1>(*a, name);
  if (v.shape[0] > 1 && v.stride[0] != 1) throw invalid_argument(name, "must be contiguous");
  return {v.data, static_cast<std::size_t>(v.shape[0])};
}

}  // namespace tileattn::python
