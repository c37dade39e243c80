// tileattn/arch/native.hpp: tileattn::arch::native, the micro-kernel set the kernels call.
//
// Fixed at compile time when the translation unit's target flags enable AVX2 + FMA or
// AVX-512F (-march=native, x86-64-v3, haswell, znver4, -mavx2 -mfma, ...): the set follows
// the compiler's target macros, as it always has:
//   __AVX512F__ and __AVX512BF16__ on x86-64 Linux
//                                -> arch::amx      (AVX-512, whose bf16 pair gemm runs on AMX
//                                                   tiles where the CPU and OS allow, checked
//                                                   once at run time, else on vdpbf16ps;
//                                                   arch/amx.hpp. TILEATTN_NO_AMX leaves it out)
//   __AVX512F__                  -> arch::avx512   (e.g. -march=skylake-avx512, znver4, native)
//   __AVX2__ and __FMA__         -> arch::avx2     (e.g. -march=haswell, znver2, -mavx2 -mfma)
//
// Chosen at run time, once per process, when they do not and the TU is x86-64 built by GCC
// or Clang (no -march: a distro package, a Python extension, CMake without flags):
// arch::native is arch::dispatch, whose functions call the best set this CPU has
// (arch/isa.hpp: CPUID and XCR0, read once), each compiled for its own target under a
// pragma:
//   AVX-512 F/CD/BW/DQ/VL and BF16 -> amx (as above: AMX tiles where usable), or avx512
//   AVX-512 F/CD/BW/DQ/VL          -> avx512_no_bf16 (x86-64-v4's set)
//   AVX2, FMA and F16C             -> avx2
//   anything else                  -> generic
// On a given CPU a dispatched build runs the same micro-kernels, with the same operand
// layouts (bf16 pair tiles where the set multiplies pairs), as a build with that CPU's
// -march, so its results are the same bits (tests/arch/dispatch_test.cpp checks it against
// a -march=native copy). The environment variable TILEATTN_ISA (generic, avx2, avx512,
// avx512-bf16) read at the first call caps the choice, and arch::select_isa() changes it
// between calls (tests, benchmarks). The dispatch is per tile operation (one gemm, one
// softmax pass over a tile), so its cost, a relaxed load and a switch, is lost in the work.
//
// On AArch64 Linux with GCC, always chosen at run time the same way (HWCAP bits, read once;
// TILEATTN_ISA caps with neon, neon-bf16, sve or sve-bf16):
//   SVE and BF16 (SVE's BFDOT too)  -> sve_bf16   (arch/sve.hpp: vector-length agnostic)
//   SVE                             -> sve
//   BF16                            -> neon_bf16  (arch/neon.hpp: bf16 pairs on BFDOT)
//   anything else (NEON is baseline)-> neon
//
// Anything else (another architecture or compiler), or TILEATTN_ARCH_GENERIC defined:
//   -> arch::generic (portable scalar C++)
//
// Do not link TUs built with different -march flags (a dispatched one included) into the
// same executable or shared object: tileattn's functions are inline templates whose names do
// not say which target they were compiled for, so the linker keeps one copy of each for all
// of them, and a copy built for AVX-512 may then run on a CPU without it. With run-time
// dispatch one build serves every x86-64 CPU, so there is no need to.
//
// arch::native_name() (and tileattn::active_isa(), tileattn/active_isa.hpp) says which set
// runs; arch::native::name, in a fixed build, which one the TU got.
#pragma once

#include <type_traits>

#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/isa.hpp"
#include "tileattn/arch/micro_kernel_set.hpp"

#if !defined(TILEATTN_ARCH_GENERIC) && (defined(__AVX512F__) || TILEATTN_ARCH_X86_DISPATCH)
#include "tileattn/arch/amx.hpp"
#include "tileattn/arch/avx512.hpp"
#endif
#if !defined(TILEATTN_ARCH_GENERIC) && ((defined(__AVX2__) && defined(__FMA__)) || TILEATTN_ARCH_X86_DISPATCH)
#include "tileattn/arch/avx2.hpp"
#endif
#if TILEATTN_ARCH_ARM_DISPATCH
#include "tileattn/arch/neon.hpp"
#include "tileattn/arch/sve.hpp"
#endif

#if TILEATTN_ARCH_DISPATCH

