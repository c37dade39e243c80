// tileattn/arch/sve.hpp: AArch64 SVE micro-kernels, vector-length agnostic (one binary for
// 128- to 2048-bit vectors): the tile gemm (float, and bf16 pairs on BFDOT), 2^x, and the
// softmax's row operations. Same contracts as arch/generic.hpp; compiles to nothing off
// AArch64. The rest (conversions, transpose, the in-place products) is arch::neon's, which
// every SVE CPU also runs.
//
// One body, arch/sve/set.hpp, compiled twice under target pragmas (arch/isa.hpp):
//   arch::sve       Armv8.2-A + SVE; bf16 tiles are converted to float.
//   arch::sve_bf16  the same + BF16, whose gemm multiplies bf16 pairs (svbfdot).
#pragma once

#include "tileattn/arch/isa.hpp"
#include "tileattn/arch/neon.hpp"

#if TILEATTN_ARCH_ARM_DISPATCH

#define TILEATTN_ARCH_SVE_COMPILED 1

#include <arm_sve.h>

TILEATTN_TARGET_BEGIN(TILEATTN_SVE_FEATURES)
#define TILEATTN_SVE_SET sve
#define TILEATTN_SVE_HAS_BF16 0
#include "tileattn/arch/sve/set.hpp"
#undef TILEATTN_SVE_SET
#undef TILEATTN_SVE_HAS_BF16
TILEATTN_TARGET_END

TILEATTN_TARGET_BEGIN(TILEATTN_SVE_BF16_FEATURES)
#define TILEATTN_SVE_SET sve_bf16
#define TILEATTN_SVE_HAS_BF16 1
#include "tileattn/arch/sve/set.hpp"
#undef TILEATTN_SVE_SET
#undef TILEATTN_SVE_HAS_BF16
TILEATTN_TARGET_END

#endif  // TILEATTN_ARCH_ARM_DISPATCH
