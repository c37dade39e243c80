// tileattn/arch/neon.hpp: AArch64 NEON micro-kernels: register-blocked tile gemm (float, and
// bf16 pairs on BFDOT), vector 2^x, row max, scale, a register transpose and the 16-bit and
// int8 conversions. Same contracts as arch/generic.hpp; compiles to nothing off AArch64.
//
// One body, arch/neon/set.hpp, compiled twice (arch/isa.hpp: AArch64 always dispatches):
//   arch::neon       the baseline every AArch64 CPU has; bf16 tiles are converted to float.
//   arch::neon_bf16  the same under Armv8.2-A + BF16 (FEAT_BF16), whose gemm also multiplies
//                    bf16 pairs (BFDOT), so bf16 tiles stay pairs (bf16_dot_product).
// arch/sve.hpp borrows the conversions and the transpose from arch::neon.
#pragma once

#include "tileattn/arch/isa.hpp"

#if TILEATTN_ARCH_ARM_DISPATCH

#define TILEATTN_ARCH_NEON_COMPILED 1

#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tileattn/arch/blocked_transpose.hpp"
#include "tileattn/arch/exp2.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/prepared_pairs.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"

#define TILEATTN_NEON_SET neon
#define TILEATTN_NEON_HAS_BF16 0
#include "tileattn/arch/neon/set.hpp"
#undef TILEATTN_NEON_SET
#undef TILEATTN_NEON_HAS_BF16

TILEATTN_TARGET_BEGIN(TILEATTN_NEON_BF16_FEATURES)
#define TILEATTN_NEON_SET neon_bf16
#define TILEATTN_NEON_HAS_BF16 1
#include "tileattn/arch/neon/set.hpp"
#undef TILEATTN_NEON_SET
#undef TILEATTN_NEON_HAS_BF16
TILEATTN_TARGET_END

#endif  // TILEATTN_ARCH_ARM_DISPATCH
