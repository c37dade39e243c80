// tileattn/arch/intrinsics.hpp: <immintrin.h>, with GCC 12's false -Wuninitialized and
// -Wmaybe-uninitialized silenced at their source. GCC 12's avx512fintrin.h builds the
// _mm512_undefined_* placeholders of many intrinsics (_mm512_max_ps, _mm512_shuffle_f32x4,
// ...) as `__m512 __Y = __Y;`, and once those are inlined into a kernel the middle end
// reports that line, thousands of times a build (GCC bug 105593; GCC 13's headers wrap the
// placeholders in the same pragmas). A diagnostic is classified by the pragmas in force at
// its own location, the header's line, so ignoring the two warnings around this one
// inclusion silences exactly those reports and nothing in tileattn's code. Every tileattn
// header and test that needs the intrinsics includes this one, first.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
