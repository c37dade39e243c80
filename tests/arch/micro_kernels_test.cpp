// tests/arch/micro_kernels_test.cpp: every arch compiled into this TU (generic, AVX2,
// AVX-512) against double-precision references and against generic: gemm over awkward
// shapes, 2^x over [-150, 0] and -inf, row max with -inf, exp2_shift_sum, all_finite, scale, transpose.
//
// The same source is built several times with different target flags (tests/arch/
// CMakeLists.txt), so AVX2 runs even on an AVX-512 machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tileattn/arch/avx2.hpp"
#include "tileattn/arch/avx512.hpp"
#include "tileattn/arch/generic.hpp"
#include "tileattn/arch/native.hpp"
#include "tileattn/arch/neon.hpp"
#include "tileattn/arch/sve.hpp"

namespace tileattn::arch {
namespace {

// ---- The arches under test, as types ---------------------------------------------------

// Namespaces cannot be template arguments, so each arch namespace gets a struct of static
// forwarding functions.
// runs: whether this CPU runs the set (the Arm sets are compiled into every AArch64 build and
// skipped where the CPU lacks them; the x86 copies are built only with flags the CPU has).
#define TILEATTN_ARCH_UNDER_TEST(Struct, ns, runs)                                             \
  struct Struct {                                                                              \
    static const char* name() { return ns::name; }                                            \
    static bool runs_here() { return runs; }                                                   \
    template <bool Accumulate, bool TransA = false>                                            \
    static void gemm(index_t m, index_t n, index_t k, const float* a, index_t lda,             \
                     const float* b, index_t ldb, float* c, index_t ldc) {                     \
      ns::gemm<Accumulate, TransA>(m, n, k, a, lda, b, ldb, c, ldc);                           \
    }                                                                                          \
    static float row_max(const float* x, index_t n) { return ns::row_max(x, n); }              \
    static float exp2_shift_sum(float* x, index_t n, float scale, float shift) {               \
      return ns::exp2_shift_sum(x, n, scale, shift);                                           \
    }                                                                                          \
    static bool all_finite(const float* x, index_t n) { return ns::all_finite(x, n); }         \
    static void exp2_shift_sum_rows(float* x, index_t ld, index_t rows, index_t n, const float* scale, \
                                    const float* shift, float* sums) {                         \
      ns::exp2_shift_sum_rows(x, ld, rows, n, scale, shift, sums);                             \
    }                                                                                          \
    static void scale(float* x, index_t n, float factor) { ns::scale(x, n, factor); }          \
    static float exp2(float x) { return ns::exp2(x); }                                        \
    /* SIMD 2^x gives +0 below 2^-126 (arch/exp2.hpp); generic's std::exp2 rounds into them */ \
    static constexpr bool flushes_subnormals = std::string_view(#ns) != "generic";            \
    static void transpose(index_t rows, index_t cols, const float* src, index_t lds, float* dst, \
                          index_t ldd) {                                                       \
      ns::transpose(rows, cols, src, lds, dst, ldd);                                           \
    }                                                                                          \
  };

TILEATTN_ARCH_UNDER_TEST(Generic, generic, true)
#if defined(__AVX2__) && defined(__FMA__)
TILEATTN_ARCH_UNDER_TEST(Avx2, avx2, true)
#endif
#if defined(__AVX512F__)
TILEATTN_ARCH_UNDER_TEST(Avx512, avx512, true)
#endif
#if defined(TILEATTN_ARCH_NEON_COMPILED)
TILEATTN_ARCH_UNDER_TEST(Neon, neon, true)
TILEATTN_ARCH_UNDER_TEST(NeonBf16, neon_bf16, within(Isa::neon_bf16, cpu_isa()))
#endif
#if defined(TILEATTN_ARCH_SVE_COMPILED)
TILEATTN_ARCH_UNDER_TEST(Sve, sve, within(Isa::sve, cpu_isa()))
TILEATTN_ARCH_UNDER_TEST(SveBf16, sve_bf16, within(Isa::sve_bf16, cpu_isa()))
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
class MicroKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Arch::runs_here()) GTEST_SKIP() << Arch::name() << ": not on this CPU (" << isa_name(cpu_isa()) << ")";
  }
};
TYPED_TEST_SUITE(MicroKernels, Arches, ArchName);

