// tests/arch/half_kernels_test.cpp: the 16-bit storage micro-kernels of every arch compiled
// into this TU (generic, AVX2, AVX-512): to_float / from_float for bf16 and fp16 against the
// scalar conversions of core/half_types.hpp, the bf16 pair gemm against generic (bitwise)
// and against double, interleave_pairs / round_to_pairs / all_finite over bf16 pairs, and
// exp2_shift_sum_rows writing its probabilities as bf16 pairs.
//
// Built several times with different target flags (tests/arch/CMakeLists.txt), like
// micro_kernels_test.cpp, so AVX2 (with F16C) runs even on an AVX-512 machine. Inputs are
// placed flush against an inaccessible page where the platform allows it, so a tail that
// reads past the end of its input crashes the test; outputs have guards on both sides.
#include <gtest/gtest.h>
#include <cstdlib>
#include <memory>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define TILEATTN_TEST_GUARD_PAGES 1
#endif

#include "tileattn/arch/avx2.hpp"
#include "tileattn/arch/avx512.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/arch/neon.hpp"
#include "tileattn/arch/sve.hpp"
#include "tileattn/core/half_types.hpp"

namespace tileattn::arch {
namespace {

// ---- The arches under test, as types ---------------------------------------------------

// Namespaces cannot be template arguments: each arch gets a struct of forwarding functions.
// dot_product_instruction: its pair gemm runs on vdpbf16ps or BFDOT (whatever bf16_dot_product
// says), which treat subnormal inputs as zero and flush subnormal results. rounds_to_odd: it
// runs on Arm's BFDOT, which adds a pair's products first and rounds to odd (error up to a
// unit in the last place, not half), so its sums are not generic's bits. runs: whether this
// CPU runs the set (the Arm sets are compiled into every AArch64 build).
#define TILEATTN_HALF_ARCH_UNDER_TEST(Struct, ns, dot_product_instruction, rounds_to_odd, runs) \
  struct Struct {                                                                              \
    static const char* name() { return ns::name; }                                            \
    static bool runs_here() { return runs; }                                                   \
    static constexpr bool flushes_subnormals_in_gemm = dot_product_instruction;                \
    static constexpr bool has_dot_product_instruction = dot_product_instruction;               \
    static constexpr bool gemm_rounds_to_odd = rounds_to_odd;                                  \
    static void to_float(const bf16* src, float* dst, index_t n) { ns::to_float(src, dst, n); } \
    static void to_float(const fp16* src, float* dst, index_t n) { ns::to_float(src, dst, n); } \
    static void from_float(const float* src, bf16* dst, index_t n) { ns::from_float(src, dst, n); } \
    static void from_float(const float* src, fp16* dst, index_t n) { ns::from_float(src, dst, n); } \
    template <bool Accumulate, bool TransA = false>                                            \
    static void gemm(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,            \
                     const bf16x2* b, index_t ldb, float* c, index_t ldc) {                    \
      ns::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);                           \
    }                                                                                          \
    static void interleave_rounded(const float* a, const float* b, bf16x2* dst, index_t n) {   \
      ns::interleave_rounded(a, b, dst, n);                                                    \
    }                                                                                          \
    static void interleave_pairs(const bf16* a, const bf16* b, bf16x2* dst, index_t n) {       \
      ns::interleave_pairs(a, b, dst, n);                                                      \
    }                                                                                          \
    static void round_to_pairs(const float* x, bf16x2* dst, index_t n) {                       \
      ns::round_to_pairs(x, dst, n);                                                           \
    }                                                                                          \
    static bool all_finite(const bf16x2* x, index_t n) { return ns::all_finite(x, n); }       \
    static arch::PreparedPairs prepare_pairs(index_t k, index_t n, const bf16x2* b, index_t ldb, \
                                             bf16x2* buffer) {                                 \
      return ns::prepare_pairs(k, n, b, ldb, buffer);                                          \
    }                                                                                          \
    template <bool Accumulate>                                                                 \
    static void gemm_prepared(index_t m, index_t n, index_t k, const bf16x2* a, index_t lda,   \
                              const arch::PreparedPairs& b, float* c, index_t ldc) {           \
      ns::gemm_prepared<Accumulate>(m, n, k, a, lda, b, c, ldc);                               \
    }                                                                                          \
    static void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n,             \
                                    const float* scale, const float* shift, float* sums,       \
                                    bf16x2* pairs, index_t ld_pairs) {                         \
      if (pairs)                                                                               \
        ns::exp2_shift_sum_rows(x, ld, rows, n, scale, shift, sums, pairs, ld_pairs);          \
      else                                                                                     \
        ns::exp2_shift_sum_rows(x, ld, rows, n, scale, shift, sums);                           \
    }                                                                                          \
  };

TILEATTN_HALF_ARCH_UNDER_TEST(Generic, generic, false, false, true)
#if defined(__AVX2__) && defined(__FMA__)
TILEATTN_HALF_ARCH_UNDER_TEST(Avx2, avx2, false, false, true)
#endif
#if defined(__AVX512F__)
#if defined(__AVX512BF16__)
TILEATTN_HALF_ARCH_UNDER_TEST(Avx512, avx512, true, false, true)
#else
TILEATTN_HALF_ARCH_UNDER_TEST(Avx512, avx512, false, false, true)
#endif
#endif
#if defined(TILEATTN_ARCH_NEON_COMPILED)
TILEATTN_HALF_ARCH_UNDER_TEST(Neon, neon, false, false, true)
TILEATTN_HALF_ARCH_UNDER_TEST(NeonBf16, neon_bf16, true, true, within(Isa::neon_bf16, cpu_isa()))
#endif
#if defined(TILEATTN_ARCH_SVE_COMPILED)
TILEATTN_HALF_ARCH_UNDER_TEST(Sve, sve, false, false, within(Isa::sve, cpu_isa()))
TILEATTN_HALF_ARCH_UNDER_TEST(SveBf16, sve_bf16, true, true, within(Isa::sve_bf16, cpu_isa()))
#endif

using Arches = ::testing::Types<Generic
#if defined(__AVX2__) && defined(__FMA__)
                                ,
                                Avx2
#endif
#if defined(__AVX512F__)
                                ,
                                Avx512
#endif
#if defined(TILEATTN_ARCH_NEON_COMPILED)
                                ,
                                Neon, NeonBf16
#endif
#if defined(TILEATTN_ARCH_SVE_COMPILED)
                                ,
                                Sve, SveBf16