namespace tileattn::arch {

namespace dispatch {
#if TILEATTN_ARCH_X86_DISPATCH
#if defined(TILEATTN_HAS_AMX_KERNELS)
namespace with_bf16 = amx;
#else
namespace with_bf16 = avx512;
#endif

/// The set's function f, called with the arguments that follow, for the set this process runs.
#define TILEATTN_DISPATCH(...)                                                          \
  switch (::tileattn::arch::dispatched_isa()) {                                         \
    case ::tileattn::arch::Isa::avx512_bf16: return with_bf16::__VA_ARGS__;              \
    case ::tileattn::arch::Isa::avx512: return avx512_no_bf16::__VA_ARGS__;              \
    case ::tileattn::arch::Isa::avx2: return avx2::__VA_ARGS__;                          \
    default: break; /* generic (the Arm sets are never dispatched here) */               \
  }                                                                                     \
  return generic::__VA_ARGS__

/// The same for the functions AVX-512 BF16 leaves unchanged (all but the pair gemm and the
/// exponential that may write pairs): both AVX-512 levels call avx512_no_bf16's, the same
/// source compiled without BF16 (so it runs on every AVX-512 CPU, and gives the bits the
/// BF16 copy would), and the heavy gemm templates are instantiated once, not twice (it cut
/// the dispatched forward TU's compile time by a fifth).
#define TILEATTN_DISPATCH_BF16_FREE(...)                                                \
  switch (::tileattn::arch::dispatched_isa()) {                                         \
    case ::tileattn::arch::Isa::avx512_bf16:                                            \
    case ::tileattn::arch::Isa::avx512: return avx512_no_bf16::__VA_ARGS__;              \
    case ::tileattn::arch::Isa::avx2: return avx2::__VA_ARGS__;                          \
    default: break; /* generic (the Arm sets are never dispatched here) */               \
  }                                                                                     \
  return generic::__VA_ARGS__

/// The running set's name ("avx512-bf16+amx" where its pairs run on AMX tiles).
inline const char* name() {
  const Isa isa = dispatched_isa();
#if defined(TILEATTN_HAS_AMX_KERNELS)
  if (isa == Isa::avx512_bf16 && amx::tiles_in_use()) return "avx512-bf16+amx";
#endif
  return isa_name(isa);
}

/// Whether bf16 tiles are multiplied as bf16 pairs: a run-time answer here, where the fixed
/// sets give a constant (kernels choose the operand layout by it: kernels/operands.hpp).
inline bool bf16_dot_product() { return dispatched_isa() == Isa::avx512_bf16 && with_bf16::bf16_dot_product; }

/// Whether a decode step's in-place products multiply bf16 pairs (arch/generic.hpp), and
/// from how many query rows per K/V group.
inline bool in_place_pairs() {
  return dispatched_isa() == Isa::avx512_bf16 && set_detail::value(with_bf16::in_place_pairs);
}
inline index_t in_place_pairs_min_rows() {
  return dispatched_isa() == Isa::avx512_bf16 ? set_detail::value(with_bf16::in_place_pairs_min_rows) : 1;
}
#else  // TILEATTN_ARCH_ARM_DISPATCH

/// The set's function f, called with the arguments that follow, for the set this process runs.
#define TILEATTN_DISPATCH(...)                                                          \
  switch (::tileattn::arch::dispatched_isa()) {                                         \
    case ::tileattn::arch::Isa::sve_bf16: return sve_bf16::__VA_ARGS__;                  \
    case ::tileattn::arch::Isa::sve: return sve::__VA_ARGS__;                            \
    case ::tileattn::arch::Isa::neon_bf16: return neon_bf16::__VA_ARGS__;                \
    case ::tileattn::arch::Isa::neon: return neon::__VA_ARGS__;                          \
    default: break;                                                                     \
  }                                                                                     \
  return generic::__VA_ARGS__

/// The same for the functions BF16 leaves unchanged: the BF16-free copy of the same set.
#define TILEATTN_DISPATCH_BF16_FREE(...)                                                \
  switch (::tileattn::arch::dispatched_isa()) {                                         \
    case ::tileattn::arch::Isa::sve_bf16:                                               \
    case ::tileattn::arch::Isa::sve: return sve::__VA_ARGS__;                            \
    case ::tileattn::arch::Isa::neon_bf16:                                              \
    case ::tileattn::arch::Isa::neon: return neon::__VA_ARGS__;                          \
    default: break;                                                                     \
  }                                                                                     \
  return generic::__VA_ARGS__

/// The running set's name.
inline const char* name() { return isa_name(dispatched_isa()); }

/// Whether bf16 tiles are multiplied as bf16 pairs (BFDOT): a run-time answer.
inline bool bf16_dot_product() {
  const Isa isa = dispatched_isa();
  return isa == Isa::neon_bf16 || isa == Isa::sve_bf16;
}
/// The decode step's in-place products stay on float rows (generic's pairs are scalar).
inline bool in_place_pairs() { return false; }
inline index_t in_place_pairs_min_rows() { return 1; }
#endif

template <bool Accumulate, bool TransA = false, class E>
void gemm(index_t m, index_t n, index_t k, const E* a, index_t lda, const E* b, index_t ldb, float* c,
          index_t ldc) {
  if constexpr (std::is_same_v<E, bf16x2>) {
    TILEATTN_DISPATCH(gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc));
  } else {
    TILEATTN_DISPATCH_BF16_FREE(gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc));
  }
}
template <class E>
void gemm_nt_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
                  index_t ldc) {
  TILEATTN_DISPATCH_BF16_FREE(gemm_nt_rows(m, n, k, a, lda, b_rows, c, ldc));
}
template <class E>
void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda, const E* const* b_rows, float* c,
               index_t ldc) {
  TILEATTN_DISPATCH_BF16_FREE(gemm_rows(m, n, k, a, lda, b_rows, c, ldc));
}
inline void gemm_nt_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                               const bf16* const* b_rows, float* c, index_t ldc) {
  TILEATTN_DISPATCH(gemm_nt_rows_pairs(m, n, k, a, lda, b_rows, c, ldc));
}
inline void gemm_rows_pairs(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,
                            const bf16* const* b_rows, float* c, index_t ldc) {
  TILEATTN_DISPATCH(gemm_rows_pairs(m, n, k, a, lda, b_rows, c, ldc));
}
inline void touch_rows(const void* const* rows, index_t n, index_t bytes) {
  TILEATTN_DISPATCH_BF16_FREE(touch_rows(rows, n, bytes));
}
inline float row_max(const float* x, index_t n) { TILEATTN_DISPATCH_BF16_FREE(row_max(x, n)); }
inline void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n, const float* scale,
                                const float* shift, float* sums, bf16x2* pairs = nullptr, index_t ld_pairs = 0) {
  TILEATTN_DISPATCH(exp2_shift_sum_rows(x, ld, rows, n, scale, shift, sums, pairs, ld_pairs));
}
inline float exp2_shift_sum(float* x, index_t n, float scale, float shift) {
  TILEATTN_DISPATCH_BF16_FREE(exp2_shift_sum(x, n, scale, shift));
}
template <class E>
bool all_finite(const E* x, index_t n) {
  TILEATTN_DISPATCH_BF16_FREE(all_finite(x, n));
}
inline void scale(float* x, index_t n, float factor) { TILEATTN_DISPATCH_BF16_FREE(scale(x, n, factor)); }
inline float exp2(float x) { TILEATTN_DISPATCH_BF16_FREE(exp2(x)); }
inline float mul_add(float a, float b, float c) { TILEATTN_DISPATCH_BF16_FREE(mul_add(a, b, c)); }
inline void add_alibi_bias(float* x, index_t n, float slope, index_t diagonal) {
  TILEATTN_DISPATCH_BF16_FREE(add_alibi_bias(x, n, slope, diagonal));
}
inline void transpose(index_t rows, index_t cols, const float* src, index_t lds, float* dst, index_t ldd) {
  TILEATTN_DISPATCH_BF16_FREE(transpose(rows, cols, src, lds, dst, ldd));
}
template <class E>
void to_float(const E* src, float* dst, index_t n) {
  TILEATTN_DISPATCH_BF16_FREE(to_float(src, dst, n));
}
template <class Half>
void from_float(const float* src, Half* dst, index_t n) {
  TILEATTN_DISPATCH_BF16_FREE(from_float(src, dst, n));
}
inline void interleave_pairs(const bf16* a, const bf16* b, bf16x2* dst, index_t n) {
  TILEATTN_DISPATCH_BF16_FREE(interleave_pairs(a, b, dst, n));
}
inline void interleave_rounded(const float* a, const float* b, bf16x2* dst, index_t n) {
  TILEATTN_DISPATCH_BF16_FREE(interleave_rounded(a, b, dst, n));
}
inline void round_to_pairs(const float* x, bf16x2* dst, index_t n) { TILEATTN_DISPATCH_BF16_FREE(round_to_pairs(x, dst, n)); }
template <class B>
void dequantize_blocks(const B* src, float* dst, index_t blocks) {
  TILEATTN_DISPATCH_BF16_FREE(dequantize_blocks(src, dst, blocks));
}
inline void dropout_keep_bits(const DropoutRow* streams, index_t n, index_t first_block, index_t blocks,
                              std::uint64_t* bits, index_t ld) {
  TILEATTN_DISPATCH_BF16_FREE(dropout_keep_bits(streams, n, first_block, blocks, bits, ld));
}
inline void apply_keep_bits(float* x, index_t n, const std::uint64_t* bits, index_t bit0, float kept_scale) {
  TILEATTN_DISPATCH_BF16_FREE(apply_keep_bits(x, n, bits, bit0, kept_scale));
}
inline void apply_keep_bits(bf16x2* x, index_t n, const std::uint64_t* bits, index_t bit0) {
  TILEATTN_DISPATCH_BF16_FREE(apply_keep_bits(x, n, bits, bit0));
}
inline PreparedPairs prepare_pairs(index_t k, index_t n, const bf16x2* b, index_t ldb, bf16x2* buffer) {
  TILEATTN_DISPATCH(prepare_pairs(k, n, b, ldb, buffer));
}
template <bool Accumulate>
void gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda, const PreparedPairs& b, float* c,
                   index_t ldc) {
  TILEATTN_DISPATCH(gemm_prepared<Accumulate>(m, n, k, a, lda, b, c, ldc));
}
inline index_t product_slab_rows() { TILEATTN_DISPATCH(product_slab_rows()); }
inline index_t product_panel_keys() { TILEATTN_DISPATCH(product_panel_keys()); }
inline void begin_products() { TILEATTN_DISPATCH(begin_products()); }
inline void end_products() { TILEATTN_DISPATCH(end_products()); }

