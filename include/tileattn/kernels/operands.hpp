// tileattn/kernels/operands.hpp: what the forward and backward loops share about their
// operands: the SRAM operand type of a storage type (tile_operand_t: float, or bf16 pairs;
// with_tile_operand where the micro-kernels are chosen at run time) and the matrix of one
// head of one sequence that
// their tiles load from and store to (sequence_matrix).
#pragma once

#include <type_traits>

#include "tileattn/arch/native.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/core/types.hpp"
#include "tileattn/kernels/tile_plan.hpp"

namespace tileattn::kernels {

/// The SRAM operand type of Q, K, V and P for storage type T: bf16 pairs where the arch
/// multiplies them natively (arch::native::bf16_dot_product), float otherwise (fp16 has no
/// such instruction here; float tiles keep its 11-bit significands exact, where bf16 tiles
/// would drop 3 bits: docs/precision.md).
/// Where the set is chosen at run time (arch/native.hpp's dispatch), so is this: there is no
/// tile_operand_t, and kernels take the type from with_tile_operand.
#if !TILEATTN_ARCH_DISPATCH
template <class T>
using tile_operand_t =
    std::conditional_t<std::is_same_v<T, bf16> && arch::native::bf16_dot_product, bf16x2, float>;
#endif

template <class Op>
inline constexpr TileOperands tile_operands_v =
    std::is_same_v<Op, bf16x2> ? TileOperands::bf16_pairs : TileOperands::fp32;

/// Op's tile operands in this process: bf16 pairs in panels where the micro-kernel set
/// multiplies prepared operands by slabs (arch/prepared_pairs.hpp: AMX tiles in use).
template <class Op>
TileOperands tile_operands_here() {
  if (std::is_same_v<Op, bf16x2> && arch::native::product_slab_rows() > 0) return TileOperands::bf16_panels;
  return tile_operands_v<Op>;
}

/// f(std::type_identity<Op>{}) for T's operand type Op (tile_operand_t<T>, or its run-time
/// choice under dispatch: bf16 pairs where the running set multiplies them). 4-bit block K/V
/// (KV) take float tiles whatever T is: a q4_0 value (q - 8) * d has up to 14 significant bits,
/// exact in float but not in bf16 (core/block_quantized_types.hpp).
template <class T, class KV = T, class F>
decltype(auto) with_tile_operand(F&& f) {
  if constexpr (block_quantized_type<KV>) {
    return f(std::type_identity<float>{});
  } else {
#if TILEATTN_ARCH_DISPATCH
    if constexpr (std::is_same_v<T, bf16>)
      if (arch::native::bf16_dot_product()) return f(std::type_identity<bf16x2>{});
    return f(std::type_identity<float>{});
#else
    return f(std::type_identity<tile_operand_t<T>>{});
#endif
  }
}

/// tile_operands_v of T's operand type in this process, whatever arch::native is (fixed or
/// dispatched): plain bf16 pairs or float, never panels.
template <class T>
TileOperands tile_operands_without_panels() {
  return with_tile_operand<T>([]<class Op>(std::type_identity<Op>) { return tile_operands_v<Op>; });
}

/// tile_operands_v of T's operand type in this process (with K/V in KV).
template <class T, class KV = T>
TileOperands tile_operands_for() {
  return with_tile_operand<T, KV>([]<class Op>(std::type_identity<Op>) { return tile_operands_here<Op>(); });
}

/// The [len, head_dim] matrix of one head of one sequence.
template <class T>
MatrixView<T> sequence_matrix(const TensorView<T>& t, index_t view_batch, index_t head,
                              index_t start, index_t len) {
  MatrixView<T> m = head_matrix(t, view_batch, head);
  if (len > 0) m.data += start * m.row_stride;  // an empty sequence may start past the last row
  m.rows = len;
  return m;
}

}  // namespace tileattn::kernels