#endif
                                >;

struct ArchName {
  template <class Arch>
  static std::string GetName(int) {
    std::string name = Arch::name();
    for (char& c : name)
      if (c == '-') c = '_';  // '-' would start a negative pattern in --gtest_filter
    return name;
  }
};

template <class Arch>
class HalfKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Arch::runs_here()) GTEST_SKIP() << Arch::name() << ": not on this CPU (" << isa_name(cpu_isa()) << ")";
  }
};
TYPED_TEST_SUITE(HalfKernels, Arches, ArchName);

// ---- Helpers -----------------------------------------------------------------------------

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
std::uint32_t bits_of(bf16 x) { return x.bits; }
std::uint32_t bits_of(fp16 x) { return x.bits; }
std::uint32_t bits_of(bf16x2 x) { return std::bit_cast<std::uint32_t>(x); }

template <class T>
T guard_value();
template <>
float guard_value<float>() { return -7.25e7f; }
template <>
bf16 guard_value<bf16>() { return bf16::from_bits(0x5a5b); }
template <>
fp16 guard_value<fp16>() { return fp16::from_bits(0x5a5b); }
template <>
bf16x2 guard_value<bf16x2>() { return {bf16::from_bits(0x1357), bf16::from_bits(0x2468)}; }

/// An output of up to `capacity` elements, starting `offset` elements past a 64-byte
/// boundary, with guard values on both sides (and in whatever part the call should not
/// write).
template <class T>
struct Guarded {
  static constexpr std::size_t margin = 64;  // guard elements before and after
  std::vector<T> storage;
  T* data = nullptr;

  explicit Guarded(std::size_t capacity, std::size_t offset = 0) {
    storage.assign(capacity + offset + 2 * margin + 64 / sizeof(T), guard_value<T>());
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t misalign = (64 - address % 64) % 64 / sizeof(T);
    data = storage.data() + misalign + margin + offset;
  }
  /// -1 when every element outside [data + from, data + to) still holds its guard, else the
  /// offset (relative to data) of the first one that does not.
  std::ptrdiff_t first_overwritten_guard(std::ptrdiff_t from, std::ptrdiff_t to) const {
    for (std::size_t i = 0; i < storage.size(); ++i) {
      const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(i) - (data - storage.data());
      if (at >= from && at < to) continue;
      if (bits_of(storage[i]) != bits_of(guard_value<T>())) return at;
    }
    return -1;
  }
};

/// Memory for inputs that ends at an inaccessible page (where mmap exists): an array placed
/// with `at_end(n)` is followed by the guard page, so reading one element past it faults.
template <class T>
class EndsAtGuardPage {
 public:
  explicit EndsAtGuardPage(std::size_t capacity) {
#if defined(TILEATTN_TEST_GUARD_PAGES)
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    usable_ = (capacity * sizeof(T) + page_ - 1) / page_ * page_;
    void* p = mmap(nullptr, usable_ + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<unsigned char*>(p);
    mprotect(base_ + usable_, page_, PROT_NONE);
#else
    fallback_.resize(capacity + 64);
    base_ = reinterpret_cast<unsigned char*>(fallback_.data());
    usable_ = capacity * sizeof(T);
#endif
  }
  ~EndsAtGuardPage() {
#if defined(TILEATTN_TEST_GUARD_PAGES)
    munmap(base_, usable_ + page_);
#endif
  }
  EndsAtGuardPage(const EndsAtGuardPage&) = delete;
  EndsAtGuardPage& operator=(const EndsAtGuardPage&) = delete;

  /// n elements ending `gap` elements before the guard page.
  T* at_end(std::size_t n, std::size_t gap = 0) {
    return reinterpret_cast<T*>(base_ + usable_) - n - gap;
  }

 private:
  unsigned char* base_ = nullptr;
  std::size_t usable_ = 0;
#if defined(TILEATTN_TEST_GUARD_PAGES)
  std::size_t page_ = 0;
#else
  std::vector<T> fallback_;
#endif
};

template <class Half>
const char* half_name() {
  return std::is_same_v<Half, bf16> ? "bf16" : "fp16";
}

/// The named values where the roundings change behaviour.
std::vector<float> special_floats() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  return {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(),
                          std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffbfffffu),
                          std::bit_cast<float>(0x7fc12345u), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                          std::bit_cast<float>(0x7f7f8000u),  // bf16 tie at the top: rounds to Inf
                          std::bit_cast<float>(0x7f7f7fffu),  // just below: stays finite
                          std::bit_cast<float>(0x007fffffu),  // largest subnormal: bf16 rounds to 2^-126
                          65504.0f, 65519.996f, 65520.0f, -65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f,
                          0x1p-25f, -0x1p-25f, std::nextafter(0x1p-25f, 1.0f), 0x3p-25f, 0x1.8p-24f,
                          1.0f, -1.0f, 1.00390625f /* bf16 tie, even */, 1.01171875f /* tie, odd */};
}

/// `count` floats that exercise every branch of both roundings, shuffled: random bit patterns
/// (NaN, Inf, subnormals and huge values included), exact ties and near-ties of bf16 and of
/// fp16 (normal and subnormal fp16 results), float subnormals, values around FLT_MAX and
/// around fp16's overflow threshold 65520, and special_floats().
std::vector<float> conversion_inputs(std::size_t count, std::uint32_t seed) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = special_floats();
  const std::size_t pool = std::max(count, 2 * x.size());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ordinary(-100.0f, 100.0f), near_max(65000.0f, 70000.0f);
  while (x.size() < pool) {
    const std::uint32_t r = rng(), sign = rng() & 0x80000000u;
    float v = 0.0f;
    switch (x.size() % 10) {
      case 0: v = std::bit_cast<float>(r); break;  // anything
      case 1: v = std::bit_cast<float>((r & 0xffff0000u) | 0x8000u); break;  // bf16 tie
      case 2: v = std::bit_cast<float>((r & 0xffff0000u) | (r % 2 ? 0x7fffu : 0x8001u)); break;
      case 3: {  // fp16 tie or near-tie in the normal range: exponent 2^-14 .. 2^15
        const std::uint32_t exponent = 113 + r % 30;
        const std::uint32_t low = (r >> 8) % 3 == 0 ? 0x1000u : (r >> 8) % 3 == 1 ? 0x0fffu : 0x1001u;
        v = std::bit_cast<float>(sign | exponent << 23 | ((r << 5) & 0x7fe000u) | low);
        break;
      }
      case 4: {  // fp16 subnormal range: exact ties (odd multiples of 2^-25) and neighbours
        const float tie = std::ldexp(static_cast<float>(2 * (r % 1024) + 1), -25);
        const int nudge = static_cast<int>((r >> 12) % 3) - 1;
        v = nudge == 0 ? tie : std::nextafter(tie, nudge * inf);
        if (sign) v = -v;
        break;
      }
      case 5: v = std::bit_cast<float>(sign | (r & 0x007fffffu)); break;  // float subnormal
      case 6: v = std::bit_cast<float>(sign | 0x7f000000u | (r & 0x00ffffffu)); break;  // huge
      case 7: v = sign ? -near_max(rng) : near_max(rng); break;
      case 8: v = std::bit_cast<float>(sign | (100u + r % 30) << 23 | (r & 0x7fffffu)); break;  // tiny
      default: v = ordinary(rng); break;
    }
    x.push_back(v);
  }
  std::shuffle(x.begin(), x.end(), rng);  // the specials anywhere, also in short rows
  x.resize(count);
  return x;
}

