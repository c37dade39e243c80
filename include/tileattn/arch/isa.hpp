// tileattn/arch/isa.hpp: which instruction sets a translation unit compiles its micro-kernels
// for, and which of them this CPU runs, decided once per process.
//
// On x86-64, two ways to build (arch/native.hpp):
//   - Fixed: the TU's target flags enable AVX2 + FMA or AVX-512F (-march=native, haswell,
//     x86-64-v3, -mavx2 -mfma, ...): arch::native is the set those flags select, at compile
//     time, as before run-time dispatch existed.
//   - Dispatched (TILEATTN_ARCH_X86_DISPATCH == 1): an x86-64 TU built by GCC or Clang without
//     them (no -march, x86-64-v2, a distro's flags). The avx2 and avx512 sets are then
//     compiled anyway, each under its own target pragma (TILEATTN_TARGET_*_BEGIN / END
//     below), and arch::native calls the best one this CPU has (arch::cpu_isa()).
// On AArch64 Linux with GCC the sets are always dispatched (TILEATTN_ARCH_ARM_DISPATCH == 1):
// NEON is every AArch64 CPU's baseline; the BF16 and SVE copies are compiled under their
// target pragmas whatever -march says, and the auxiliary vector's HWCAP bits pick one.
// TILEATTN_ARCH_DISPATCH is 1 for either. TILEATTN_ARCH_GENERIC forces the portable scalar
// set in every case.
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
#define TILEATTN_ARCH_X86_DISPATCH 1
#include <cpuid.h>
#else
#define TILEATTN_ARCH_X86_DISPATCH 0
#endif

// Clang's target attribute takes other names for Arm's extensions: Clang on AArch64 gets generic.
#if !defined(TILEATTN_ARCH_GENERIC) && defined(__aarch64__) && defined(__linux__) && defined(__GNUC__) && \
    !defined(__clang__)
#define TILEATTN_ARCH_ARM_DISPATCH 1
#include <sys/auxv.h>
#else
#define TILEATTN_ARCH_ARM_DISPATCH 0
#endif

#define TILEATTN_ARCH_DISPATCH (TILEATTN_ARCH_X86_DISPATCH || TILEATTN_ARCH_ARM_DISPATCH)

#if TILEATTN_ARCH_DISPATCH
// The target of each dispatched set: x86-64-v3's vector features for avx2 (what -march=haswell
// gives its kernels), x86-64-v4's for avx512, plus AVX-512 BF16 for the copy that multiplies
// bf16 pairs. Only vector ISA is named: tuning stays the build's.
#define TILEATTN_AVX2_FEATURES "avx,avx2,fma,f16c"
#define TILEATTN_AVX512_FEATURES "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl"
#define TILEATTN_AVX512_BF16_FEATURES "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx512bf16"
#define TILEATTN_AMX_FEATURES \
  "avx,avx2,fma,f16c,avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16"
// Arm: Armv8.2-A (half-precision arithmetic's base) plus the BF16 dot product (BFDOT), SVE,
// or both. NEON itself needs no pragma: every AArch64 target has it.
#define TILEATTN_NEON_BF16_FEATURES "arch=armv8.2-a+bf16"
#define TILEATTN_SVE_FEATURES "arch=armv8.2-a+sve"
#define TILEATTN_SVE_BF16_FEATURES "arch=armv8.2-a+sve+bf16"
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

/// The micro-kernel sets: x86-64's slowest first, then AArch64's. avx512_bf16 multiplies bf16
/// tiles as pairs (vdpbf16ps, or AMX tiles where arch/amx_support.hpp allows them); neon_bf16
/// and sve_bf16 as pairs on BFDOT. Sets are compared by what they need (within below), not
/// by value: Arm's form no line (sve needs no BF16, neon_bf16 no SVE).
enum class Isa { generic = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, neon = 4, neon_bf16 = 5, sve = 6, sve_bf16 = 7 };

/// Every set, best first within each architecture (the order capped() prefers them in).
inline constexpr Isa all_isas[] = {Isa::avx512_bf16, Isa::avx512, Isa::avx2,  Isa::sve_bf16,
                                   Isa::sve,         Isa::neon_bf16, Isa::neon, Isa::generic};

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512_bf16: return "avx512-bf16";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::neon: return "neon";
    case Isa::neon_bf16: return "neon-bf16";
    case Isa::sve: return "sve";
    case Isa::sve_bf16: return "sve-bf16";
    case Isa::generic: return "generic";
  }
  return "generic";
}

/// The CPU features a set's instructions need, one bit each.
constexpr unsigned isa_features(Isa isa) {
  switch (isa) {
    case Isa::generic: return 0;
    case Isa::avx2: return 1;
    case Isa::avx512: return 1 | 2;
    case Isa::avx512_bf16: return 1 | 2 | 4;
    case Isa::neon: return 16;
    case Isa::neon_bf16: return 16 | 32;
    case Isa::sve: return 16 | 64;
    case Isa::sve_bf16: return 16 | 32 | 64;
  }
  return 0;
}

/// True when a CPU whose best set is `cpu` runs set `isa` (isa needs nothing cpu lacks).
constexpr bool within(Isa isa, Isa cpu) { return (isa_features(isa) & ~isa_features(cpu)) == 0; }

/// The best set within both `cap` and `cpu` (all_isas' order; generic at worst).
constexpr Isa best_within(Isa cap, Isa cpu) {
  for (Isa isa : all_isas)
    if (within(isa, cap) && within(isa, cpu)) return isa;
  return Isa::generic;
}

namespace isa_detail {
#if TILEATTN_ARCH_X86_DISPATCH
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
#if TILEATTN_ARCH_X86_DISPATCH
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
#elif TILEATTN_ARCH_ARM_DISPATCH
  // The kernel's HWCAP bits (asm/hwcap.h): HWCAP_SVE (bit 22) and HWCAP2_BF16 (bit 14) for
  // BFDOT in NEON, HWCAP2_SVEBF16 (bit 12) for it in SVE. tests/arch/arm_dispatch_test.cpp
  // checks the reading against the instructions themselves.
  const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  const bool sve = (hwcap >> 22 & 1u) != 0, bf16 = (hwcap2 >> 14 & 1u) != 0, sve_bf16 = (hwcap2 >> 12 & 1u) != 0;
  if (sve) return bf16 && sve_bf16 ? Isa::sve_bf16 : Isa::sve;
  return bf16 ? Isa::neon_bf16 : Isa::neon;
#else
  return Isa::generic;
#endif
}

/// The environment's cap (TILEATTN_ISA=generic|avx2|avx512|avx512-bf16|neon|neon-bf16|sve|
/// sve-bf16), or the CPU's set: the best set within both (sve-bf16 on a CPU with SVE but no
/// BF16 runs sve; neon-bf16 there runs neon).
inline Isa capped(Isa cpu) {
  const char* v = std::getenv("TILEATTN_ISA");
  if (v == nullptr || *v == '\0') return cpu;
  for (Isa isa : all_isas)
    if (std::strcmp(v, isa_name(isa)) == 0) return best_within(isa, cpu);
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
  if (!within(isa, cpu_isa())) return false;
  isa_detail::selected().store(isa, std::memory_order_relaxed);
  return true;
}

}  // namespace tileattn::arch
