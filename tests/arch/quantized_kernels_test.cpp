// tests/arch/quantized_kernels_test.cpp: the 8-bit storage micro-kernels (fp8_e4m3, fp8_e5m2,
// int8: core/quantized_types.hpp) of every arch compiled into this TU (generic, AVX2,
// AVX-512): to_float for every byte value, misaligned and at every tail length, against the
// scalar tileattn::to_float (bitwise; NaN codes: a NaN); all_finite with one bad value at
// each position; and the in-place products gemm_nt_rows / gemm_rows with 8-bit rows against
// generic's (bitwise: they sum in the same order) and a double-precision reference.
//
// Built several times with different target flags (tests/arch/CMakeLists.txt), like
// half_kernels_test.cpp, so AVX2 runs even on an AVX-512 machine. Inputs are placed flush
// against an inaccessible page where the platform allows it, so a tail that reads past the
// end of its input crashes the test; outputs have guards on both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
#include "tileattn/core/quantized_types.hpp"

namespace tileattn::arch {
namespace {

// ---- The arches under test, as types ---------------------------------------------------

// Namespaces cannot be template arguments: each arch gets a struct of forwarding functions.
#define TILEATTN_QUANTIZED_ARCH_UNDER_TEST(Struct, ns)                                              \
  struct Struct {                                                                                   \
    static const char* name() { return ns::name; }                                                  \
    template <class Q>                                                                              \
    static void to_float(const Q* src, float* dst, index_t n) {                                     \
      ns::to_float(src, dst, n);                                                                    \
    }                                                                                               \
    template <class Q>                                                                              \
    static bool all_finite(const Q* x, index_t n) {                                                 \
      return ns::all_finite(x, n);                                                                  \
    }                                                                                               \
    template <class Q>                                                                              \
    static void gemm_nt_rows(index_t m, index_t n, index_t k, const float* a, index_t lda,          \
                             const Q* const* b_rows, float* c, index_t ldc) {                       \
      ns::gemm_nt_rows(m, n, k, a, lda, b_rows, c, ldc);                                            \
    }                                                                                               \
    template <class Q>                                                                              \
    static void gemm_rows(index_t m, index_t n, index_t k, const float* a, index_t lda,             \
                          const Q* const* b_rows, float* c, index_t ldc) {                          \
      ns::gemm_rows(m, n, k, a, lda, b_rows, c, ldc);                                               \
    }                                                                                               \
  };

TILEATTN_QUANTIZED_ARCH_UNDER_TEST(Generic, generic)
#if defined(TILEATTN_ARCH_NEON_COMPILED)
TILEATTN_QUANTIZED_ARCH_UNDER_TEST(Neon, neon)  // (arch::sve's are these)
#endif
#if defined(__AVX2__) && defined(__FMA__)
TILEATTN_QUANTIZED_ARCH_UNDER_TEST(Avx2, avx2)
#endif
#if defined(__AVX512F__)
TILEATTN_QUANTIZED_ARCH_UNDER_TEST(Avx512, avx512)
#endif

/// (arch, 8-bit type) pairs: every test runs for each.
template <class Arch, class Q>
struct Case {
  using arch = Arch;
  using type = Q;
};

#define TILEATTN_QUANTIZED_CASES(Arch) Case<Arch, fp8_e4m3>, Case<Arch, fp8_e5m2>, Case<Arch, std::int8_t>
using Cases = ::testing::Types<TILEATTN_QUANTIZED_CASES(Generic)
#if defined(TILEATTN_ARCH_NEON_COMPILED)
                                   ,
                               TILEATTN_QUANTIZED_CASES(Neon)
#endif
#if defined(__AVX2__) && defined(__FMA__)
                                   ,
                               TILEATTN_QUANTIZED_CASES(Avx2)
#endif
#if defined(__AVX512F__)
                                   ,
                               TILEATTN_QUANTIZED_CASES(Avx512)
#endif
                               >;

struct CaseName {
  template <class C>
  static std::string GetName(int) {
    return std::string(C::arch::name()) + "_" + kv_type_name<typename C::type>();
  }
};

template <class C>
class QuantizedKernels : public ::testing::Test {};
TYPED_TEST_SUITE(QuantizedKernels, Cases, CaseName);

// ---- Helpers -----------------------------------------------------------------------------

template <class Q>
std::uint8_t byte_of(Q x) {
  return std::bit_cast<std::uint8_t>(x);
}
template <class Q>
Q from_byte(std::uint8_t b) {
  return std::bit_cast<Q>(b);
}

/// Whether byte b of type Q is Inf or NaN (from the format definitions, not the kernels).
template <class Q>
bool non_finite_byte(std::uint8_t b) {
  if constexpr (std::is_same_v<Q, fp8_e4m3>) return (b & 0x7f) == 0x7f;
  else if constexpr (std::is_same_v<Q, fp8_e5m2>) return (b & 0x7c) == 0x7c;
  else return b == 0x80;  // int8_nan
}

template <class Q>
std::vector<std::uint8_t> non_finite_bytes() {
  std::vector<std::uint8_t> bad;
  for (int b = 0; b < 256; ++b)
    if (non_finite_byte<Q>(static_cast<std::uint8_t>(b))) bad.push_back(static_cast<std::uint8_t>(b));
  return bad;
}

/// A random finite value of Q (any finite byte, uniformly).
template <class Q>
Q random_finite(std::mt19937& rng) {
  for (;;) {
    const auto b = static_cast<std::uint8_t>(rng());
    if (!non_finite_byte<Q>(b)) return from_byte<Q>(b);
  }
}

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
bool same_or_both_nan(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", v);
  return text;
}

constexpr float guard = -7.25e7f;

/// A float output of `capacity` elements, starting `offset` floats past a 64-byte boundary,
/// with guard values on both sides.
struct GuardedFloats {
  static constexpr std::size_t margin = 64;
  std::vector<float> storage;
  float* data = nullptr;
  GuardedFloats(std::size_t capacity, std::size_t offset) {
    storage.assign(capacity + offset + 2 * margin + 16, guard);
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    data = storage.data() + (64 - address % 64) % 64 / sizeof(float) + margin + offset;
  }
  /// Whether every element outside [data, data + n) still holds its guard.
  bool guards_intact(std::size_t n) const {
    for (std::size_t i = 0; i < storage.size(); ++i) {
      const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(i) - (data - storage.data());
      if (at >= 0 && at < static_cast<std::ptrdiff_t>(n)) continue;
      if (bits_of(storage[i]) != bits_of(guard)) return false;
    }
    return true;
  }
};

/// Bytes that end at an inaccessible page (where mmap exists): an array placed with
/// `at_end(n)` is followed by the guard page, so reading one element past it faults.
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
  T* at_end(std::size_t n, std::size_t gap = 0) { return reinterpret_cast<T*>(base_ + usable_) - n - gap; }