/// got == the scalar value; NaN only needs to be a NaN of the same sign.
bool same_or_both_nan(float got, float expected) {
  if (std::isnan(expected)) return std::isnan(got) && std::signbit(got) == std::signbit(expected);
  return bits_of(got) == bits_of(expected);
}

template <class Half>
bool same_half_or_both_nan(Half got, Half expected) {
  return same_or_both_nan(static_cast<float>(got), static_cast<float>(expected)) &&
         (std::isnan(static_cast<float>(expected)) || got.bits == expected.bits);
}

std::string hex(std::uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", bits);
  return text;
}

// ---- to_float / from_float ------------------------------------------------------------

/// Arch::to_float over `in` (n values) into an output starting `out_offset` past a
/// 64-byte boundary; the input ends `gap` elements before a guard page. Checks each value
/// against the scalar conversion (bitwise; fp16 NaN: a NaN of the same sign, as F16C quiets
/// signalling NaNs) and that no guard was written.
template <class Arch, class Half>
void check_to_float(const std::vector<Half>& in, std::size_t out_offset, std::size_t gap) {
  const std::size_t n = in.size();
  EndsAtGuardPage<Half> memory(n + gap);
  Half* src = memory.at_end(n, gap);
  std::copy(in.begin(), in.end(), src);
  Guarded<float> out(n, out_offset);
  Arch::to_float(src, out.data, static_cast<index_t>(n));
  const std::string what = std::string(Arch::name()) + " to_float(" + half_name<Half>() +
                           ") n=" + std::to_string(n) + " offset=" + std::to_string(out_offset);
  for (std::size_t j = 0; j < n; ++j) {
    const float expected = tileattn::to_float(in[j]);
    const bool ok = std::is_same_v<Half, fp16> ? same_or_both_nan(out.data[j], expected)
                                               : bits_of(out.data[j]) == bits_of(expected);
    ASSERT_TRUE(ok) << what << " at " << j << ": input " << hex(in[j].bits) << " gave "
                    << hex(bits_of(out.data[j])) << ", expected " << hex(bits_of(expected));
  }
  const std::ptrdiff_t bad = out.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(n));
  ASSERT_EQ(bad, -1) << what << ": wrote outside the output";
}

template <class Arch, class Half>
void check_from_float(const std::vector<float>& in, std::size_t out_offset, std::size_t gap) {
  const std::size_t n = in.size();
  EndsAtGuardPage<float> memory(n + gap);
  float* src = memory.at_end(n, gap);
  std::copy(in.begin(), in.end(), src);
  Guarded<Half> out(n, out_offset);
  Arch::from_float(src, out.data, static_cast<index_t>(n));
  const std::string what = std::string(Arch::name()) + " from_float(" + half_name<Half>() +
                           ") n=" + std::to_string(n) + " offset=" + std::to_string(out_offset);
  for (std::size_t j = 0; j < n; ++j) {
    const Half expected(in[j]);
    ASSERT_TRUE(same_half_or_both_nan(out.data[j], expected))
        << what << " at " << j << ": input " << hex(bits_of(in[j])) << " (" << in[j] << ") gave "
        << hex(out.data[j].bits) << ", expected " << hex(expected.bits);
  }
  const std::ptrdiff_t bad = out.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(n));
  ASSERT_EQ(bad, -1) << what << ": wrote outside the output";
}

