// tileattn/arch/amx_support.hpp: whether this process may run Intel AMX tile instructions
// (AMX-TILE and AMX-BF16), decided once per process at run time.
//
// Three things must hold, checked in this order:
//   1. the CPU has them: CPUID leaf 7, sub-leaf 0, EDX bits 24 (AMX-TILE) and 22 (AMX-BF16);
//   2. the OS saves tile state: OSXSAVE (CPUID leaf 1, ECX bit 27), then XCR0 bits 17
//      (XTILECFG) and 18 (XTILEDATA) read with xgetbv;
//   3. Linux lets this process use tile data: since Linux 5.16 a process must ask first,
//      arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), else its first tile instruction
//      faults (SIGILL). The permission is process-wide and inherited by threads created
//      later, so asking once serves every worker.
// The answer is a function-local static: computed by the first caller, thread-safe (C++11
// static initialisation), and the same for every call after, so every thread and every
// call of a process picks the same micro-kernels and results do not depend on which thread
// asked first. Setting the environment variable TILEATTN_NO_AMX (to anything but "0") before
// the first call turns AMX off for the process (to compare with the fallback).
//
// On anything but x86-64 Linux with a compiler that has the AMX intrinsics, available()
// is false and nothing here touches the CPU.
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#define TILEATTN_AMX_DETECTION 1
#endif

namespace tileattn::arch::amx_support {

/// The outcome of the check: usable, or the first condition that failed.
enum class Status { usable, not_x86_64_linux, disabled_by_environment, no_cpu_support, not_enabled_by_os, permission_refused };

/// Words for a Status (for logs and the tests' skip message).
inline const char* describe(Status s) {
  switch (s) {
    case Status::usable: return "AMX-TILE and AMX-BF16 usable";
    case Status::not_x86_64_linux: return "AMX detection is implemented for x86-64 Linux only";
    case Status::disabled_by_environment: return "disabled by the environment variable TILEATTN_NO_AMX";
    case Status::no_cpu_support: return "the CPU lacks AMX-TILE or AMX-BF16 (CPUID.7.0:EDX bits 24, 22)";
    case Status::not_enabled_by_os: return "the OS has not enabled tile state (XCR0 bits 17, 18)";
    case Status::permission_refused: return "Linux refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) (kernel < 5.16?)";
  }
  return "unknown";
}

namespace detail {
inline bool disabled_by_environment() {
  const char* v = std::getenv("TILEATTN_NO_AMX");
  return v != nullptr && std::strcmp(v, "0") != 0;
}

#if defined(TILEATTN_AMX_DETECTION)
inline bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  return (d >> 24 & 1u) != 0 && (d >> 22 & 1u) != 0;
}

inline bool os_saves_tile_state() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c >> 27 & 1u) == 0) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo >> 17 & 1u) != 0 && (lo >> 18 & 1u) != 0;
}

inline bool tile_data_permitted() {
  constexpr long arch_get_xcomp_perm = 0x1022, arch_req_xcomp_perm = 0x1023;
  constexpr unsigned long xfeature_xtiledata = 18;
  if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) return false;
  unsigned long permitted = 0;
  if (syscall(SYS_arch_prctl, arch_get_xcomp_perm, &permitted) != 0) return false;
  return (permitted >> xfeature_xtiledata & 1ul) != 0;
}
#endif

inline Status check() {
#if defined(TILEATTN_AMX_DETECTION)
  if (disabled_by_environment()) return Status::disabled_by_environment;
  if (!cpu_has_amx_bf16()) return Status::no_cpu_support;
  if (!os_saves_tile_state()) return Status::not_enabled_by_os;
  if (!tile_data_permitted()) return Status::permission_refused;
  return Status::usable;
#else
  return Status::not_x86_64_linux;
#endif
}
}  // namespace detail

/// The process's answer, computed once (the permission request included) on first use.
inline Status status() {
  static const Status s = detail::check();
  return s;
}

/// True when AMX tile instructions with bf16 may run in this process.
inline bool available() { return status() == Status::usable; }

}  // namespace tileattn::arch::amx_support
