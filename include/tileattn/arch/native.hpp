// tileattn/arch/native.hpp: picks, at compile time, the micro-kernel set for the target
// being compiled for, as tileattn::arch::native.
//
// The choice follows the compiler's target macros, so it is whatever -march / -m flags
// the translation unit is built with:
//   __AVX512F__ and __AVX512BF16__ on x86-64 Linux
//                                -> arch::amx      (AVX-512, whose bf16 pair gemm runs on AMX
//                                                   tiles where the CPU and OS allow, checked
//                                                   once at run time, else on vdpbf16ps;
//                                                   arch/amx.hpp. TILEATTN_NO_AMX leaves it out)
//   __AVX512F__                  -> arch::avx512   (e.g. -march=skylake-avx512, znver4, native)
//   __AVX2__ and __FMA__         -> arch::avx2     (e.g. -march=haswell, znver2, -mavx2 -mfma)
//   anything else                -> arch::generic  (portable scalar C++)
// Defining TILEATTN_ARCH_GENERIC (e.g. -DTILEATTN_ARCH_GENERIC) forces generic anyway.
//
// Building for several targets. One translation unit gets exactly one arch. tileattn's
// functions are inline templates whose names do not say which arch they were compiled
// for, so never link TUs built with different -march flags into the same executable or
// shared object: the linker keeps one copy of each for all of them. Instead build the
// code that calls tileattn once per target as its own shared library, each exporting a
// differently named entry point and keeping everything else to itself:
//   F="-O3 -shared -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -Wl,-Bsymbolic"
//   g++ $F -march=x86-64-v4 -DENTRY=attn_v4 attn.cpp -o libattn_v4.so   # AVX-512F: avx512
//   g++ $F -march=x86-64-v3 -DENTRY=attn_v3 attn.cpp -o libattn_v3.so   # AVX2 + FMA: avx2
//   g++ $F -march=x86-64    -DENTRY=attn_v1 attn.cpp -o libattn_v1.so   # generic
// where attn.cpp defines extern "C" __attribute__((visibility("default"))) ENTRY(...)
// calling tileattn::forward. -Bsymbolic binds each library's own copies of inline code
// (std:: templates included) to itself, so the three can be linked into one program, or
// dlopen()ed, and the caller picks one with __builtin_cpu_supports("avx512f"), else
// ("avx2") && ("fma"), else generic. (Checked: each reports its own native::name and the
// three outputs agree to 1e-7.)
//
// tileattn::arch::native::name says which one a TU got.
#pragma once

#include "tileattn/arch/generic.hpp"

#if !defined(TILEATTN_ARCH_GENERIC) && defined(__AVX512F__)
#include "tileattn/arch/amx.hpp"
#include "tileattn/arch/avx512.hpp"
#if defined(TILEATTN_HAS_AMX_KERNELS)
namespace tileattn::arch {
namespace native = amx;
}  // namespace tileattn::arch
#else
namespace tileattn::arch {
namespace native = avx512;
}  // namespace tileattn::arch
#endif
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