template <class Arch, class Half>
void check_to_float_everywhere() {
  // Every bit pattern in one call, twice: output aligned and not.
  std::vector<Half> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) all[b] = Half::from_bits(static_cast<std::uint16_t>(b));
  check_to_float<Arch, Half>(all, 0, 0);
  check_to_float<Arch, Half>(all, 3, 1);
  // Every length up to 70 (all tails of 8 and 16 lanes, twice over), random patterns,
  // unaligned input ends and output starts.
  std::mt19937 rng(101);
  for (std::size_t n = 0; n <= 70; ++n)
    for (std::size_t offset : {0, 1, 2, 5}) {
      std::vector<Half> in(n);
      for (Half& h : in) h = Half::from_bits(static_cast<std::uint16_t>(rng()));
      check_to_float<Arch, Half>(in, offset, (n + offset) % 3);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

template <class Arch, class Half>
void check_from_float_everywhere() {
  check_from_float<Arch, Half>(conversion_inputs(200003, 7), 0, 0);
  check_from_float<Arch, Half>(conversion_inputs(4099, 8), 7, 1);
  for (std::size_t n = 0; n <= 70; ++n)
    for (std::size_t offset : {0, 1, 2, 5}) {
      check_from_float<Arch, Half>(conversion_inputs(n, static_cast<std::uint32_t>(1000 + 4 * n + offset)),
                                   offset, (n + offset) % 3);
      if (::testing::Test::HasFatalFailure()) return;
    }
  // The specials again at every position of a short row (every lane of a tail).
  const std::vector<float> specials = special_floats();
  for (std::size_t n : {std::size_t{17}, std::size_t{36}, std::size_t{41}}) {
    std::vector<float> in(n);
    for (std::size_t shift = 0; shift < specials.size(); ++shift) {
      for (std::size_t j = 0; j < n; ++j) in[j] = specials[(j + shift) % specials.size()];
      check_from_float<Arch, Half>(in, shift % 4, 0);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TYPED_TEST(HalfKernels, Bf16ToFloatIsExactForEveryBitPattern) { check_to_float_everywhere<TypeParam, bf16>(); }
TYPED_TEST(HalfKernels, Fp16ToFloatIsExactForEveryBitPattern) { check_to_float_everywhere<TypeParam, fp16>(); }
TYPED_TEST(HalfKernels, FloatToBf16MatchesTheScalarRounding) { check_from_float_everywhere<TypeParam, bf16>(); }
TYPED_TEST(HalfKernels, FloatToFp16MatchesTheScalarRounding) { check_from_float_everywhere<TypeParam, fp16>(); }

// ---- gemm over bf16 pairs ---------------------------------------------------------------

/// A random bf16 that is neither tiny nor huge: |x| in [2^-8, 2^5), random sign and mantissa.
bf16 moderate_bf16(std::mt19937& rng) {
  const std::uint32_t r = rng();
  const std::uint32_t exponent = 127 - 8 + r % 13;
  return bf16::from_bits(static_cast<std::uint16_t>((r >> 16 & 0x8000u) | exponent << 7 | (r >> 8 & 0x7fu)));
}

/// A random bf16 from 2^-133 (subnormal bf16) to 2^13: products of two range from float
/// subnormals (and zero) to normal values.
bf16 tiny_bf16(std::mt19937& rng) {
  const std::uint32_t r = rng();
  const std::uint32_t exponent = r % 141;  // 0: a bf16 subnormal (or zero)
  return bf16::from_bits(static_cast<std::uint16_t>((r >> 16 & 0x8000u) | exponent << 7 | (r >> 8 & 0x7fu)));
}

/// moderate: no subnormal input, product or sum anywhere (results must be bitwise generic's);
/// tiny: subnormal bf16 inputs, products and starting values of C.
enum class Values { moderate, tiny };

bf16x2 random_pair(std::mt19937& rng, Values values) {
  if (values == Values::moderate) return {moderate_bf16(rng), moderate_bf16(rng)};
  return {tiny_bf16(rng), tiny_bf16(rng)};
}

constexpr double smallest_normal_float = 0x1p-126;

/// What flushing subnormals to zero can lose on a term (DAZ on an input, FTZ on a product).
double flushable(bf16 x, bf16 y, double product) {
  const auto subnormal = [](bf16 h) { return (h.bits & 0x7f80) == 0 && (h.bits & 0x7f) != 0; };
  return subnormal(x) || subnormal(y) || std::fabs(product) < smallest_normal_float ? std::fabs(product) : 0.0;
}

/// Padding of A and B holds Inf and NaN: a kernel that read it into a result would show.
constexpr bf16x2 poison_pair = {bf16::from_bits(0x7f80), bf16::from_bits(0xffc1)};

struct PairGemmCase {
  index_t m, n, k;  // C is m x n; k counts pairs
  index_t pad;      // extra elements per row of A, B and C
};

std::string describe(const PairGemmCase& g, bool accumulate) {
  return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " pad=" + std::to_string(g.pad) + (accumulate ? " accumulate" : " overwrite");
}

constexpr double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;

/// Arch's pair gemm equals generic's bitwise (not on BFDOT: gemm_rounds_to_odd), is within the error bound of 2k + 1 float
/// additions of the product computed in double, and writes nothing outside the m x n result.
/// With tiny values, an arch with a bf16 dot-product instruction (which treats subnormal
/// inputs as zero and flushes subnormal results: vdpbf16ps) is only held to that bound
/// widened by what flushing can lose: every term that is or has a subnormal, a subnormal
/// starting value, and 2^-126 per addition.
template <class Arch, bool Accumulate>
void check_pair_gemm(const PairGemmCase& g, std::mt19937& rng, Values values = Values::moderate) {
  const index_t lda = g.k + g.pad, ldb = g.n + g.pad, ldc = g.n + g.pad;
  std::vector<bf16x2> a(static_cast<std::size_t>(g.m * lda + 1), poison_pair);
  std::vector<bf16x2> b(static_cast<std::size_t>(g.k * ldb + 1), poison_pair);
  for (index_t i = 0; i < g.m; ++i)
    for (index_t p = 0; p < g.k; ++p) a[static_cast<std::size_t>(i * lda + p)] = random_pair(rng, values);
  for (index_t p = 0; p < g.k; ++p)
    for (index_t j = 0; j < g.n; ++j) b[static_cast<std::size_t>(p * ldb + j)] = random_pair(rng, values);
  const std::size_t c_size = static_cast<std::size_t>(g.m * ldc);
  Guarded<float> c(c_size, static_cast<std::size_t>(g.pad % 5)), c_generic(c_size);
  std::uniform_real_distribution<float> start(-4.0f, 4.0f);
  const auto start_value = [&] {
    if (values == Values::moderate) return start(rng);
    const std::uint32_t r = rng();  // a float subnormal, or a normal from 2^-126 to 2^-100
    return std::bit_cast<float>((r & 0x807fffffu) | (r % 2 ? (1u + r % 27) << 23 : 0u));
  };
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j)  // overwrite mode must ignore what C held
      c.data[i * ldc + j] = c_generic.data[i * ldc + j] = Accumulate ? start_value() : 3.0e30f;
  std::vector<float> c0(c.data, c.data + c_size);

  Arch::template gemm<Accumulate>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data, ldc);
  generic::gemm<Accumulate>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c_generic.data, ldc);

  const std::string what = std::string(Arch::name()) + " " + describe(g, Accumulate);
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j = 0; j < g.n; ++j) {
      const float got = c.data[i * ldc + j];
      if ((values == Values::moderate || !Arch::flushes_subnormals_in_gemm) && !Arch::gemm_rounds_to_odd) {
        ASSERT_EQ(bits_of(got), bits_of(c_generic.data[i * ldc + j]))
            << what << " vs generic at (" << i << ", " << j << "): " << got << " vs "
            << c_generic.data[i * ldc + j];
      }
      double exact = Accumulate ? c0[static_cast<std::size_t>(i * ldc + j)] : 0.0;
      double magnitude = std::fabs(exact);
      double flushed = std::fabs(exact) < smallest_normal_float ? std::fabs(exact) : 0.0;
      for (index_t p = 0; p < g.k; ++p) {
        const bf16x2 x = a[static_cast<std::size_t>(i * lda + p)], y = b[static_cast<std::size_t>(p * ldb + j)];
        const double hi = static_cast<double>(to_float(x.hi)) * to_float(y.hi);
        const double lo = static_cast<double>(to_float(x.lo)) * to_float(y.lo);
        exact += hi + lo;
        magnitude += std::fabs(hi) + std::fabs(lo);
        flushed += flushable(x.hi, y.hi, hi) + flushable(x.lo, y.lo, lo);
      }
      // Round to odd: up to a unit in the last place per rounding, twice round to nearest's.
      double bound = static_cast<double>(2 * g.k + 1) * unit_roundoff * magnitude * (Arch::gemm_rounds_to_odd ? 2 : 1);
      if (values == Values::tiny)  // generic rounds subnormal products and sums: half a step each
        bound += Arch::flushes_subnormals_in_gemm ? flushed + static_cast<double>(2 * g.k + 1) * smallest_normal_float
                                        : static_cast<double>(4 * g.k + 1) * 0x1p-150;
      ASSERT_LE(std::fabs(got - exact), bound)
          << what << (values == Values::tiny ? " (tiny values)" : "") << " vs double at (" << i << ", " << j
          << "): got " << got << ", exact " << exact << ", generic " << c_generic.data[i * ldc + j];
    }
  }
  // Guards: the padding at the end of each row, and everything before and after C.
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = g.n; j < ldc; ++j)
      ASSERT_EQ(bits_of(c.data[i * ldc + j]), bits_of(guard_value<float>()))
          << what << ": wrote padding at (" << i << ", " << j << ")";
  ASSERT_EQ(c.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(c_size)), -1)
      << what << ": wrote outside C";
}