#undef TILEATTN_DISPATCH
#undef TILEATTN_DISPATCH_BF16_FREE
}  // namespace dispatch

namespace native = dispatch;

/// The set the kernels run in this process.
inline const char* native_name() { return dispatch::name(); }

}  // namespace tileattn::arch

#elif !defined(TILEATTN_ARCH_GENERIC) && defined(__AVX512F__)

namespace tileattn::arch {
#if defined(TILEATTN_HAS_AMX_KERNELS)
namespace native = amx;
#else
namespace native = avx512;
#endif
inline const char* native_name() {
#if defined(TILEATTN_HAS_AMX_KERNELS)
  if (amx::tiles_in_use()) return "avx512-bf16+amx";
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return "avx512-bf16";
#else
  return "avx512";
#endif
}
}  // namespace tileattn::arch

#elif !defined(TILEATTN_ARCH_GENERIC) && defined(__AVX2__) && defined(__FMA__)

namespace tileattn::arch {
namespace native = avx2;
inline const char* native_name() { return "avx2"; }
}  // namespace tileattn::arch

#else

namespace tileattn::arch {
namespace native = generic;
inline const char* native_name() { return "generic"; }
}  // namespace tileattn::arch

#endif

// Every set compiled into this TU keeps the contract (arch/micro_kernel_set.hpp).
namespace tileattn::arch {
TILEATTN_DEFINE_MICRO_KERNEL_SET(generic_set, generic);
static_assert(MicroKernelSet<generic_set>);
#if defined(TILEATTN_ARCH_AVX2_COMPILED)
TILEATTN_DEFINE_MICRO_KERNEL_SET(avx2_set, avx2);
static_assert(MicroKernelSet<avx2_set>);
#endif
#if defined(TILEATTN_ARCH_AVX512_COMPILED)
TILEATTN_DEFINE_MICRO_KERNEL_SET(avx512_set, avx512);
static_assert(MicroKernelSet<avx512_set>);
#endif
#if defined(TILEATTN_ARCH_AVX512_COMPILED) && TILEATTN_ARCH_X86_DISPATCH
TILEATTN_DEFINE_MICRO_KERNEL_SET(avx512_no_bf16_set, avx512_no_bf16);
static_assert(MicroKernelSet<avx512_no_bf16_set>);
#endif
#if defined(TILEATTN_HAS_AMX_KERNELS)
TILEATTN_DEFINE_MICRO_KERNEL_SET(amx_set, amx);
static_assert(MicroKernelSet<amx_set>);
#endif
#if defined(TILEATTN_ARCH_NEON_COMPILED)
TILEATTN_DEFINE_MICRO_KERNEL_SET(neon_set, neon);
static_assert(MicroKernelSet<neon_set>);
TILEATTN_DEFINE_MICRO_KERNEL_SET(neon_bf16_set, neon_bf16);
static_assert(MicroKernelSet<neon_bf16_set>);
#endif
#if defined(TILEATTN_ARCH_SVE_COMPILED)
TILEATTN_DEFINE_MICRO_KERNEL_SET(sve_set, sve);
static_assert(MicroKernelSet<sve_set>);
TILEATTN_DEFINE_MICRO_KERNEL_SET(sve_bf16_set, sve_bf16);
static_assert(MicroKernelSet<sve_bf16_set>);
#endif
TILEATTN_DEFINE_MICRO_KERNEL_SET(native_set, native);
static_assert(MicroKernelSet<native_set>);
}  // namespace tileattn::arch
