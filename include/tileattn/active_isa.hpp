// tileattn/active_isa.hpp: which micro-kernel set tileattn's kernels run in this process.
//
//   #include <tileattn/active_isa.hpp>
//   std::printf("tileattn runs %s\n", tileattn::active_isa());  // e.g. "avx512-bf16"
//
// One of "avx512-bf16+amx" (AVX-512 with bf16 pair products on AMX tiles), "avx512-bf16"
// (AVX-512 with AVX-512 BF16: bf16 pair products on vdpbf16ps, unless built with
// -DTILEATTN_BF16_DOT_PRODUCT=0), "avx512", "avx2" (AVX2 + FMA) or "generic" (scalar C++).
// A build with -march flags that enable AVX2 or AVX-512 runs the set they select; a build
// without them (x86-64 GCC or Clang) runs the best set this CPU has, chosen once per process
// (docs/design.md, "Choosing the micro-kernels"). The answer is the same for every call of a
// process.
#pragma once

#include "tileattn/arch/native.hpp"

namespace tileattn {

/// The micro-kernel set tileattn's kernels run in this process (see the file comment).
inline const char* active_isa() { return arch::native_name(); }

/// True when the set was chosen at run time (a build without AVX2 / AVX-512 target flags).
inline constexpr bool isa_dispatched_at_run_time = TILEATTN_ARCH_DISPATCH != 0;

}  // namespace tileattn