TYPED_TEST(HalfKernels, PairGemmWithTransposedAEqualsTheProductWithACopyBitwise) {
  std::mt19937 rng(12);
  for (const PairGemmCase g : {PairGemmCase{256, 128, 32, 0}, PairGemmCase{37, 50, 19, 3}, PairGemmCase{9, 16, 1, 1},
                               PairGemmCase{130, 64, 33, 5}}) {
    const index_t ld_t = g.m + g.pad, lda = g.k + g.pad, ldb = g.n + g.pad;
    std::vector<bf16x2> a_t(static_cast<std::size_t>(g.k * ld_t)), a(static_cast<std::size_t>(g.m * lda));
    std::vector<bf16x2> b(static_cast<std::size_t>(g.k * ldb));
    for (auto& x : a_t) x = random_pair(rng, Values::moderate);
    for (auto& x : b) x = random_pair(rng, Values::moderate);
    for (index_t i = 0; i < g.m; ++i)
      for (index_t p = 0; p < g.k; ++p) a[static_cast<std::size_t>(i * lda + p)] = a_t[static_cast<std::size_t>(p * ld_t + i)];
    std::vector<float> c(static_cast<std::size_t>(g.m * ldb), 0.5f), c_copy = c;
    TypeParam::template gemm<true, true>(g.m, g.n, g.k, a_t.data(), ld_t, b.data(), ldb, c.data(), ldb);
    TypeParam::template gemm<true>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c_copy.data(), ldb);
    for (std::size_t e = 0; e < c.size(); ++e) ASSERT_EQ(bits_of(c[e]), bits_of(c_copy[e])) << describe(g, true);
  }
}

TYPED_TEST(HalfKernels, InterleaveRoundedMatchesScalarRounding) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (index_t n : {1, 15, 16, 17, 64, 100}) {
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = normal(rng), b[i] = normal(rng);
    a[0] = 1.0f + 0x1p-8f;  // a tie: rounds to even
    std::vector<bf16x2> got(a.size()), got_single(a.size());
    TypeParam::interleave_rounded(a.data(), b.data(), got.data(), n);
    TypeParam::interleave_rounded(a.data(), nullptr, got_single.data(), n);
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(got[i].lo.bits, bf16(a[i]).bits) << n << " " << i;
      ASSERT_EQ(got[i].hi.bits, bf16(b[i]).bits) << n << " " << i;
      ASSERT_EQ(got_single[i].hi.bits, 0) << n << " " << i;
    }
  }
}

TYPED_TEST(HalfKernels, PairGemmMatchesGenericBitwiseOnAwkwardShapes) {
  std::vector<index_t> ms, ns, ks;
  for (index_t m = 1; m <= 20; ++m) ms.push_back(m);
  ms.push_back(37);  // packs B (>= 24 rows) with a row tail
  for (index_t n = 1; n <= 50; ++n) ns.push_back(n);
  ns.push_back(97);
  for (index_t k = 1; k <= 9; ++k) ks.push_back(k);
  ks.push_back(64);
  ks.push_back(130);  // more than one packed depth block (128)
  std::mt19937 rng(20260314);
  std::size_t count = 0;
  for (index_t m : ms)
    for (index_t n : ns)
      for (index_t k : ks) {
        const PairGemmCase g{m, n, k, static_cast<index_t>(count++ % 4 == 0 ? 0 : 1 + count % 7)};
        check_pair_gemm<TypeParam, false>(g, rng);
        check_pair_gemm<TypeParam, true>(g, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

/// B prepared once (arch/prepared_pairs.hpp) serves the products of every leading part of it
/// (a slab that sees only a panel's first keys: fewer columns of K^T, fewer pairs of V) with
/// the bits of the gemm on that part of B itself.
TYPED_TEST(HalfKernels, PreparedPairGemmGivesTheGemmsBitsForEveryLeadingPart) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  const auto pair = [&] {
    bf16x2 p;
    p.lo = bf16(nd(rng));
    p.hi = bf16(nd(rng));
    return p;
  };
  struct Shape {
    index_t k, n;
  };
  for (const Shape full : {Shape{64, 512}, Shape{256, 128}, Shape{5, 17}, Shape{33, 100}, Shape{16, 64}}) {
    const index_t ldb = full.n + 3;
    std::vector<bf16x2> b(static_cast<std::size_t>(full.k * ldb));
    for (auto& x : b) x = pair();
    const auto capacity = static_cast<std::size_t>(arch::prepared_pairs_capacity(full.k, full.n));
    std::unique_ptr<bf16x2[], decltype(&std::free)> buffer(
        static_cast<bf16x2*>(std::aligned_alloc(64, capacity * sizeof(bf16x2))), &std::free);
    const arch::PreparedPairs prepared = TypeParam::prepare_pairs(full.k, full.n, b.data(), ldb, buffer.get());
    for (const Shape part : {full, Shape{full.k, std::max<index_t>(1, full.n / 2)}, Shape{std::max<index_t>(1, full.k / 2), full.n},
                             Shape{std::min<index_t>(16, full.k), std::min<index_t>(32, full.n)}, Shape{1, 1},
                             Shape{full.k, std::min<index_t>(64, full.n)}, Shape{full.k, std::min<index_t>(96, full.n)}})
      for (const index_t m : {1, 7, 64}) {
        SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(part.n) + " x " + std::to_string(part.k) + " of " +
                     std::to_string(full.k) + " x " + std::to_string(full.n));
        const index_t lda = part.k + 1, ldc = part.n + 2;
        std::vector<bf16x2> a(static_cast<std::size_t>(m * lda));
        for (auto& x : a) x = pair();
        std::vector<float> want(static_cast<std::size_t>(m * ldc));
        for (auto& x : want) x = nd(rng);
        std::vector<float> got = want;
        TypeParam::template gemm<true>(m, part.n, part.k, a.data(), lda, b.data(), ldb, want.data(), ldc);
        TypeParam::template gemm_prepared<true>(m, part.n, part.k, a.data(), lda, prepared, got.data(), ldc);
        for (std::size_t e = 0; e < got.size(); ++e)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[e]), std::bit_cast<std::uint32_t>(want[e])) << "element " << e;
      }
  }
}

