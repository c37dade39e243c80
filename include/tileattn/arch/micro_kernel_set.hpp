// tileattn/arch/micro_kernel_set.hpp: the contract every micro-kernel set keeps, as a
// concept: what ops/, memory/ and kernels/ call through arch::native.
//
// A set is a namespace (generic, avx2, avx512, amx, dispatch); a concept takes a type, so
// TILEATTN_DEFINE_MICRO_KERNEL_SET(Name, ns) defines a struct Name whose static members
// forward to ns's functions (name and bf16_dot_product become functions, constants in the
// fixed sets, run-time answers in the dispatching one). arch/native.hpp checks each set
// compiled into the TU:
//   TILEATTN_DEFINE_MICRO_KERNEL_SET(generic_set, generic);
//   static_assert(MicroKernelSet<generic_set>);
// The contracts themselves (shapes, rounding, what each leaves in memory) are written at
// generic's functions (arch/generic.hpp), the reference the others must match.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "tileattn/arch/philox.hpp"
#include "tileattn/arch/prepared_pairs.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::arch {

namespace set_detail {
/// A set's constant, or its run-time answer (a function).
template <class V>
constexpr auto value(V v) {
  if constexpr (std::is_invocable_v<V>) return v();
  else return v;
}
}  // namespace set_detail

/// The operations on rows of storage type E that K and V are read in place from: the two
/// products and the finite check.
template <class S, class E>
concept reads_rows_in_place = requires(index_t n, const float* cf, float* f, const E* x, const E* const* rows) {
  S::gemm_nt_rows(n, n, n, cf, n, rows, f, n);
  S::gemm_rows(n, n, n, cf, n, rows, f, n);
  { S::all_finite(x, n) } -> std::same_as<bool>;
};

/// Every operation the kernels use, over every element type they use it with. E rows:
/// the storage types K and V are read in place from (float, bf16, fp16, fp8, int8).
template <class S>
concept MicroKernelSet =
    reads_rows_in_place<S, float> && reads_rows_in_place<S, bf16> && reads_rows_in_place<S, fp16> &&
    reads_rows_in_place<S, fp8_e4m3> && reads_rows_in_place<S, fp8_e5m2> && reads_rows_in_place<S, std::int8_t> &&
    requires(index_t n, float x, const float* cf, float* f, const bf16x2* cp, bf16x2* p, const bf16* cb, bf16* b,
             const fp16* ch, fp16* h, const fp8_e4m3* ce4, const fp8_e5m2* ce5, const std::int8_t* ci8,
             const void* const* rows, const bf16* const* brows, std::uint64_t* u64,
             const std::uint64_t* cu64) {
  { S::name() } -> std::convertible_to<const char*>;
  { S::bf16_dot_product() } -> std::convertible_to<bool>;
  // Tile products: float and bf16 pair operands, C = or += A B, A given or transposed.
  S::template gemm<false>(n, n, n, cf, n, cf, n, f, n);
  S::template gemm<true>(n, n, n, cf, n, cf, n, f, n);
  S::template gemm<true, true>(n, n, n, cf, n, cf, n, f, n);
  S::template gemm<false>(n, n, n, cp, n, cp, n, f, n);
  S::template gemm<true>(n, n, n, cp, n, cp, n, f, n);
  S::template gemm<true, true>(n, n, n, cp, n, cp, n, f, n);
  // Rows read in place: reads_rows_in_place above, their prefetch, and the products of bf16
  // pairs with bf16 rows (where in_place_pairs says the set uses them).
  S::touch_rows(rows, n, n);
  { S::in_place_pairs() } -> std::convertible_to<bool>;
  { S::in_place_pairs_min_rows() } -> std::convertible_to<index_t>;
  S::gemm_nt_rows_pairs(n, n, n, cp, n, brows, f, n);
  S::gemm_rows_pairs(n, n, n, cp, n, brows, f, n);
  // The softmax's row operations.
  { S::row_max(cf, n) } -> std::same_as<float>;
  S::exp2_shift_sum_rows(f, n, n, n, cf, cf, f);
  S::exp2_shift_sum_rows(f, n, n, n, cf, cf, f, p, n);
  { S::exp2_shift_sum(f, n, x, x) } -> std::same_as<float>;
  S::scale(f, n, x);
  { S::exp2(x) } -> std::same_as<float>;
  { S::mul_add(x, x, x) } -> std::same_as<float>;
  S::add_alibi_bias(f, n, x, n);
  { S::all_finite(cp, n) } -> std::same_as<bool>;
  // Loads and stores: transposes, conversions, the bf16 pair layouts.
  S::transpose(n, n, cf, n, f, n);
  S::to_float(cb, f, n);
  S::to_float(ch, f, n);
  S::to_float(ce4, f, n);
  S::to_float(ce5, f, n);
  S::to_float(ci8, f, n);
  S::from_float(cf, b, n);
  S::from_float(cf, h, n);
  S::interleave_pairs(cb, cb, p, n);
  S::interleave_rounded(cf, cf, p, n);
  S::round_to_pairs(cf, p, n);
  // Dropout: a row's keep bits (arch/philox.hpp) and their application to P.
  S::dropout_keep_bits(static_cast<const DropoutRow*>(nullptr), n, n, n, u64, n);
  S::apply_keep_bits(f, n, cu64, n, x);
  S::apply_keep_bits(p, n, cu64, n);
  // A pair B operand prepared once for many row slabs (arch/prepared_pairs.hpp).
  { S::prepare_pairs(n, n, cp, n, p) } -> std::same_as<PreparedPairs>;
  S::template gemm_prepared<false>(n, n, n, cp, n, S::prepare_pairs(n, n, cp, n, p), f, n);
  S::template gemm_prepared<true>(n, n, n, cp, n, S::prepare_pairs(n, n, cp, n, p), f, n);
  { S::product_slab_rows() } -> std::same_as<index_t>;
  { S::product_panel_keys() } -> std::same_as<index_t>;
  S::begin_products();
  S::end_products();
};

}  // namespace tileattn::arch

