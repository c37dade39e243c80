// tileattn/arch/isa.hpp: which instruction sets a translation unit compiles its micro-kernels
// for, and which of them this CPU runs, decided once per process.
//
// Two ways to build (arch/native.hpp):
//   - Fixed: the TU's target flags enable AVX2 + FMA or AVX-512F (-march=native, haswell,
//     x86-64-v3, -mavx2 -mfma, ...): arch::native is the set those flags select, at compile
//     time, as before run-time dispatch existed.
//   - Dispatched (TILEATTN_ARCH_DISPATCH == 1): an x86-64 TU built by GCC or Clang without
//     them (no -march, x86-64-v2, a distro's flags). The avx2 and avx512 sets are then
//     compiled anyway, each under its own target pragma (TILEATTN_TARGET_*_BEGIN / END
//     below), and arch::native calls the best one this CPU has (arch::cpu_isa()).
// TILEATTN_ARCH_GENERIC forces the portable scalar set in either case.
//
// Feature macros the set files test instead of the compiler's (__AVX512BF16__, ...), so that
// one source serves both ways: under GCC a target pragma defines the compiler's macros, under
// Clang it does not.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#if !defined(TILEATTN_ARCH_GENERIC) && !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__)) && \
    defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TILEATTN_ARCH_DISPATCH 1
#include <cpuid.h>
#else
#define TILEATTN_ARCH_DISPATCH 0
#endif

#if TILEATTN_ARCH_DISPATCH
// The target of each dispatched set: x86-64-v3's vector features for avx2 (what -march=haswell
// gives its kernels), x86-64-v4's for avx512, plus AVX-512 BF16 for the copy that multiplies
// bf16 pairs. Only vector ISA is named: tuning stays the build's.
#define TILEATTN_AVX2_FEATURES "avx,avx2,fma,f16c"
#define TILEATTN_AVX512_FEATURES "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl"
#define TILEATTN_AVX512_BF16_FEATURES "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx512bf16"
#define TILEATTN_AMX_FEATURES \
  "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16"
#if defined(__clang__)
#define TILEATTN_PRAGMA(x) _Pragma(#x)
#define TILEATTN_TARGET_BEGIN(features) \
  TILEATTN_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define TILEATTN_TARGET_END TILEATTN_PRAGMA(clang attribute pop)
#else
#define TILEATTN_PRAGMA(x) _Pragma(#x)
#define TILEATTN_TARGET_BEGIN(features) TILEATTN_PRAGMA(GCC push_options) TILEATTN_PRAGMA(GCC target(features))
#define TILEATTN_TARGET_END TILEATTN_PRAGMA(GCC pop_options)
#endif
#endif

namespace tileattn::arch {

/// The micro-kernel sets, slowest first. avx512_bf16 multiplies bf16 tiles as pairs
/// (vdpbf16ps, or AMX tiles where arch/amx_support.hpp allows them).
enum class Isa { generic = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512_bf16: return "avx512-bf16";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::generic: return "generic";
  }
  return "generic";
}

namespace isa_detail {
#if TILEATTN_ARCH_DISPATCH
inline unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

/// The best set the CPU and OS support: CPUID for the instructions, XCR0 for the OS saving
/// the ymm (bits 1, 2) and zmm (bits 5-7) state. The same bits GCC's __builtin_cpu_supports
/// reads (tests/arch/dispatch_test.cpp compares the two).
inline Isa detect() {
#if TILEATTN_ARCH_DISPATCH
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::generic;
  const bool osxsave = (c >> 27 & 1u) != 0, avx = (c >> 28 & 1u) != 0, fma = (c >> 12 & 1u) != 0,
             f16c = (c >> 29 & 1u) != 0;
  if (!osxsave || !avx || !fma || !f16c) return Isa::generic;
  const unsigned long long xcr = xcr0();
  if ((xcr & 0x6) != 0x6 || __get_cpuid_max(0, nullptr) < 7) return Isa::generic;
  __cpuid_count(7, 0, a, b, c, d);
  const auto bit = [](unsigned r, int i) { return (r >> i & 1u) != 0; };
  if (!bit(b, 5)) return Isa::generic;  // AVX2
  const bool avx512 = bit(b, 16) && bit(b, 17) && bit(b, 28) && bit(b, 30) && bit(b, 31) &&  // F DQ CD BW VL
                      (xcr & 0xe6) == 0xe6;
  if (!avx512) return Isa::avx2;
  __cpuid_count(7, 1, a, b, c, d);
  return bit(a, 5) ? Isa::avx512_bf16 : Isa::avx512;  // AVX512_BF16
#else
  return Isa::generic;
#endif
}

/// The environment's cap (TILEATTN_ISA=generic|avx2|avx512|avx512-bf16), or the CPU's set.
inline Isa capped(Isa cpu) {
  const char* v = std::getenv("TILEATTN_ISA");
  if (v == nullptr || *v == '\0') return cpu;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16})
    if (std::strcmp(v, isa_name(isa)) == 0) return isa < cpu ? isa : cpu;
  return cpu;
}

inline std::atomic<Isa>& selected() {
  static std::atomic<Isa> isa{capped(detect())};
  return isa;
}
}  // namespace isa_detail

/// The best micro-kernel set this CPU and OS can run (CPUID and XCR0, read once). Generic
/// where the TU was not built for dispatch (the fixed sets need no check).
inline Isa cpu_isa() {
  static const Isa isa = isa_detail::detect();
  return isa;
}

/// The set a dispatched arch::native runs: cpu_isa(), lowered by the environment variable
/// TILEATTN_ISA (read once, before the first kernel) or by select_isa().
inline Isa dispatched_isa() { return isa_detail::selected().load(std::memory_order_relaxed); }

/// Makes a dispatched arch::native run `isa` from now on (to compare sets in one process, as
/// tests and benchmarks do); returns false, changing nothing, when the CPU lacks it. Call it
/// only between kernel calls: a call that runs while it changes may mix two sets.
inline bool select_isa(Isa isa) {
  if (isa > cpu_isa()) return false;
  isa_detail::selected().store(isa, std::memory_order_relaxed);
  return true;
}

}  // namespace tileattn::arch
