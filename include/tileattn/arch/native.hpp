// tileattn/arch/native.hpp: picks, at compile time, the micro-kernel set for the target
// being compiled for, as tileattn::arch::native.
//
// The choice follows the compiler's target macros, so it is whatever -march / -m flags
// the translation unit is built with:
//   __AVX512F__                  -> arch::avx512   (e.g. -march=skylake-avx512, znver4, native)
//   __AVX2__ and __FMA__         -> arch::avx2     (e.g. -march=haswell, znver2, -mavx2 -mfma)
//   anything else                -> arch::generic  (portable scalar C++)
// Defining TILEATTN_ARCH_GENERIC (e.g. -DTILEATTN_ARCH_GENERIC) forces generic anyway.
//
// Building for several targets. One translation unit gets exactly one arch, chosen by its
// flags. Every tileattn function is an inline template whose mangled name does not say
// which arch it was compiled for, so two TUs built with different -march flags must not
// be linked into the same binary or shared object (the linker would keep one copy of
// each, possibly the AVX-512 one, for both). Build one shared library per target instead,
// each exporting a differently named entry point and built with -fvisibility=hidden:
//   g++ -O3 -march=x86-64-v4 -fvisibility=hidden -shared -fPIC attn.cpp -DENTRY=attn_v4 -o libattn_v4.so
//   g++ -O3 -march=x86-64-v3 -fvisibility=hidden -shared -fPIC attn.cpp -DENTRY=attn_v3 -o libattn_v3.so
//   g++ -O3 -march=x86-64    -fvisibility=hidden -shared -fPIC attn.cpp -DENTRY=attn_v1 -o libattn_v1.so
// (x86-64-v4 has AVX-512F, v3 has AVX2 + FMA), and pick one at run time with
// __builtin_cpu_supports("avx512f"), or ("avx2") && ("fma"), then dlopen it (or link all
// three: hidden visibility keeps their inline copies apart).
// tileattn::arch::native::name says which one a TU got.
#pragma once

#include "tileattn/arch/generic.hpp"

#if !defined(TILEATTN_ARCH_GENERIC) && defined(__AVX512F__)
#include "tileattn/arch/avx512.hpp"
namespace tileattn::arch {
namespace native = avx512;
}  // namespace tileattn::arch
#elif !defined(TILEATTN_ARCH_GENERIC) && defined(__AVX2__) && defined(__FMA__)
#include "tileattn/arch/avx2.hpp"
namespace tileattn::arch {
namespace native = avx2;
}  // namespace tileattn::arch
#else
namespace tileattn::arch {
namespace native = generic;
}  // namespace tileattn::arch
#endif