 private:
  unsigned char* base_ = nullptr;
  std::size_t usable_ = 0;
#if defined(TILEATTN_TEST_GUARD_PAGES)
  std::size_t page_ = 0;
#else
  std::vector<T> fallback_;
#endif
};

// ---- to_float ------------------------------------------------------------------------------

/// Arch::to_float over `in` placed `gap` elements before a guard page, into an output
/// `out_offset` floats past a 64-byte boundary; each value against the scalar conversion.
template <class Arch, class Q>
void check_to_float(const std::vector<Q>& in, std::size_t out_offset, std::size_t gap) {
  const std::size_t n = in.size();
  EndsAtGuardPage<Q> memory(n + gap);
  Q* src = memory.at_end(n, gap);
  std::copy(in.begin(), in.end(), src);
  GuardedFloats out(n, out_offset);
  Arch::to_float(src, out.data, static_cast<index_t>(n));
  const std::string what = std::string(Arch::name()) + " to_float(" + kv_type_name<Q>() + ") n=" + std::to_string(n) +
                           " out offset " + std::to_string(out_offset) + " gap " + std::to_string(gap);
  for (std::size_t j = 0; j < n; ++j) {
    const float want = tileattn::to_float(in[j]);
    ASSERT_TRUE(same_or_both_nan(out.data[j], want))
        << what << " at " << j << ": byte " << hex(byte_of(in[j])) << " gave " << hex(bits_of(out.data[j]))
        << ", expected " << hex(bits_of(want));
  }
  ASSERT_TRUE(out.guards_intact(n)) << what << ": wrote outside the output";
}

TYPED_TEST(QuantizedKernels, ToFloatOfEveryByteMatchesTheScalar) {
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  std::vector<Q> all(256);
  for (int b = 0; b < 256; ++b) all[static_cast<std::size_t>(b)] = from_byte<Q>(static_cast<std::uint8_t>(b));
  for (std::size_t gap : {0, 1, 5})  // misaligned input ends (and so starts)
    for (std::size_t offset : {0, 3}) {
      check_to_float<Arch>(all, offset, gap);
      if (::testing::Test::HasFatalFailure()) return;
    }
  // Every byte value at every lane: the 256 rotated by each shift, in a row of 257 (a tail of 1).
  for (std::size_t shift = 0; shift < 16; ++shift) {
    std::vector<Q> rotated(257);
    for (std::size_t j = 0; j < rotated.size(); ++j) rotated[j] = all[(j + shift) % 256];
    check_to_float<Arch>(rotated, shift % 4, shift % 3);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TYPED_TEST(QuantizedKernels, ToFloatAtEveryLengthAndAlignment) {
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  std::mt19937 rng(11);
  for (std::size_t n = 0; n <= 40; ++n)
    for (std::size_t gap : {0, 1, 2, 3, 7})
      for (std::size_t offset : {0, 1, 5}) {
        std::vector<Q> in(n);
        for (Q& x : in) x = from_byte<Q>(static_cast<std::uint8_t>(rng()));
        check_to_float<Arch>(in, offset, gap);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

// ---- all_finite ---------------------------------------------------------------------------

TYPED_TEST(QuantizedKernels, AllFiniteFindsEveryNonFiniteValueAtEveryPosition) {
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  const std::vector<std::uint8_t> bad = non_finite_bytes<Q>();
  ASSERT_FALSE(bad.empty());
  std::mt19937 rng(41);
  for (std::size_t n : {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 1000}) {
    std::vector<Q> values(n);
    for (Q& x : values) x = random_finite<Q>(rng);
    EndsAtGuardPage<Q> memory(n);
    Q* x = memory.at_end(n);  // flush against the guard page: a read past the end faults
    std::copy(values.begin(), values.end(), x);
    ASSERT_TRUE(Arch::all_finite(x, static_cast<index_t>(n))) << Arch::name() << " n " << n;
    std::vector<std::size_t> positions;  // every one in short rows; a spread and the last in long
    for (std::size_t at = 0; at < n; at += n > 200 ? 7 : 1) positions.push_back(at);
    if (n > 0) positions.push_back(n - 1);
    for (std::size_t at : positions) {
      const std::uint8_t code = bad[(at * 7 + n) % bad.size()];
      x[at] = from_byte<Q>(code);
      ASSERT_FALSE(Arch::all_finite(x, static_cast<index_t>(n)))
          << Arch::name() << " n " << n << ": missed " << hex(code) << " at " << at;
      ASSERT_TRUE(Arch::all_finite(x, static_cast<index_t>(at))) << Arch::name() << " n " << n << ": read past " << at;
      x[at] = values[at];
    }
  }
  // Every non-finite code, in a short row and in a tail.
  for (std::uint8_t code : bad)
    for (std::size_t n : {1, 19, 77}) {
      std::vector<Q> x(n, from_byte<Q>(0x01));
      x[n - 1] = from_byte<Q>(code);
      EXPECT_FALSE(Arch::all_finite(x.data(), static_cast<index_t>(n))) << hex(code) << " n " << n;
    }
  // Finite values are never flagged: every finite byte at every lane of a 256-row.
  std::vector<Q> finite;
  for (int b = 0; b < 256; ++b)
    if (!non_finite_byte<Q>(static_cast<std::uint8_t>(b))) finite.push_back(from_byte<Q>(static_cast<std::uint8_t>(b)));
  for (int turn = 0; turn < 8; ++turn) {
    std::rotate(finite.begin(), finite.begin() + 9, finite.end());
    EXPECT_TRUE(Arch::all_finite(finite.data(), static_cast<index_t>(finite.size())));
  }
}

// ---- gemm_nt_rows / gemm_rows with 8-bit rows ------------------------------------------------

/// n rows of `cols` random finite values of Q, each in its own slot of one allocation at a
/// scattered place; the pool ends at a guard page and the row in the last slot ends there too.
template <class Q>
struct ScatteredRows {
  EndsAtGuardPage<Q> memory;
  std::vector<const Q*> rows;
  ScatteredRows(index_t n, index_t cols, std::mt19937& rng)
      : memory(static_cast<std::size_t>(2 * n * (cols + 3))) {
    const index_t stride = cols + 3, slots = 2 * n;
    Q* pool = memory.at_end(static_cast<std::size_t>(slots * stride));
    for (index_t i = 0; i < slots * stride; ++i) pool[i] = random_finite<Q>(rng);
    std::vector<index_t> slot(static_cast<std::size_t>(slots));
    for (index_t i = 0; i < slots; ++i) slot[static_cast<std::size_t>(i)] = i;
    std::shuffle(slot.begin(), slot.end(), rng);
    for (index_t j = 0; j < n; ++j) {
      const index_t s = slot[static_cast<std::size_t>(j)];
      rows.push_back(pool + s * stride + (s == slots - 1 ? 3 : j % 3));
    }
  }
};

constexpr index_t awkward[] = {1, 3, 17, 128, 130};

/// Float accumulation over k terms, against the double sum: within (k + 2) units of 2^-24
/// of the sum of magnitudes.
double tolerance(index_t k, double magnitude) { return static_cast<double>(k + 2) * 0x1p-24 * magnitude + 1e-30; }

TYPED_TEST(QuantizedKernels, ScoresMatchGenericBitwiseAndDouble) {
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (index_t m : awkward)
    for (index_t n : awkward)
      for (index_t k : awkward) {
        ScatteredRows<Q> keys(n, k, rng);
        const index_t lda = k + 3, ldc = n + 2;
        std::vector<float> a(static_cast<std::size_t>(m * lda));
        for (float& x : a) x = normal(rng);
        std::vector<float> c(static_cast<std::size_t>(m * ldc), guard), want(c);
        Arch::gemm_nt_rows(m, n, k, a.data(), lda, keys.rows.data(), c.data(), ldc);
        generic::gemm_nt_rows(m, n, k, a.data(), lda, keys.rows.data(), want.data(), ldc);
        const std::string what = std::string(Arch::name()) + " m " + std::to_string(m) + " n " + std::to_string(n) +
                                 " k " + std::to_string(k);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < ldc; ++j) {
            const float got = c[static_cast<std::size_t>(i * ldc + j)];
            if (j >= n) {
              ASSERT_EQ(bits_of(got), bits_of(guard)) << what << ": wrote past column n";
              continue;
            }
#if defined(__FMA__)
            ASSERT_EQ(bits_of(got), bits_of(want[static_cast<std::size_t>(i * ldc + j)])) << what << " at " << i << ", " << j;
#endif
            double ref = 0, magnitude = 0;
            for (index_t p = 0; p < k; ++p) {
              const double term = static_cast<double>(a[static_cast<std::size_t>(i * lda + p)]) *
                                  static_cast<double>(tileattn::to_float(keys.rows[static_cast<std::size_t>(j)][p]));
              ref += term;
              magnitude += std::abs(term);
            }
            ASSERT_NEAR(got, ref, tolerance(k, magnitude)) << what << " at " << i << ", " << j;
          }
      }
}

TYPED_TEST(QuantizedKernels, ValuesMatchGenericBitwiseAndDouble) {
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (index_t m : awkward)
    for (index_t n : awkward)
      for (index_t k : awkward) {
        ScatteredRows<Q> values(k, n, rng);
        const index_t lda = k + 1, ldc = n + 3;
        std::vector<float> a(static_cast<std::size_t>(m * lda));
        for (float& x : a) x = normal(rng);
        std::vector<float> c(static_cast<std::size_t>(m * ldc));
        for (float& x : c) x = normal(rng);
        const std::vector<float> start(c);
        std::vector<float> want(c);
        Arch::gemm_rows(m, n, k, a.data(), lda, values.rows.data(), c.data(), ldc);
        generic::gemm_rows(m, n, k, a.data(), lda, values.rows.data(), want.data(), ldc);
        const std::string what = std::string(Arch::name()) + " m " + std::to_string(m) + " n " + std::to_string(n) +
                                 " k " + std::to_string(k);
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < ldc; ++j) {
            const auto at = static_cast<std::size_t>(i * ldc + j);
            if (j >= n) {
              ASSERT_EQ(bits_of(c[at]), bits_of(start[at])) << what << ": wrote past column n";
              continue;
            }
#if defined(__FMA__)
            ASSERT_EQ(bits_of(c[at]), bits_of(want[at])) << what << " at " << i << ", " << j;
#endif
            double ref = start[at], magnitude = std::abs(start[at]);
            for (index_t p = 0; p < k; ++p) {
              const double term = static_cast<double>(a[static_cast<std::size_t>(i * lda + p)]) *
                                  static_cast<double>(tileattn::to_float(values.rows[static_cast<std::size_t>(p)][j]));
              ref += term;
              magnitude += std::abs(term);
            }
            ASSERT_NEAR(c[at], ref, tolerance(k, magnitude)) << what << " at " << i << ", " << j;
          }
      }
}

TYPED_TEST(QuantizedKernels, NonFiniteStoredValuesReachTheirOutputs) {
  // One key row / one value row holding a NaN (or Inf) code: the outputs that read it are NaN
  // or Inf as in generic, and the others stay finite.
  using Arch = typename TypeParam::arch;
  using Q = typename TypeParam::type;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const index_t m = 3, n = 17, k = 33;
  for (std::uint8_t code : non_finite_bytes<Q>()) {
    ScatteredRows<Q> keys(n, k, rng), values(k, n, rng);
    const_cast<Q*>(keys.rows[5])[k - 1] = from_byte<Q>(code);
    const_cast<Q*>(values.rows[k - 1])[16] = from_byte<Q>(code);
    std::vector<float> a(static_cast<std::size_t>(m * k));
    for (float& x : a) x = normal(rng);
    std::vector<float> s(static_cast<std::size_t>(m * n)), s_want(s), o(static_cast<std::size_t>(m * n), 0.0f), o_want(o);
    Arch::gemm_nt_rows(m, n, k, a.data(), k, keys.rows.data(), s.data(), n);
    generic::gemm_nt_rows(m, n, k, a.data(), k, keys.rows.data(), s_want.data(), n);
    Arch::gemm_rows(m, n, k, a.data(), k, values.rows.data(), o.data(), n);
    generic::gemm_rows(m, n, k, a.data(), k, values.rows.data(), o_want.data(), n);
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        const auto at = static_cast<std::size_t>(i * n + j);
        EXPECT_EQ(std::isfinite(s[at]), j != 5) << hex(code) << " scores " << i << ", " << j;
        EXPECT_EQ(std::isfinite(o[at]), j != 16) << hex(code) << " values " << i << ", " << j;
        EXPECT_TRUE(same_or_both_nan(s[at], s_want[at]) || !std::isfinite(s_want[at]));
        EXPECT_TRUE(same_or_both_nan(o[at], o_want[at]) || !std::isfinite(o_want[at]));
      }
  }
}

}  // namespace
}  // namespace tileattn::arch