TYPED_TEST(HalfKernels, PairGemmOfEmptyShapes) {
  std::mt19937 rng(3);
  for (const PairGemmCase g : {PairGemmCase{0, 5, 3, 2}, PairGemmCase{4, 0, 3, 2}, PairGemmCase{3, 17, 0, 2},
                               PairGemmCase{0, 0, 0, 1}}) {
    check_pair_gemm<TypeParam, false>(g, rng);  // k = 0: zeros
    check_pair_gemm<TypeParam, true>(g, rng);   // k = 0: C unchanged
  }
}

/// Subnormal bf16 inputs, subnormal products and subnormal starting values of C: bitwise
/// generic's where the arch forwards to it; with vdpbf16ps (DAZ and FTZ, whatever MXCSR says)
/// within what flushing can lose (check_pair_gemm).
TYPED_TEST(HalfKernels, PairGemmWithSubnormalsWithinTheFlushToZeroBound) {
  std::mt19937 rng(4242);
  for (index_t m : {1, 3, 8, 9, 25})
    for (index_t n : {1, 15, 16, 17, 40, 49})
      for (index_t k : {1, 2, 7, 33}) {
        const PairGemmCase g{m, n, k, (m + n + k) % 3};
        check_pair_gemm<TypeParam, false>(g, rng, Values::tiny);
        check_pair_gemm<TypeParam, true>(g, rng, Values::tiny);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

/// The attention shapes: S = Q K^T at d = 64 and 128 (k = d / 2 pairs), O += P V (k = Bc / 2).
TYPED_TEST(HalfKernels, PairGemmOnAttentionTiles) {
  std::mt19937 rng(77);
  for (const PairGemmCase g : {PairGemmCase{64, 128, 32, 0}, PairGemmCase{128, 64, 64, 0},
                               PairGemmCase{32, 128, 256, 0}, PairGemmCase{40, 80, 40, 16}}) {
    check_pair_gemm<TypeParam, false>(g, rng);
    check_pair_gemm<TypeParam, true>(g, rng);
  }
}

// ---- interleave_pairs / round_to_pairs / all_finite over pairs ---------------------------

const std::size_t pair_lengths[] = {0,  1,  2,  3,  5,  7,  8,  9,  15, 16, 17, 23, 31, 32, 33, 34,
                                    35, 47, 48, 49, 63, 64, 65, 66, 67, 69, 70, 1001, 4099};

TYPED_TEST(HalfKernels, InterleavePairsMatchesTheDefinition) {
  std::mt19937 rng(31);
  for (std::size_t n : pair_lengths)
    for (bool with_b : {true, false})
      for (std::size_t offset : {0, 1, 3}) {
        EndsAtGuardPage<bf16> a_memory(n + 1), b_memory(n + 1);
        bf16* a = a_memory.at_end(n, offset % 2);
        bf16* b = b_memory.at_end(n, 1 - offset % 2);
        for (std::size_t c = 0; c < n; ++c) {
          a[c] = bf16::from_bits(static_cast<std::uint16_t>(rng()));
          b[c] = bf16::from_bits(static_cast<std::uint16_t>(rng()));
        }
        Guarded<bf16x2> dst(n, offset);
        TypeParam::interleave_pairs(a, with_b ? b : nullptr, dst.data, static_cast<index_t>(n));
        const std::string what = "n=" + std::to_string(n) + (with_b ? "" : " b=nullptr") +
                                 " offset=" + std::to_string(offset);
        for (std::size_t c = 0; c < n; ++c) {
          ASSERT_EQ(dst.data[c].lo.bits, a[c].bits) << what << " lo at " << c;
          ASSERT_EQ(dst.data[c].hi.bits, with_b ? b[c].bits : 0) << what << " hi at " << c;
        }
        ASSERT_EQ(dst.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(n)), -1) << what;
      }
}

TYPED_TEST(HalfKernels, RoundToPairsMatchesTheScalarRounding) {
  for (std::size_t n : pair_lengths)
    for (std::size_t offset : {0, 1, 2}) {
      const std::vector<float> in = conversion_inputs(n, static_cast<std::uint32_t>(n * 3 + offset));
      EndsAtGuardPage<float> memory(n + 1);
      float* x = memory.at_end(n, offset % 2);
      std::copy(in.begin(), in.end(), x);
      const std::size_t pairs = (n + 1) / 2;
      Guarded<bf16x2> dst(pairs, offset);  // the pad half starts as a guard: it must be written
      TypeParam::round_to_pairs(x, dst.data, static_cast<index_t>(n));
      const std::string what = "n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      for (std::size_t j = 0; j < n; ++j) {
        const bf16 got = j % 2 ? dst.data[j / 2].hi : dst.data[j / 2].lo;
        ASSERT_TRUE(same_half_or_both_nan(got, bf16(in[j])))
            << what << " at " << j << ": input " << hex(bits_of(in[j])) << " gave " << hex(got.bits)
            << ", expected " << hex(bf16(in[j]).bits);
      }
      if (n % 2) {
        ASSERT_EQ(dst.data[n / 2].hi.bits, 0) << what << ": the odd length's pad";
      }
      ASSERT_EQ(dst.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(pairs)), -1) << what;
    }
}