// ---- Helpers -----------------------------------------------------------------------------

constexpr float guard = -7.25e7f;  // written around every output, must survive every call
constexpr double float_epsilon = std::numeric_limits<float>::epsilon() / 2;  // unit roundoff

/// A zero-padded, 64-byte-aligned float buffer with guards after the useful part.
struct Buffer {
  std::vector<float> storage;
  float* data = nullptr;
  std::size_t size = 0;

  explicit Buffer(std::size_t n, std::size_t offset_floats = 0) : size(n) {
    storage.assign(n + offset_floats + 64, guard);
    auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t misalign = (64 - address % 64) % 64 / sizeof(float);
    data = storage.data() + misalign + offset_floats;
  }
};

/// Uniform values in [-1, -0.05] u [0.05, 1]: random and never zero.
float nonzero_uniform(std::mt19937& rng) {
  std::uniform_real_distribution<float> magnitude(0.05f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  const float x = magnitude(rng);
  return negative(rng) ? -x : x;
}

/// One gemm case: M x N result from M x K and K x N, with leading dims n + pad etc.
struct GemmCase {
  index_t m, n, k;
  index_t pad;  // extra floats per row of A, B and C (leading dim > row length)
};

std::string describe(const GemmCase& g, bool accumulate) {
  return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " pad=" + std::to_string(g.pad) + (accumulate ? " accumulate" : " overwrite");
}

/// Runs Arch::gemm on random data and checks it three ways: against the product in double
/// within the standard error bound |error| <= (k + 2) u (|C0| + sum_p |a_ip| |b_pj|), against
/// generic bit for bit where this TU's generic fuses its multiply-adds (every set's gemm is one
/// fused chain over K per element: arch/register_gemm.hpp, arch/sve/set.hpp), else within
/// twice that bound, and that nothing outside the M x N result was written.
template <class Arch, bool Accumulate>
void check_gemm(const GemmCase& g, std::mt19937& rng) {
  const index_t lda = g.k + g.pad, ldb = g.n + g.pad, ldc = g.n + g.pad;
  Buffer a(static_cast<std::size_t>(g.m * lda)), b(static_cast<std::size_t>(g.k * ldb));
  Buffer c(static_cast<std::size_t>(g.m * ldc)), c_generic(c.size);
  for (index_t i = 0; i < g.m; ++i)
    for (index_t p = 0; p < g.k; ++p) a.data[i * lda + p] = nonzero_uniform(rng);
  for (index_t p = 0; p < g.k; ++p)
    for (index_t j = 0; j < g.n; ++j) b.data[p * ldb + j] = nonzero_uniform(rng);
  std::vector<float> c0(static_cast<std::size_t>(g.m * g.n));
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) {
      // Overwrite mode must ignore what C held: give it garbage-sized values.
      const float start = Accumulate ? nonzero_uniform(rng) * 4.0f : 3.0e30f;
      c0[static_cast<std::size_t>(i * g.n + j)] = start;
      c.data[i * ldc + j] = c_generic.data[i * ldc + j] = start;
    }

  Arch::template gemm<Accumulate>(g.m, g.n, g.k, a.data, lda, b.data, ldb, c.data, ldc);
  generic::gemm<Accumulate>(g.m, g.n, g.k, a.data, lda, b.data, ldb, c_generic.data, ldc);

  const std::string what = describe(g, Accumulate);
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j = 0; j < g.n; ++j) {
      double exact = Accumulate ? c0[static_cast<std::size_t>(i * g.n + j)] : 0.0;
      double magnitude = std::fabs(exact);
      for (index_t p = 0; p < g.k; ++p) {
        const double term = static_cast<double>(a.data[i * lda + p]) * b.data[p * ldb + j];
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(g.k + 2) * float_epsilon * magnitude;
      const double got = c.data[i * ldc + j];
      const double error = std::fabs(got - exact);
      ASSERT_LE(error, bound) << what << " at (" << i << ", " << j << ")";
      ASSERT_LE(std::fabs(got - c_generic.data[i * ldc + j]), 2 * bound)
          << what << " vs generic at (" << i << ", " << j << ")";
      if constexpr (generic::fused_multiply_add) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(c.data[i * ldc + j]), std::bit_cast<std::uint32_t>(c_generic.data[i * ldc + j]))
            << what << " vs generic's bits at (" << i << ", " << j << ")";
      }
    }
    for (index_t j = g.n; j < ldc; ++j)
      ASSERT_EQ(c.data[i * ldc + j], guard) << what << ": wrote padding at (" << i << ", " << j << ")";
  }
  for (index_t e = g.m * ldc; e < g.m * ldc + 32; ++e)  // Buffer keeps 64 guards after
    ASSERT_EQ(c.data[e], guard) << what << ": wrote past the last row";
}

