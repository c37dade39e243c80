// tileattn/arch/avx512/set.hpp: the body of one AVX-512 micro-kernel set, namespace
// tileattn::arch::TILEATTN_AVX512_SET, its parts in the order they build on each other.
//
// Included by arch/avx512.hpp once per feature set, with TILEATTN_AVX512_SET and
// TILEATTN_AVX512_HAS_BF16, _DQ and _BW_VL defined, under the set's target; so no include
// guard, and the standard and tileattn headers its parts use come from arch/avx512.hpp.

namespace tileattn::arch::TILEATTN_AVX512_SET {

#include "tileattn/arch/avx512/intrinsics.hpp"

inline constexpr const char* name = "avx512";
/// With AVX-512 BF16 (vdpbf16ps), bf16 tiles are multiplied as bf16 pairs into float
/// accumulators; without it they are converted to float when loaded. Where arch/amx.hpp is
/// compiled (x86-64 Linux), arch::native is arch::amx, whose pairs run on AMX tiles when the
/// process may use them; this constant is avx512's own choice, for builds without it
/// (TILEATTN_NO_AMX): targets with AMX keep float tiles, since on the 16-core Xeon we
/// measure on a vdpbf16ps loop runs at 79 GFLOP/s per core, under half its FMA loop, and
/// the bf16 forward on pairs at 0.55-0.66x the one on float tiles (docs/precision.md).
/// -DTILEATTN_BF16_DOT_PRODUCT=0 or 1 overrides the choice.
#if TILEATTN_AVX512_HAS_BF16 && defined(TILEATTN_BF16_DOT_PRODUCT)
inline constexpr bool bf16_dot_product = TILEATTN_BF16_DOT_PRODUCT != 0;
#elif TILEATTN_AVX512_HAS_BF16 && !defined(__AMX_BF16__)
inline constexpr bool bf16_dot_product = true;
#else
inline constexpr bool bf16_dot_product = false;
#endif

#include "tileattn/arch/avx512/gemm.hpp"
#include "tileattn/arch/avx512/softmax_rows.hpp"
#include "tileattn/arch/avx512/conversions.hpp"
#include "tileattn/arch/avx512/pair_layout.hpp"
#include "tileattn/arch/avx512/rows_in_place.hpp"
#include "tileattn/arch/avx512/pairs_in_place.hpp"
#include "tileattn/arch/avx512/dropout_bits.hpp"

}  // namespace tileattn::arch::TILEATTN_AVX512_SET