TYPED_TEST(HalfKernels, AllFinitePairsFindsEveryInfAndNaN) {
  const std::uint16_t bad[] = {0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81 /* signalling */, 0x7fff, 0xffff};
  std::mt19937 rng(41);
  for (std::size_t n : pair_lengths) {
    if (n > 1001) continue;
    // Finite values of every kind: largest finite (0x7f7f), subnormals, zeros, random.
    std::vector<bf16x2> values(n);
    for (std::size_t j = 0; j < n; ++j) {
      std::uint16_t h[2];
      for (std::uint16_t& v : h) {
        v = static_cast<std::uint16_t>(rng());
        if ((v & 0x7f80) == 0x7f80) v = static_cast<std::uint16_t>(v & 0xff7f);  // make it finite
      }
      if (j % 5 == 0) h[j % 2] = 0x7f7f;
      if (j % 7 == 0) h[1 - j % 2] = 0x807f;
      values[j] = {bf16::from_bits(h[0]), bf16::from_bits(h[1])};
    }
    EndsAtGuardPage<bf16x2> memory(n);
    bf16x2* x = memory.at_end(n);  // flush against the guard page: a read past the end faults
    std::copy(values.begin(), values.end(), x);
    EXPECT_TRUE(TypeParam::all_finite(x, static_cast<index_t>(n))) << "n=" << n;
    // A non-finite pair just past the end must not count.
    std::vector<bf16x2> longer(values);
    longer.push_back(poison_pair);
    EXPECT_TRUE(TypeParam::all_finite(longer.data(), static_cast<index_t>(n))) << "n=" << n << ", Inf after the end";
    EXPECT_TRUE(TypeParam::all_finite(x, 0));
    std::vector<std::size_t> positions;  // every one in short rows; a spread and the last in long
    for (std::size_t at = 0; at < n; at += n > 80 ? 13 : 1) positions.push_back(at);
    if (n > 0) positions.push_back(n - 1);
    for (std::size_t at : positions)
      for (int half = 0; half < 2; ++half)
        for (std::uint16_t value : bad) {
          const bf16x2 kept = x[at];
          (half ? x[at].hi : x[at].lo) = bf16::from_bits(value);
          ASSERT_FALSE(TypeParam::all_finite(x, static_cast<index_t>(n)))
              << "n=" << n << " at " << at << (half ? " hi" : " lo") << " = " << hex(value);
          x[at] = kept;
        }
  }
}

// ---- exp2_shift_sum_rows writing bf16 pairs --------------------------------------------

constexpr float smallest_normal = 0x1p-126f;

/// Rows of random scores (some -inf, some whose 2^ results are subnormal or zero), run once
/// without pairs and once with: the pairs are the no-pairs results rounded to bf16 (results
/// below 2^-126: 0 or that rounding), the sums are the same bits, an odd n's pad is zero, and
/// nothing is written between rows' pairs or after the last. generic and avx2 also write x.
/// With pairs, avx512 computes 2^x with a degree-4 polynomial (exp2_poly::bf16_target: relative
/// error 3.0e-6, for values rounded to bf16 right away; results below 2^-126 are +0), so its
/// sums and values may differ from the float path's by that much: a value may round to the
/// neighbouring bf16 only when it lies that close to a rounding boundary.
constexpr double pairs_relative_error = 4e-6;

bool close_to_rounding(bf16 got, float value) {
  const double half_ulp = std::ldexp(1.0, std::ilogb(value) - 8);  // bf16: 8 significant bits
  return std::abs(static_cast<double>(to_float(got)) - value) <= half_ulp + pairs_relative_error * value;
}

template <class Arch>
void check_exp2_pairs(index_t rows, index_t n, std::mt19937& rng) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const index_t ld = n + 3, half_n = (n + 1) / 2, ld_pairs = half_n + 2 + n % 3;
  std::vector<float> scale(static_cast<std::size_t>(rows)), shift(scale);
  std::vector<float> x(static_cast<std::size_t>(rows * ld), 1e30f);
  std::uniform_real_distribution<float> argument(-170.0f, 0.0f), chance(0.0f, 1.0f);
  const float scales[] = {1.0f, 0.18033688f, 2.5f, 0.0625f};
  for (index_t r = 0; r < rows; ++r) {
    scale[static_cast<std::size_t>(r)] = scales[r % 4];
    shift[static_cast<std::size_t>(r)] = static_cast<float>(r % 5) * 3.25f - 4.0f;
    for (index_t j = 0; j < n; ++j) {
      const float u = chance(rng);
      // Mostly scores near the row maximum (results near 1), some far below.
      const float arg = u < 0.1f ? -inf : u < 0.6f ? argument(rng) / 8.0f : argument(rng);
      x[static_cast<std::size_t>(r * ld + j)] =
          std::isinf(arg) ? arg : (arg + shift[static_cast<std::size_t>(r)]) / scale[static_cast<std::size_t>(r)];
    }
  }
  std::vector<float> x_plain(x), x_pairs(x);
  std::vector<float> sums_plain(static_cast<std::size_t>(rows) + 1, -1.0f), sums_pairs(sums_plain);
  Arch::exp2_shift_sum_rows(x_plain.data(), ld, rows, n, scale.data(), shift.data(), sums_plain.data(), nullptr, 0);
  const std::size_t pair_count = static_cast<std::size_t>(rows * ld_pairs);
  Guarded<bf16x2> pairs(pair_count, static_cast<std::size_t>(n % 4));
  Arch::exp2_shift_sum_rows(x_pairs.data(), ld, rows, n, scale.data(), shift.data(), sums_pairs.data(),
                            pairs.data, ld_pairs);

  const std::string what = std::string(Arch::name()) + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
  ASSERT_EQ(sums_pairs[static_cast<std::size_t>(rows)], -1.0f) << what << ": wrote past sums";
  for (index_t r = 0; r < rows; ++r) {
    const std::size_t rs = static_cast<std::size_t>(r);
    EXPECT_NEAR(sums_pairs[rs], sums_plain[rs], pairs_relative_error * sums_plain[rs])
        << what << " row " << r << ": sum with pairs " << sums_pairs[rs] << " vs without "
        << sums_plain[rs] << " (difference " << sums_pairs[rs] - sums_plain[rs] << ")";
    const bf16x2* row = pairs.data + r * ld_pairs;
    for (index_t j = 0; j < n; ++j) {
      const float value = x_plain[static_cast<std::size_t>(r * ld + j)];
      const bf16 got = j % 2 ? row[j / 2].hi : row[j / 2].lo;
      const bf16 rounded(value);
      if (value == 0.0f)
        ASSERT_EQ(got.bits, 0) << what << " row " << r << " j " << j;
      else if (value >= smallest_normal)
        ASSERT_TRUE(got.bits == rounded.bits || close_to_rounding(got, value))
            << what << " row " << r << " j " << j << ": value " << value << " gave " << to_float(got);
      else
        ASSERT_TRUE(got.bits == 0 || got.bits == rounded.bits)
            << what << " row " << r << " j " << j << ": subnormal value " << hex(bits_of(value))
            << " gave " << hex(got.bits) << ", expected 0 or " << hex(rounded.bits);
    }
    if (n % 2) {
      ASSERT_EQ(row[n / 2].hi.bits, 0) << what << " row " << r << ": the odd length's pad";
    }
    for (index_t p = half_n; p < ld_pairs; ++p)
      ASSERT_EQ(bits_of(row[p]), bits_of(guard_value<bf16x2>())) << what << " row " << r << ": wrote pair " << p;
  }
  ASSERT_EQ(pairs.first_overwritten_guard(0, static_cast<std::ptrdiff_t>(pair_count)), -1)
      << what << ": wrote outside the pairs";
  // The float results: generic and avx2 write them with pairs too (avx512 with AVX-512 BF16
  // leaves x, whether or not its bf16_dot_product picks pairs: AMX targets keep float tiles).
  if (!Arch::has_dot_product_instruction) {
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(bits_of(x_pairs[i]), bits_of(x_plain[i])) << what << ": x at " << i;
  }
  // Between rows (x's padding) nothing is written by either call.
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = n; j < ld; ++j) {
      ASSERT_EQ(x_plain[static_cast<std::size_t>(r * ld + j)], 1e30f) << what;
      ASSERT_EQ(x_pairs[static_cast<std::size_t>(r * ld + j)], 1e30f) << what;
    }
}