std::vector<GemmCase> awkward_gemm_cases() {
  const index_t sizes[] = {0, 1, 15, 16, 17, 31, 33, 127, 128, 129};
  std::vector<GemmCase> cases;
  for (index_t m : sizes)
    for (index_t n : sizes)
      for (index_t k : sizes) cases.push_back({m, n, k, (m + n + k) % 2 ? 16 : 32});
  // Around the register blocks: 6 and 8 rows; 16, 32, 48 columns; attention tiles.
  for (index_t m : {5, 6, 7, 8, 9, 13})
    for (index_t n : {8, 9, 24, 40, 47, 48, 49, 64, 80, 95, 96, 97, 112})
      cases.push_back({m, n, 3, 16});
  cases.push_back({128, 512, 128, 16});  // S = Q K^T at d = 128
  cases.push_back({128, 128, 512, 16});  // O += P V at d = 128
  cases.push_back({64, 80, 200, 16});    // d = 80, a partial key tile
  cases.push_back({37, 256, 96, 16});    // d = 256
  return cases;
}

// ---- gemm -----------------------------------------------------------------------------

TYPED_TEST(MicroKernels, GemmMatchesDoubleAndGenericOnAwkwardShapes) {
  std::mt19937 rng(20261122);
  for (const GemmCase& g : awkward_gemm_cases()) {
    check_gemm<TypeParam, false>(g, rng);
    check_gemm<TypeParam, true>(g, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TYPED_TEST(MicroKernels, GemmWithUnalignedOddLeadingDimensions) {
  // The tiles guarantee aligned rows, but the micro-kernels must not rely on it.
  std::mt19937 rng(7);
  for (const GemmCase g : {GemmCase{9, 50, 7, 3}, GemmCase{17, 33, 31, 1}, GemmCase{6, 16, 5, 5},
                           GemmCase{8, 48, 2, 7}}) {
    check_gemm<TypeParam, false>(g, rng);
    check_gemm<TypeParam, true>(g, rng);
  }
}

TYPED_TEST(MicroKernels, TransposedAEqualsTheProductWithATransposedCopyBitwise) {
  // gemm<.., TransA> reads A (m x k) from its transpose (k x m): the backward's P^T dO and
  // dS^T Q. It must run the same FMA chain as the product with an explicit copy of A.
  std::mt19937 rng(11);
  for (const GemmCase g : {GemmCase{256, 128, 64, 0}, GemmCase{37, 50, 19, 3}, GemmCase{9, 16, 1, 1},
                           GemmCase{130, 64, 33, 5}, GemmCase{1, 97, 64, 2}}) {
    const index_t ld_t = g.m + g.pad, lda = g.k + g.pad, ldb = g.n + g.pad;
    std::vector<float> a_t(static_cast<std::size_t>(g.k * ld_t)), a(static_cast<std::size_t>(g.m * lda));
    std::vector<float> b(static_cast<std::size_t>(g.k * ldb)), c(static_cast<std::size_t>(g.m * ldb));
    for (float& x : a_t) x = nonzero_uniform(rng);
    for (float& x : b) x = nonzero_uniform(rng);
    for (index_t i = 0; i < g.m; ++i)
      for (index_t p = 0; p < g.k; ++p) a[static_cast<std::size_t>(i * lda + p)] = a_t[static_cast<std::size_t>(p * ld_t + i)];
    for (float& x : c) x = nonzero_uniform(rng);
    std::vector<float> c_copy = c;
    TypeParam::template gemm<true, true>(g.m, g.n, g.k, a_t.data(), ld_t, b.data(), ldb, c.data(), ldb);
    TypeParam::template gemm<true>(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c_copy.data(), ldb);
    ASSERT_EQ(0, std::memcmp(c.data(), c_copy.data(), c.size() * sizeof(float))) << describe(g, true);
  }
}

// ---- exp2 -------------------------------------------------------------------------------

/// Stated accuracy (arch/exp2.hpp): relative error <= this for normal results; generic's
/// std::exp2 is far inside it.
constexpr double exp2_relative_tolerance = 1.2e-7;
/// Subnormal results: absolute error <= one subnormal step.
constexpr double subnormal_step = 1.401298464324817e-45;  // 2^-149
constexpr double smallest_normal = 1.1754943508222875e-38;  // 2^-126

/// |got - 2^x| within the stated accuracy; returns the relative error for normal results.
/// Below 2^-126 a set that flushes them gives exactly +0.
double exp2_error(double x, float got, bool flushes_subnormals, const std::string& where) {
  const double exact = std::exp2(x);
  EXPECT_FALSE(std::isnan(got)) << where << " x=" << x;
  EXPECT_GE(got, 0.0f) << where << " x=" << x;
  if (exact >= smallest_normal) {
    const double relative = std::fabs(got - exact) / exact;
    EXPECT_LE(relative, exp2_relative_tolerance) << where << " x=" << x << " got " << got;
    return relative;
  }
  if (flushes_subnormals) EXPECT_EQ(got, 0.0f) << where << " x=" << x;
  else EXPECT_LE(std::fabs(got - exact), subnormal_step) << where << " x=" << x << " got " << got;
  return 0.0;
}

/// Inputs over the whole range the online softmax uses, [-150, 0]: a dense uniform grid,
/// random points, and the edges where the reduction or the scaling switch behaviour.
std::vector<float> exp2_inputs() {
  std::vector<float> x;
  constexpr int grid = 1 << 19;
  for (int i = 0; i <= grid; ++i) x.push_back(-150.0f * static_cast<float>(i) / grid);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> any(-150.0f, 0.0f), small(-1.0f, 0.0f);
  for (int i = 0; i < 100000; ++i) x.push_back(any(rng));
  for (int i = 0; i < 100000; ++i) x.push_back(small(rng));
  for (float edge = -150.0f; edge <= 0.0f; edge += 0.5f)  // every half integer: f = +-1/2
    for (float nudge : {-1e-5f, 0.0f, 1e-5f}) x.push_back(std::min(0.0f, edge + nudge));
  for (float tiny : {-1e-30f, -1e-10f, -1e-7f, -6e-8f, -0.0f})
    x.push_back(tiny);
  return x;
}

TYPED_TEST(MicroKernels, Exp2WithinStatedAccuracyOverTheSoftmaxRange) {
  const std::vector<float> inputs = exp2_inputs();
  double worst = 0.0;
  for (float x : inputs)
    worst = std::max(worst, exp2_error(x, TypeParam::exp2(x), TypeParam::flushes_subnormals,
                                       std::string(TypeParam::name()) + " exp2"));
  // The vector path: exp2_shift_sum with a zero shift, in chunks of awkward length.
  std::vector<float> row(inputs);
  for (std::size_t start = 0; start < row.size(); start += 509)
    TypeParam::exp2_shift_sum(row.data() + start, std::min<index_t>(509, row.size() - start), 1.0f, 0.0f);
  for (std::size_t i = 0; i < row.size(); ++i)
    worst = std::max(worst, exp2_error(inputs[i], row[i], TypeParam::flushes_subnormals,
                                       std::string(TypeParam::name()) + " exp2_shift_sum"));
  std::printf("[ %s ] max relative error of 2^x over [-150, 0] (normal results): %.3g (%.2f ulp of 1)\n",
              TypeParam::name(), worst, worst / (2 * float_epsilon));
}

TYPED_TEST(MicroKernels, Exp2EdgeValues) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(TypeParam::exp2(0.0f), 1.0f);  // the row maximum gets exactly 1
  EXPECT_EQ(TypeParam::exp2(-1.0f), 0.5f);
  EXPECT_EQ(TypeParam::exp2(-126.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(TypeParam::exp2(-149.0f), TypeParam::flushes_subnormals ? 0.0f : std::ldexp(1.0f, -149));
  EXPECT_EQ(TypeParam::exp2(-126.5f), TypeParam::flushes_subnormals ? 0.0f : std::exp2(-126.5f));
  EXPECT_EQ(TypeParam::exp2(-inf), 0.0f);
  // Below the subnormal range: zero (or at most the smallest subnormal), never NaN.
  for (float x : {-150.0f, -150.5f, -151.0f, -152.0f, -200.0f, -1000.0f, -1e30f,
                  -std::numeric_limits<float>::max()}) {
    const float got = TypeParam::exp2(x);
    EXPECT_FALSE(std::isnan(got)) << x;
    EXPECT_GE(got, 0.0f) << x;
    EXPECT_LE(got, std::ldexp(1.0f, -149)) << x;
  }
  EXPECT_TRUE(std::isnan(TypeParam::exp2(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(TypeParam::exp2(inf), inf);
  EXPECT_EQ(TypeParam::exp2(200.0f), inf);
  const double x = 10.3f;  // above the softmax range: same relative accuracy
  EXPECT_NEAR(TypeParam::exp2(10.3f), std::exp2(x), exp2_relative_tolerance * std::exp2(x));
}

// ---- row_max ----------------------------------------------------------------------------

const index_t row_lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 127, 128, 129, 512, 515};

TYPED_TEST(MicroKernels, RowMaxWithNegativeInfinityEntries) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(TypeParam::row_max(nullptr, 0), -inf);
  std::mt19937 rng(11);
  std::bernoulli_distribution masked(0.3);
  for (index_t n : row_lengths) {
    Buffer x(static_cast<std::size_t>(n));
    for (int trial = 0; trial < 20; ++trial) {
      for (index_t j = 0; j < n; ++j) x.data[j] = masked(rng) ? -inf : nonzero_uniform(rng) * 50.0f - 60.0f;
      // Values just past the end are larger than everything: they must not be read.
      x.data[n] = 1e30f;
      const index_t hot = trial % 3 == 0 ? n - 1 : static_cast<index_t>(rng() % n);  // tails too
      x.data[hot] = -1.0f - static_cast<float>(trial);
      const float expected = *std::max_element(x.data, x.data + n);
      EXPECT_EQ(TypeParam::row_max(x.data, n), expected) << "n=" << n;
    }
    std::fill_n(x.data, n, -inf);
    EXPECT_EQ(TypeParam::row_max(x.data, n), -inf) << "all masked, n=" << n;
  }
}

// ---- exp2_shift_sum ----------------------------------------------------------------------

/// 2^(x * scale - shift) with x * scale - shift in one fused multiply-add: raw scores times
/// softmax_scale * log2(e) (a scale of 1 is the plain shift).
TYPED_TEST(MicroKernels, Exp2ShiftSumMatchesDouble) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> score(-40.0f, 8.0f);
  std::bernoulli_distribution masked(0.2);
  for (float scale : {1.0f, 0.12751743f, 3.7f})
    for (index_t n : row_lengths) {
      Buffer x(static_cast<std::size_t>(n));
      for (int trial = 0; trial < 10; ++trial) {
        std::vector<float> in(static_cast<std::size_t>(n));
        for (float& v : in) v = masked(rng) ? -inf : score(rng) / scale;
        const float shift = std::max(8.0f, *std::max_element(in.begin(), in.end()) * scale);
        std::copy(in.begin(), in.end(), x.data);
        const float sum = TypeParam::exp2_shift_sum(x.data, n, scale, shift);
        double exact_sum = 0.0, sum_bound = 0.0;
        for (index_t j = 0; j < n; ++j) {
          const float xj = in[static_cast<std::size_t>(j)];
          const double arg = static_cast<double>(xj) * scale - shift;
          const double exact = std::exp2(arg);
          exact_sum += exact;
          if (std::isinf(xj)) {
            ASSERT_EQ(x.data[j], 0.0f) << "n=" << n << " j=" << j;
            continue;
          }
          // The FMA rounds x * scale - shift once: a relative error of |arg| u ln 2.
          const double argument_rounding = std::fabs(arg) * float_epsilon * std::numbers::ln2;
          const double bound = exact * (exp2_relative_tolerance + argument_rounding) + subnormal_step;
          ASSERT_NEAR(x.data[j], exact, bound) << "n=" << n << " j=" << j << " scale=" << scale;
          sum_bound += bound;
        }
        // The terms' own errors plus n - 1 float additions.
        sum_bound += static_cast<double>(n) * float_epsilon * exact_sum;
        EXPECT_NEAR(sum, exact_sum, sum_bound) << "n=" << n;
        EXPECT_EQ(x.data[n], guard) << "wrote past the end, n=" << n;
      }
    }
}

// The rows version is the one-row function applied to each row with its own scale and
// shift (bitwise), and leaves the padding between rows alone.
TYPED_TEST(MicroKernels, Exp2ShiftSumRowsIsTheOneRowFunctionPerRow) {
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> score(-30.0f, 3.0f);
  for (index_t n : {1, 16, 17, 64, 100}) {
    constexpr index_t rows = 5;
    const index_t ld = n + 7;
    Buffer x(static_cast<std::size_t>(rows * ld)), one(static_cast<std::size_t>(rows * ld));
    for (index_t i = 0; i < rows * ld; ++i) x.data[i] = one.data[i] = score(rng);
    const float scale[rows] = {1.0f, 0.3f, 2.5f, 1.0f, 0.125f}, shift[rows] = {0.0f, -2.0f, 7.5f, 3.0f, -1.0f};
    float sums[rows];
    TypeParam::exp2_shift_sum_rows(x.data, ld, rows, n, scale, shift, sums);
    for (index_t r = 0; r < rows; ++r) {
      const float sum = TypeParam::exp2_shift_sum(one.data + r * ld, n, scale[r], shift[r]);
      EXPECT_EQ(sums[r], sum) << "n " << n << " row " << r;
      for (index_t j = 0; j < ld; ++j) ASSERT_EQ(x.data[r * ld + j], one.data[r * ld + j]) << "n " << n << " row " << r << " j " << j;
    }
  }
}

TYPED_TEST(MicroKernels, Exp2ShiftSumPropagatesNaN) {
  for (index_t n : row_lengths) {
    std::vector<float> x(static_cast<std::size_t>(n), -3.0f);
    x[static_cast<std::size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(TypeParam::exp2_shift_sum(x.data(), n, 0.5f, 0.0f))) << "n=" << n;
    EXPECT_TRUE(std::isnan(x[static_cast<std::size_t>(n / 2)]));
  }
}

// ---- all_finite ---------------------------------------------------------------------------

TYPED_TEST(MicroKernels, AllFiniteFindsEveryInfAndNaN) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float bad[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                       -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN()};
  std::mt19937 rng(23);
  for (index_t n : row_lengths) {
    Buffer x(static_cast<std::size_t>(n));
    for (index_t j = 0; j < n; ++j) x.data[j] = nonzero_uniform(rng) * 3e38f;  // large but finite
    x.data[n] = inf;  // just past the end: must not be read
    EXPECT_TRUE(TypeParam::all_finite(x.data, n)) << "n=" << n;
    EXPECT_TRUE(TypeParam::all_finite(x.data, 0));
    for (float value : bad)
      for (index_t at : {index_t{0}, n / 2, n - 1}) {
        const float kept = x.data[at];
        x.data[at] = value;
        EXPECT_FALSE(TypeParam::all_finite(x.data, n)) << "n=" << n << " at " << at;
        x.data[at] = kept;
      }
  }
}

// ---- scale ------------------------------------------------------------------------------

TYPED_TEST(MicroKernels, ScaleIsOneRoundedMultiply) {
  std::mt19937 rng(13);
  for (index_t n : row_lengths) {
    Buffer x(static_cast<std::size_t>(n));
    std::vector<float> in(static_cast<std::size_t>(n));
    for (float& v : in) v = nonzero_uniform(rng) * 100.0f;
    std::copy(in.begin(), in.end(), x.data);
    const float factor = 0.3183f;
    TypeParam::scale(x.data, n, factor);
    for (index_t j = 0; j < n; ++j) ASSERT_EQ(x.data[j], in[static_cast<std::size_t>(j)] * factor) << "n=" << n;
    EXPECT_EQ(x.data[n], guard) << "wrote past the end, n=" << n;
  }
}

// ---- transpose (the loaders' path for K^T) ---------------------------------------------

/// dst = src^T for awkward blocks, with src rows far apart (as in a BSHD tensor) and dst
/// rows padded; dst's padding is never written.
TYPED_TEST(MicroKernels, TransposeMatchesTheDefinition) {
  std::mt19937 rng(17);
  for (index_t rows : {0, 1, 7, 8, 9, 15, 16, 17, 33, 128, 130})
    for (index_t cols : {1, 7, 8, 9, 16, 17, 32, 80, 128}) {
      const index_t lds = 3 * cols + 5, ldd = (rows + 15) / 16 * 16 + 16;
      Buffer src(static_cast<std::size_t>(rows * lds)), dst(static_cast<std::size_t>(cols * ldd));
      for (index_t r = 0; r < rows; ++r)
        for (index_t c = 0; c < cols; ++c) src.data[r * lds + c] = nonzero_uniform(rng);
      TypeParam::transpose(rows, cols, src.data, lds, dst.data, ldd);
      for (index_t c = 0; c < cols; ++c) {
        for (index_t r = 0; r < rows; ++r)
          ASSERT_EQ(dst.data[c * ldd + r], src.data[r * lds + c])
              << "rows=" << rows << " cols=" << cols << " at (" << c << ", " << r << ")";
        for (index_t r = rows; r < ldd; ++r)
          ASSERT_EQ(dst.data[c * ldd + r], guard) << "wrote padding, rows=" << rows;
      }
      ASSERT_EQ(dst.data[cols * ldd], guard) << "wrote past the end";
    }
}

// ---- The compile-time choice ---------------------------------------------------------

TEST(NativeArch, FollowsTheTargetMacros) {
#if defined(TILEATTN_ARCH_GENERIC)
  EXPECT_STREQ(native::name, "generic");
#elif defined(TILEATTN_HAS_AMX_KERNELS)  // AVX-512 BF16 on x86-64 Linux: AMX tiles where usable
  EXPECT_STREQ(native::name, "avx512+amx");
#elif defined(__AVX512F__)
  EXPECT_STREQ(native::name, "avx512");
#elif defined(__AVX2__) && defined(__FMA__)
  EXPECT_STREQ(native::name, "avx2");
#elif TILEATTN_ARCH_ARM_DISPATCH  // chosen at run time: the set the CPU (and TILEATTN_ISA) gives
  EXPECT_STREQ(native::name(), isa_name(dispatched_isa()));
#else
  EXPECT_STREQ(native::name, "generic");
#endif
  std::printf("[ native ] tileattn::arch::native is %s\n", native_name());
}

}  // namespace
}  // namespace tileattn::arch
