// tileattn/arch/register_transpose.hpp: the register transpose of a rows x cols block (K
// rows into a K^T tile), written once for every SIMD set over its VecTraits.
//
// Not a header on its own: arch/avx2.hpp and arch/avx512/pair_layout.hpp include it at the
// set's namespace scope, under its target, after detail::VecTraits and the set's
// detail::transpose_square(reg (&)[lanes]) (a lanes x lanes block transposed in registers);
// arch/register_gemm.hpp says why. No include guard, no includes.

namespace detail {
/// One block of transpose(): up to lanes x lanes, masked unless Full.
template <bool Full>
inline void transpose_block(index_t rows, index_t cols, const float* src, index_t lds, float* dst, index_t ldd) {
  using V = VecTraits;
  constexpr int lanes = static_cast<int>(V::lanes);
  const typename V::mask col_mask = V::first_lanes(Full ? lanes : cols);
  const typename V::mask row_mask = V::first_lanes(Full ? lanes : rows);
  typename V::reg r[lanes];
#pragma GCC unroll 16
  for (int i = 0; i < lanes; ++i) {
    if (Full) r[i] = V::load(src + i * lds);
    else r[i] = i < rows ? V::load(src + i * lds, col_mask) : V::zero();
  }
  transpose_square(r);
#pragma GCC unroll 16
  for (int i = 0; i < lanes; ++i) {
    if (Full) V::store(dst + i * ldd, r[i]);
    else if (i < cols) V::store(dst + i * ldd, row_mask, r[i]);
  }
}
}  // namespace detail

/// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: a rows x cols row-major
/// block written out as its cols x rows transpose (K rows into a K^T tile). In lanes x lanes
/// blocks through registers; the partial blocks at the edges are masked.
inline void transpose(index_t rows, index_t cols, const float* src, index_t lds, float* dst, index_t ldd) {
  tileattn::arch::detail::transpose_in_blocks<detail::VecTraits::lanes>(
      rows, cols, src, lds, dst, ldd,
      [](auto full, auto... block) { detail::transpose_block<decltype(full)::value>(block...); });
}
