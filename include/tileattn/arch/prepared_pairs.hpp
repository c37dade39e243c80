// tileattn/arch/prepared_pairs.hpp: a bf16 pair B operand prepared once for many products,
// and the row slabs the kernels multiply it in.
//
// A key tile's K^T (S = Q K^T) and V (O += P V) are the B operands of every query row of a
// work item. A set whose products run faster from a copy of B in its own layout (arch::amx:
// whole 16 x 16 tiles, contiguous) makes that copy once per key tile (prepare_pairs) and
// multiplies it slab by slab (gemm_prepared): the kernels then take the rows of a work item
// product_slab_rows() at a time, so that a slab's scores, probabilities and outputs stay in
// the L1 cache between the products and the softmax, instead of streaming the whole tile's
// through L2 three times a key tile (kernels/forward.hpp). A set without such a layout reads
// B in place, and product_slab_rows() is 0 (one slab: every row at once).
//
// The contract, in every set (arch/micro_kernel_set.hpp):
//   PreparedPairs prepare_pairs(k, n, b, ldb, buffer)  B (k pairs x n columns) as the set's
//       products read it: a packed copy in buffer (prepared_pairs_capacity(k, n) pairs,
//       64-byte aligned), or B itself;
//   gemm_prepared<Accumulate>(m, n, k, a, lda, prepared, c, ldc)  gemm's C (+)= A B with B
//       prepared: the same bits as gemm on B itself;
//   product_slab_rows()  rows per slab (0: all rows at once);
//   product_panel_keys()  keys per key tile (panel) the planner aims for with slabs;
//   begin_products(), end_products()  bracket a work item's products (AMX: the tile
//       configuration, loaded once per item instead of once per product; nests; no-ops
//       elsewhere). ProductScope (ops/matmul.hpp) calls them.
#pragma once

#include <atomic>

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::arch {

/// A B operand of bf16 pairs as a set's gemm_prepared reads it: B itself (data[p * ld + j]),
/// or, with packed_tiles > 0, a copy in whole zero-padded 16 x 16 tiles, the tile of pairs
/// [16 s, 16 s + 16) and columns [16 t, 16 t + 16) at data + (s * packed_tiles + t) * 256.
/// With panels (arch::avx512 with vdpbf16ps), a copy in the column panels its gemm sweeps
/// over all `width` columns: the panel of columns [j, j + w) (w = 16 x its vectors) at
/// data + j * depth, depth rows of w pairs. Either copy serves the products of any leading
/// part of B (fewer pairs, fewer columns: a slab that sees only a panel's first keys).
struct PreparedPairs {
  const bf16x2* data = nullptr;
  index_t ld = 0;
  index_t packed_tiles = 0;  // column tiles per 16 pairs of the packed copy; 0: B itself
  bool panels = false;       // packed in column panels (avx512)
  index_t depth = 0, width = 0;  // the pairs and columns packed (panels)
};

/// Rows per slab where a set multiplies pairs from prepared operands (AMX: 64; vdpbf16ps:
/// see arch/avx512/gemm.hpp). Tests and benchmarks change them to compare schedules; every row's
/// result is the same bits for every slab height.
inline std::atomic<index_t> tile_slab_rows{64};
inline std::atomic<index_t> dot_product_slab_rows{64};

/// Pairs the buffer of prepare_pairs holds for a k x n operand: whole 16 x 16 tiles.
constexpr index_t prepared_pairs_capacity(index_t k, index_t n) {
  return (k + 15) / 16 * 16 * ((n + 15) / 16 * 16);
}

}  // namespace tileattn::arch

/// The contract for a set whose products read B in place (all but arch::amx): defines
/// prepare_pairs, gemm_prepared, product_slab_rows, begin_products and end_products in the
/// namespace it expands in, over that namespace's gemm.
#define TILEATTN_PAIRS_READ_IN_PLACE                                                                      \
  inline ::tileattn::arch::PreparedPairs prepare_pairs(index_t, index_t, const bf16x2* b, index_t ldb,    \
                                                       bf16x2*) {                                          \
    return {b, ldb, 0};                                                                                   \
  }                                                                                                       \
  template <bool Accumulate>                                                                              \
  void gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,                       \
                     const ::tileattn::arch::PreparedPairs& b, float* c, index_t ldc) {                   \
    gemm<Accumulate>(m, n, k, a, lda, b.data, b.ld, c, ldc);                                              \
  }                                                                                                       \
  inline index_t product_slab_rows() { return 0; }                                                        \
  inline index_t product_panel_keys() { return 0; }                                                       \
  inline void begin_products() {}                                                                         \
  inline void end_products() {}
