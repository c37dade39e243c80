// tileattn/arch/avx512.hpp: AVX-512F micro-kernels: register-blocked tile gemm, vector 2^x,
// row max, scale, conversions, bf16 pair layouts and products with rows read in place. Same
// contracts as arch/generic.hpp; compiles to nothing without AVX-512F.
//
// One body, compiled once per feature set: arch/avx512/set.hpp, which this file includes
// with TILEATTN_AVX512_SET naming the namespace and TILEATTN_AVX512_HAS_* the features. Built
// with AVX-512F flags it is arch::avx512 with the flags' features, as the compiler macros
// say; in a dispatched build (arch/isa.hpp) it is arch::avx512 (x86-64-v4 plus AVX-512 BF16)
// and arch::avx512_no_bf16 (x86-64-v4), each under its target pragma. The body is split by
// subject into arch/avx512/: intrinsics.hpp (GCC 12's workarounds, lane masks), gemm.hpp
// (the tile gemm over arch/register_gemm.hpp, prepared pairs), softmax_rows.hpp,
// conversions.hpp (storage types to float and back, 4-bit blocks), pair_layout.hpp
// (transpose, bf16 pairs), rows_in_place.hpp (the decode path's products over rows converted
// to float) and pairs_in_place.hpp (the same on bf16 pairs, vdpbf16ps).
#pragma once

#include "tileattn/arch/isa.hpp"

#if defined(__AVX512F__) || TILEATTN_ARCH_X86_DISPATCH
#define TILEATTN_ARCH_AVX512_COMPILED 1

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tileattn/arch/blocked_transpose.hpp"
#include "tileattn/arch/exp2.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/philox.hpp"
#include "tileattn/arch/prepared_pairs.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/types.hpp"

#if defined(__AVX512F__)  // fixed: the features the flags enable
#define TILEATTN_AVX512_SET avx512
#if defined(__AVX512BF16__)
#define TILEATTN_AVX512_HAS_BF16 1
#else
#define TILEATTN_AVX512_HAS_BF16 0
#endif
#if defined(__AVX512DQ__)
#define TILEATTN_AVX512_HAS_DQ 1
#else
#define TILEATTN_AVX512_HAS_DQ 0
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define TILEATTN_AVX512_HAS_BW_VL 1
#else
#define TILEATTN_AVX512_HAS_BW_VL 0
#endif
#include "tileattn/arch/avx512/set.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
#else  // dispatched: both copies, under their targets
#define TILEATTN_AVX512_HAS_DQ 1
#define TILEATTN_AVX512_HAS_BW_VL 1
TILEATTN_TARGET_BEGIN(TILEATTN_AVX512_BF16_FEATURES)
#define TILEATTN_AVX512_SET avx512
#define TILEATTN_AVX512_HAS_BF16 1
#include "tileattn/arch/avx512/set.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
TILEATTN_TARGET_END
TILEATTN_TARGET_BEGIN(TILEATTN_AVX512_FEATURES)
#define TILEATTN_AVX512_SET avx512_no_bf16
#define TILEATTN_AVX512_HAS_BF16 0
#include "tileattn/arch/avx512/set.hpp"
#undef TILEATTN_AVX512_SET
#undef TILEATTN_AVX512_HAS_BF16
TILEATTN_TARGET_END
#endif
#undef TILEATTN_AVX512_HAS_DQ
#undef TILEATTN_AVX512_HAS_BW_VL

#endif  // __AVX512F__ || TILEATTN_ARCH_X86_DISPATCH