/// Defines struct Name, namespace ns (a micro-kernel set) as a type: static members that
/// forward to ns's functions, for MicroKernelSet.
#define TILEATTN_SET_FORWARD(ns, f)                                  \
  template <class... A>                                              \
  static auto f(A... a)->decltype(ns::f(a...)) {                     \
    return ns::f(a...);                                              \
  }
#define TILEATTN_DEFINE_MICRO_KERNEL_SET(Name, ns)                                                \
  struct Name {                                                                                   \
    static const char* name() { return ::tileattn::arch::set_detail::value(ns::name); }           \
    static bool bf16_dot_product() { return ::tileattn::arch::set_detail::value(ns::bf16_dot_product); } \
    static bool in_place_pairs() { return ::tileattn::arch::set_detail::value(ns::in_place_pairs); }     \
    static index_t in_place_pairs_min_rows() {                                                    \
      return ::tileattn::arch::set_detail::value(ns::in_place_pairs_min_rows);                     \
    }                                                                                             \
    template <bool Accumulate, bool TransA = false, class... A>                                    \
    static auto gemm(A... a)->decltype(ns::gemm<Accumulate, TransA>(a...)) {                       \
      return ns::gemm<Accumulate, TransA>(a...);                                                  \
    }                                                                                             \
    TILEATTN_SET_FORWARD(ns, gemm_nt_rows)                                                        \
    TILEATTN_SET_FORWARD(ns, gemm_rows)                                                           \
    TILEATTN_SET_FORWARD(ns, touch_rows)                                                          \
    TILEATTN_SET_FORWARD(ns, gemm_nt_rows_pairs)                                                  \
    TILEATTN_SET_FORWARD(ns, gemm_rows_pairs)                                                     \
    TILEATTN_SET_FORWARD(ns, row_max)                                                             \
    TILEATTN_SET_FORWARD(ns, exp2_shift_sum_rows)                                                 \
    TILEATTN_SET_FORWARD(ns, exp2_shift_sum)                                                      \
    TILEATTN_SET_FORWARD(ns, scale)                                                               \
    TILEATTN_SET_FORWARD(ns, exp2)                                                                \
    TILEATTN_SET_FORWARD(ns, mul_add)                                                             \
    TILEATTN_SET_FORWARD(ns, add_alibi_bias)                                                      \
    TILEATTN_SET_FORWARD(ns, all_finite)                                                          \
    TILEATTN_SET_FORWARD(ns, transpose)                                                           \
    TILEATTN_SET_FORWARD(ns, to_float)                                                            \
    TILEATTN_SET_FORWARD(ns, from_float)                                                          \
    TILEATTN_SET_FORWARD(ns, interleave_pairs)                                                    \
    TILEATTN_SET_FORWARD(ns, interleave_rounded)                                                  \
    TILEATTN_SET_FORWARD(ns, round_to_pairs)                                                      \
    TILEATTN_SET_FORWARD(ns, dropout_keep_bits)                                                   \
    TILEATTN_SET_FORWARD(ns, apply_keep_bits)                                                     \
    TILEATTN_SET_FORWARD(ns, prepare_pairs)                                                       \
    template <bool Accumulate, class... A>                                                        \
    static auto gemm_prepared(A... a)->decltype(ns::gemm_prepared<Accumulate>(a...)) {            \
      return ns::gemm_prepared<Accumulate>(a...);                                                 \
    }                                                                                             \
    TILEATTN_SET_FORWARD(ns, product_slab_rows)                                                   \
    TILEATTN_SET_FORWARD(ns, product_panel_keys)                                                  \
    TILEATTN_SET_FORWARD(ns, begin_products)                                                      \
    TILEATTN_SET_FORWARD(ns, end_products)                                                        \
  }