TYPED_TEST(HalfKernels, Exp2ShiftSumRowsWritesTheSameValuesAsBf16Pairs) {
  std::mt19937 rng(2718);
  for (index_t n = 1; n <= 70; ++n) {
    check_exp2_pairs<TypeParam>(3, n, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (index_t n : {96, 97, 127, 128, 129, 255, 256, 257, 511, 512, 1000}) {
    check_exp2_pairs<TypeParam>(5, n, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
  check_exp2_pairs<TypeParam>(0, 17, rng);
}

/// Values that round into and across the subnormal boundary, one per lane of every tail.
TYPED_TEST(HalfKernels, Exp2ShiftSumRowsPairsAroundTheSubnormalBoundary) {
  std::mt19937 rng(1414);
  for (index_t n : {5, 16, 31, 33}) {
    const index_t ld = n, ld_pairs = (n + 1) / 2;
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      std::uniform_real_distribution<float> near(-127.5f, -125.0f);
      for (float& v : x) v = near(rng);
      std::vector<float> plain(x), with_pairs(x);
      const float scale = 1.0f, shift = 0.0f;
      float sum_plain = 0.0f, sum_pairs = 0.0f;
      std::vector<bf16x2> pairs(static_cast<std::size_t>(ld_pairs) + 1, guard_value<bf16x2>());
      TypeParam::exp2_shift_sum_rows(plain.data(), ld, 1, n, &scale, &shift, &sum_plain, nullptr, 0);
      TypeParam::exp2_shift_sum_rows(with_pairs.data(), ld, 1, n, &scale, &shift, &sum_pairs, pairs.data(), ld_pairs);
      // Values below 2^-126 are in neither sum, or in both (generic's std::exp2 keeps them).
      EXPECT_NEAR(sum_pairs, sum_plain, pairs_relative_error * sum_plain) << "n=" << n;
      for (index_t j = 0; j < n; ++j) {
        const float value = plain[static_cast<std::size_t>(j)];
        const bf16 got = j % 2 ? pairs[static_cast<std::size_t>(j / 2)].hi : pairs[static_cast<std::size_t>(j / 2)].lo;
        const bf16 rounded(value);
        if (value >= smallest_normal)
          ASSERT_TRUE(got.bits == rounded.bits || close_to_rounding(got, value))
              << "n=" << n << " j=" << j << " value " << hex(bits_of(value));
        else
          ASSERT_TRUE(got.bits == 0 || got.bits == rounded.bits)
              << "n=" << n << " j=" << j << " value " << hex(bits_of(value)) << " gave " << hex(got.bits);
      }
      ASSERT_EQ(bits_of(pairs[static_cast<std::size_t>(ld_pairs)]), bits_of(guard_value<bf16x2>()));
    }
  }
}

// ---- The compile-time flags ----------------------------------------------------------

TEST(HalfArch, Bf16DotProductFollowsTheTargetMacros) {
  EXPECT_FALSE(generic::bf16_dot_product);
#if defined(__AVX2__) && defined(__FMA__)
  EXPECT_FALSE(avx2::bf16_dot_product);
#endif
#if defined(__AVX512F__)
#if defined(__AVX512BF16__) && defined(TILEATTN_BF16_DOT_PRODUCT)
  EXPECT_EQ(avx512::bf16_dot_product, TILEATTN_BF16_DOT_PRODUCT != 0);
#elif defined(__AVX512BF16__) && !defined(__AMX_BF16__)
  EXPECT_TRUE(avx512::bf16_dot_product);
#else  // no vdpbf16ps, or AMX targets: float tiles
  EXPECT_FALSE(avx512::bf16_dot_product);
#endif
#endif
#if defined(TILEATTN_ARCH_NEON_COMPILED)
  EXPECT_FALSE(neon::bf16_dot_product);
  EXPECT_TRUE(neon_bf16::bf16_dot_product);
#endif
#if defined(TILEATTN_ARCH_SVE_COMPILED)
  EXPECT_FALSE(sve::bf16_dot_product);
  EXPECT_TRUE(sve_bf16::bf16_dot_product);
#endif
#if defined(TILEATTN_ARCH_GENERIC)
  EXPECT_FALSE(native::bf16_dot_product);
#endif
  std::printf("[ native ] %s, bf16_dot_product = %d\n", native_name(), set_detail::value(native::bf16_dot_product) ? 1 : 0);
}

}  // namespace
}  // namespace tileattn::arch
