// tests/core/quantized_types_test.cpp: the 8-bit K/V storage types (core/quantized_types.hpp):
// every bit pattern of fp8 e4m3 and e5m2 decoded against values computed here from the format
// definitions in double; float -> fp8 rounding (round trips, ties to even between every pair
// of neighbours, just off the midpoints, subnormals, underflow to signed zero, saturation,
// NaN, Inf, zeros) and against a brute-force nearest-value encoder on random floats; int8
// quantization (ties to even, clamping, NaN/Inf, zero scale, scale recovery on random rows);
// the quantize / dequantize templates and the type traits.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tileattn/core/quantized_types.hpp"

namespace tileattn {
namespace {

// ---- Format definitions, independent of the header -----------------------------------------

/// An OCP fp8 format: 1 sign bit, `exponent_bits`, `mantissa_bits`, exponent bias.
struct Fp8Format {
  int exponent_bits, mantissa_bits, bias;
  bool has_inf;  // e5m2: IEEE-style Inf and NaN; e4m3fn: no Inf, NaN only at S.1111.111
};
constexpr Fp8Format e4m3_format{4, 3, 7, false};
constexpr Fp8Format e5m2_format{5, 2, 15, true};

template <class Q>
constexpr Fp8Format format_of() {
  return std::is_same_v<Q, fp8_e4m3> ? e4m3_format : e5m2_format;
}

bool is_nan_code(const Fp8Format& f, std::uint8_t b) {
  const int exponent = (b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = b & ((1 << f.mantissa_bits) - 1);
  const int all_ones = (1 << f.exponent_bits) - 1;
  if (f.has_inf) return exponent == all_ones && mantissa != 0;
  return exponent == all_ones && mantissa == (1 << f.mantissa_bits) - 1;
}

bool is_inf_code(const Fp8Format& f, std::uint8_t b) {
  const int exponent = (b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = b & ((1 << f.mantissa_bits) - 1);
  return f.has_inf && exponent == (1 << f.exponent_bits) - 1 && mantissa == 0;
}

/// The value of bit pattern b in double, from the definition: subnormals (exponent field 0)
/// are mantissa / 2^mantissa_bits * 2^(1 - bias); normals (1 + mantissa / 2^mantissa_bits) *
/// 2^(exponent - bias).
double decode_reference(const Fp8Format& f, std::uint8_t b) {
  const bool negative = (b & 0x80) != 0;
  if (is_nan_code(f, b)) return std::numeric_limits<double>::quiet_NaN();
  if (is_inf_code(f, b)) return negative ? -HUGE_VAL : HUGE_VAL;
  const int exponent = (b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = b & ((1 << f.mantissa_bits) - 1);
  const double fraction = static_cast<double>(mantissa) / static_cast<double>(1 << f.mantissa_bits);
  const double magnitude = exponent == 0 ? std::ldexp(fraction, 1 - f.bias) : std::ldexp(1.0 + fraction, exponent - f.bias);
  return negative ? -magnitude : magnitude;
}

/// The non-negative finite codes in increasing order of value (code c has value c's rank).
std::vector<std::uint8_t> finite_codes(const Fp8Format& f) {
  std::vector<std::uint8_t> codes;
  for (int b = 0; b < 0x80; ++b)
    if (!is_nan_code(f, static_cast<std::uint8_t>(b)) && !is_inf_code(f, static_cast<std::uint8_t>(b)))
      codes.push_back(static_cast<std::uint8_t>(b));
  return codes;
}

/// float -> fp8 by brute force: the nearest finite value, ties to the even code; beyond the
/// largest finite value, saturation to it; NaN -> a NaN; Inf -> Inf (e5m2) or NaN (e4m3).
/// Returns the code, or -1 for "any NaN".
int encode_reference(const Fp8Format& f, float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return -1;
  if (std::isinf(x)) return f.has_inf ? (sign | 0x7c) : -1;
  const double a = std::fabs(static_cast<double>(x));
  const std::vector<std::uint8_t> codes = finite_codes(f);
  const double max_finite = decode_reference(f, codes.back());
  if (a >= max_finite) return sign | codes.back();
  std::uint8_t best = 0;
  double best_distance = HUGE_VAL;
  for (std::uint8_t c : codes) {
    const double d = std::fabs(decode_reference(f, c) - a);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) best = c, best_distance = d;
  }
  return sign | best;
}

template <class Q>
std::uint8_t encode(float x) {
  return Q(x).bits;
}
template <class Q>
float decode(std::uint8_t b) {
  return to_float(Q::from_bits(b));
}

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%02x", v);
  return text;
}
std::string describe(float x) {
  char text[64];
  std::snprintf(text, sizeof text, "%a (0x%08x)", static_cast<double>(x), std::bit_cast<std::uint32_t>(x));
  return text;
}

/// Expects x to encode as `code` (-1: any NaN code).
template <class Q>
void expect_encodes_to(float x, int code, const std::string& what = "") {
  const std::uint8_t got = encode<Q>(x);
  if (code < 0)
    EXPECT_TRUE(is_nan_code(format_of<Q>(), got)) << what << " " << describe(x) << " gave " << hex(got) << ", not a NaN";
  else
    EXPECT_EQ(got, code) << what << " " << describe(x) << " gave " << hex(got) << ", expected " << hex(static_cast<unsigned>(code));
}

template <class Q>
class Fp8 : public ::testing::Test {};
using Fp8Types = ::testing::Types<fp8_e4m3, fp8_e5m2>;
struct Fp8Name {
  template <class Q>
  static std::string GetName(int) {
    return kv_type_name<Q>();
  }
};
TYPED_TEST_SUITE(Fp8, Fp8Types, Fp8Name);

// ---- Decoding -------------------------------------------------------------------------------

TYPED_TEST(Fp8, EveryBitPatternDecodesToItsDefinedValue) {
  using Q = TypeParam;
  const Fp8Format f = format_of<Q>();
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const double want = decode_reference(f, bits);
    const float got = decode<Q>(bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << hex(bits) << " gave " << describe(got);
      EXPECT_TRUE(std::isnan(static_cast<float>(Q::from_bits(bits)))) << hex(bits);
      continue;
    }
    EXPECT_EQ(static_cast<float>(Q::from_bits(bits)), got) << hex(bits);  // operator float agrees
    EXPECT_EQ(static_cast<double>(got), want) << hex(bits) << " gave " << describe(got);  // exact: every value fits a float
    EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << hex(bits);                           // -0 included
  }
}

TEST(Fp8Decoding, KnownValues) {
  EXPECT_EQ(decode<fp8_e4m3>(0x7e), 448.0f);
  EXPECT_EQ(decode<fp8_e4m3>(0xfe), -448.0f);
  EXPECT_EQ(decode<fp8_e4m3>(0x01), 0x1p-9f);
  EXPECT_EQ(decode<fp8_e4m3>(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(decode<fp8_e4m3>(0x08), 0x1p-6f);
  EXPECT_EQ(decode<fp8_e4m3>(0x38), 1.0f);
  EXPECT_EQ(decode<fp8_e4m3>(0x78), 256.0f);  // exponent all ones is still finite in e4m3fn
  EXPECT_TRUE(std::isnan(decode<fp8_e4m3>(0x7f)));
  EXPECT_TRUE(std::isnan(decode<fp8_e4m3>(0xff)));
  EXPECT_EQ(decode<fp8_e5m2>(0x7b), 57344.0f);
  EXPECT_EQ(decode<fp8_e5m2>(0x01), 0x1p-16f);
  EXPECT_EQ(decode<fp8_e5m2>(0x04), 0x1p-14f);
  EXPECT_EQ(decode<fp8_e5m2>(0x3c), 1.0f);
  EXPECT_EQ(decode<fp8_e5m2>(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(decode<fp8_e5m2>(0xfc), -std::numeric_limits<float>::infinity());
  for (std::uint8_t b : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(decode<fp8_e5m2>(b))) << hex(b);
  EXPECT_EQ(fp8_e4m3::max_finite, decode<fp8_e4m3>(0x7e));
  EXPECT_EQ(fp8_e5m2::max_finite, decode<fp8_e5m2>(0x7b));
}

// ---- Encoding -------------------------------------------------------------------------------

TYPED_TEST(Fp8, EveryFiniteValueRoundTrips) {
  using Q = TypeParam;
  for (std::uint8_t c : finite_codes(format_of<Q>()))
    for (std::uint8_t sign : {0x00, 0x80}) {
      const auto bits = static_cast<std::uint8_t>(c | sign);
      EXPECT_EQ(encode<Q>(decode<Q>(bits)), bits) << hex(bits);  // 0x80 is -0: kept
    }
}

TYPED_TEST(Fp8, MidpointsTieToEvenAndNeighboursRoundToTheNearer) {
  using Q = TypeParam;
  const std::vector<std::uint8_t> codes = finite_codes(format_of<Q>());
  for (std::size_t i = 0; i + 1 < codes.size(); ++i) {
    const std::uint8_t lo = codes[i], hi = codes[i + 1];
    const double mid = (static_cast<double>(decode<Q>(lo)) + static_cast<double>(decode<Q>(hi))) / 2;
    const auto midpoint = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midpoint), mid) << "midpoint not exact in float";
    const std::uint8_t even = (lo & 1) == 0 ? lo : hi;
    const float above = std::nextafter(midpoint, HUGE_VALF), below = std::nextafter(midpoint, 0.0f);
    for (std::uint8_t sign : {0x00, 0x80}) {
      const float s = sign ? -1.0f : 1.0f;
      const std::string what = "between " + hex(lo) + " and " + hex(hi);
      expect_encodes_to<Q>(s * midpoint, sign | even, what + ", midpoint");
      expect_encodes_to<Q>(s * above, sign | hi, what + ", just above the midpoint");
      expect_encodes_to<Q>(s * below, sign | lo, what + ", just below the midpoint");
    }
  }
}

TYPED_TEST(Fp8, SubnormalsRoundIncludingUpIntoTheSmallestNormal) {
  using Q = TypeParam;
  const Fp8Format f = format_of<Q>();
  const float smallest_subnormal = std::ldexp(1.0f, 1 - f.bias - f.mantissa_bits);
  const float smallest_normal = std::ldexp(1.0f, 1 - f.bias);
  const auto largest_subnormal_code = static_cast<std::uint8_t>((1 << f.mantissa_bits) - 1);  // odd
  const auto smallest_normal_code = static_cast<std::uint8_t>(1 << f.mantissa_bits);          // even
  ASSERT_EQ(decode<Q>(smallest_normal_code), smallest_normal);
  const float largest_subnormal = decode<Q>(largest_subnormal_code);
  // The midpoint between the largest subnormal and the smallest normal ties up to the even normal.
  const float mid = (largest_subnormal + smallest_normal) / 2;
  expect_encodes_to<Q>(mid, smallest_normal_code, "top subnormal midpoint");
  expect_encodes_to<Q>(-mid, 0x80 | smallest_normal_code, "top subnormal midpoint");
  expect_encodes_to<Q>(std::nextafter(mid, 0.0f), largest_subnormal_code, "below the top subnormal midpoint");
  expect_encodes_to<Q>(std::nextafter(smallest_normal, 0.0f), smallest_normal_code, "just under the smallest normal");
  // Every subnormal multiple, and 1.5 and 2.5 of them (ties to even: 2 and 2).
  for (int m = 0; m < (1 << f.mantissa_bits); ++m)
    expect_encodes_to<Q>(static_cast<float>(m) * smallest_subnormal, m, "subnormal multiple");
  expect_encodes_to<Q>(1.5f * smallest_subnormal, 2);
  expect_encodes_to<Q>(2.5f * smallest_subnormal, 2);
  expect_encodes_to<Q>(3.5f * smallest_subnormal, 4);
  expect_encodes_to<Q>(1.25f * smallest_subnormal, 1);
  expect_encodes_to<Q>(1.75f * smallest_subnormal, 2);
}

TYPED_TEST(Fp8, BelowHalfTheSmallestSubnormalIsSignedZero) {
  using Q = TypeParam;
  const Fp8Format f = format_of<Q>();
  const float half_smallest = std::ldexp(1.0f, -f.bias - f.mantissa_bits);
  expect_encodes_to<Q>(half_smallest, 0x00, "half the smallest subnormal (tie to 0)");
  expect_encodes_to<Q>(-half_smallest, 0x80, "minus half the smallest subnormal");
  expect_encodes_to<Q>(std::nextafter(half_smallest, 1.0f), 0x01, "just above half the smallest subnormal");
  expect_encodes_to<Q>(-std::nextafter(half_smallest, 1.0f), 0x81);
  for (float x : {std::nextafter(half_smallest, 0.0f), 0.3f * half_smallest, 1e-30f, FLT_MIN,
                  std::numeric_limits<float>::denorm_min(), 0.0f}) {
    expect_encodes_to<Q>(x, 0x00, "tiny");
    expect_encodes_to<Q>(-x, 0x80, "minus tiny");
  }
}

TYPED_TEST(Fp8, FiniteValuesBeyondTheLargestSaturate) {
  using Q = TypeParam;
  const std::uint8_t max_code = finite_codes(format_of<Q>()).back();
  const float max = Q::max_finite;
  ASSERT_EQ(decode<Q>(max_code), max);
  // The step above max is that of max's binade: one unit in the last place.
  const float ulp = max - decode<Q>(static_cast<std::uint8_t>(max_code - 1));
  for (float x : {max, std::nextafter(max, HUGE_VALF), max + ulp / 2, std::nextafter(max + ulp / 2, HUGE_VALF),
                  max + ulp, 2 * max, 1e10f, 1e30f, FLT_MAX}) {
    expect_encodes_to<Q>(x, max_code, "saturation");
    expect_encodes_to<Q>(-x, 0x80 | max_code, "negative saturation");
  }
  expect_encodes_to<Q>(std::nextafter(max, 0.0f), max_code, "just under max");
}

TYPED_TEST(Fp8, NaNInfAndZeros) {
  using Q = TypeParam;
  const Fp8Format f = format_of<Q>();
  const float inf = std::numeric_limits<float>::infinity();
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::signaling_NaN(), std::bit_cast<float>(0x7f800001u),
                    std::bit_cast<float>(0xffffffffu)}) {
    expect_encodes_to<Q>(nan, -1, "NaN");
    EXPECT_TRUE(std::isnan(to_float(Q(nan))));
  }
  if (f.has_inf) {
    expect_encodes_to<Q>(inf, 0x7c, "Inf");
    expect_encodes_to<Q>(-inf, 0xfc, "-Inf");
    EXPECT_EQ(to_float(Q(-inf)), -inf);
  } else {
    expect_encodes_to<Q>(inf, -1, "Inf (no Inf in e4m3: NaN)");
    expect_encodes_to<Q>(-inf, -1, "-Inf (no Inf in e4m3: NaN)");
  }
  EXPECT_EQ(encode<Q>(0.0f), 0x00);
  EXPECT_EQ(encode<Q>(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(to_float(Q(-0.0f))));
}

TYPED_TEST(Fp8, RandomFloatsMatchTheBruteForceNearestValue) {
  using Q = TypeParam;
  const Fp8Format f = format_of<Q>();
  std::mt19937 rng(2024);
  // Random bit patterns with exponents around the format's range (2^-30 .. 2^20), and some
  // fully random ones (mostly huge or tiny).
  std::uniform_int_distribution<std::uint32_t> exponent(127 - 30, 127 + 20);
  int failures = 0;
  for (int i = 0; i < 200000 && failures < 10; ++i) {
    std::uint32_t bits = static_cast<std::uint32_t>(rng());
    if (i % 8 != 0) bits = (bits & 0x807fffffu) | (exponent(rng) << 23);
    if (i % 3 == 0) bits &= 0xfff80000u;  // 4 mantissa bits: many exact midpoints
    const float x = std::bit_cast<float>(bits);
    const int want = encode_reference(f, x);
    const std::uint8_t got = encode<Q>(x);
    const bool ok = want < 0 ? is_nan_code(f, got) : got == want;
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << describe(x) << " gave " << hex(got) << ", expected " << hex(static_cast<unsigned>(want));
  }
}

TEST(Fp8Encoding, ConstexprAndKnownCodes) {
  static_assert(fp8_e4m3(448.0f).bits == 0x7e);
  static_assert(fp8_e4m3(1.0f).bits == 0x38);
  static_assert(fp8_e5m2(1.0f).bits == 0x3c);
  static_assert(static_cast<float>(fp8_e4m3::from_bits(0x01)) == 0x1p-9f);
  static_assert(static_cast<float>(fp8_e5m2::from_bits(0x7b)) == 57344.0f);
  static_assert(to_float(std::int8_t{-5}) == -5.0f);
  EXPECT_EQ(fp8_e4m3(0.1f).bits, 0x1d);  // 0.1 -> 0.1015625 = 1.625 * 2^-4
  EXPECT_EQ(fp8_e5m2(0.1f).bits, 0x2e);  // 0.1 -> 0.09375 = 1.5 * 2^-4
  EXPECT_EQ(fp8_e4m3(-3.0f).bits, 0xc4);
  EXPECT_EQ(fp8_e4m3::from_bits(0x38), fp8_e4m3(1.0f));
}

// ---- int8 ---------------------------------------------------------------------------------

TEST(Int8, RoundsTiesToEven) {
  EXPECT_EQ(quantize_int8(2.5f, 1.0f), 2);
  EXPECT_EQ(quantize_int8(3.5f, 1.0f), 4);
  EXPECT_EQ(quantize_int8(-2.5f, 1.0f), -2);
  EXPECT_EQ(quantize_int8(-3.5f, 1.0f), -4);
  EXPECT_EQ(quantize_int8(0.5f, 1.0f), 0);
  EXPECT_EQ(quantize_int8(1.5f, 1.0f), 2);
  EXPECT_EQ(quantize_int8(126.5f, 1.0f), 126);
  EXPECT_EQ(quantize_int8(std::nextafter(2.5f, 3.0f), 1.0f), 3);
  EXPECT_EQ(quantize_int8(std::nextafter(3.5f, 3.0f), 1.0f), 3);
  EXPECT_EQ(quantize_int8(5.0f, 2.0f), 2);   // 2.5 -> 2
  EXPECT_EQ(quantize_int8(7.0f, 2.0f), 4);   // 3.5 -> 4
  EXPECT_EQ(quantize_int8(0.75f, 0.5f), 2);  // 1.5 -> 2
  EXPECT_EQ(quantize_int8(-0.25f, 1.0f), 0);
}

TEST(Int8, ClampsAtPlusMinus127) {
  for (float x : {127.0f, 127.4f, 127.5f, 128.0f, 1000.0f, 1e30f, FLT_MAX}) {
    EXPECT_EQ(quantize_int8(x, 1.0f), 127) << x;
    EXPECT_EQ(quantize_int8(-x, 1.0f), -127) << -x;  // never -128, int8_nan
  }
  EXPECT_EQ(quantize_int8(1.0f, 1e-40f), 127);  // x / scale overflows to Inf: still clamped
  EXPECT_EQ(quantize_int8(-1.0f, 1e-40f), -127);
  EXPECT_EQ(quantize_int8(126.49f, 1.0f), 126);
}

TEST(Int8, NonFiniteIsInt8NaNAndDecodesToNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
    EXPECT_EQ(quantize_int8(x, 1.0f), int8_nan) << x;
    EXPECT_EQ(quantize_int8(x, 0.0f), int8_nan) << x << " at a zero scale";
    EXPECT_EQ(quantize<std::int8_t>(x, 0.5f), int8_nan);
  }
  EXPECT_EQ(int8_nan, -128);
  EXPECT_TRUE(std::isnan(to_float(int8_nan)));
  EXPECT_TRUE(std::isnan(dequantize(int8_nan, 0.25f)));
  for (int q = -127; q <= 127; ++q) EXPECT_EQ(to_float(static_cast<std::int8_t>(q)), static_cast<float>(q));
}

TEST(Int8, ZeroScaleStoresZero) {
  for (float x : {0.0f, -0.0f, 1.0f, -5.0f, 1e30f}) EXPECT_EQ(quantize_int8(x, 0.0f), 0) << x;
}

TEST(Int8, AbsmaxScaleIsRecoveredWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_magnitude(-20.0f, 20.0f);
  for (int row = 0; row < 2000; ++row) {
    const int n = 1 + static_cast<int>(rng() % 200);
    const float magnitude = std::exp2(log_magnitude(rng));
    std::vector<float> x(static_cast<std::size_t>(n));
    float absmax = 0.0f;
    std::size_t at_max = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      x[j] = normal(rng) * magnitude;
      if (row % 5 == 0 && j % 3 == 0) x[j] = std::round(x[j] / magnitude * 8) * magnitude / 8;  // more ties
      if (std::fabs(x[j]) > absmax) absmax = std::fabs(x[j]), at_max = j;
    }
    if (absmax == 0.0f) continue;
    const float scale = absmax / int8_max;
    float worst = 0.0f;
    for (std::size_t j = 0; j < x.size(); ++j) {
      const std::int8_t q = quantize<std::int8_t>(x[j], scale);
      ASSERT_EQ(q, quantize_int8(x[j], scale));
      ASSERT_NE(q, int8_nan);
      worst = std::max(worst, std::fabs(dequantize(q, scale) - x[j]));
    }
    // Half a step, plus float slack: x / scale and q * scale each round once.
    EXPECT_LE(worst, scale / 2 * (1 + 1e-5f) + absmax * 1e-6f) << "row " << row << " scale " << scale;
    EXPECT_EQ(quantize_int8(x[at_max], scale), x[at_max] > 0 ? 127 : -127) << "row " << row;
  }
}

// ---- quantize / dequantize templates and traits -------------------------------------------------

TYPED_TEST(Fp8, QuantizeDividesByTheScaleAndDequantizeMultiplies) {
  using Q = TypeParam;
  for (float scale : {1.0f, 0.125f, 32.0f, 0.01f, 3.0f})
    for (float x : {0.0f, 1.0f, -2.75f, 100.0f, 1e-3f, -1e6f}) {
      EXPECT_EQ(quantize<Q>(x, scale).bits, Q(x / scale).bits) << x << " / " << scale;
      const Q q = quantize<Q>(x, scale);
      EXPECT_EQ(dequantize(q, scale), to_float(q) * scale);
    }
  // At a power-of-two scale every finite value round-trips exactly.
  for (float scale : {0.125f, 1.0f, 64.0f})
    for (std::uint8_t c : finite_codes(format_of<Q>())) {
      const float v = decode<Q>(c) * scale;
      EXPECT_EQ(dequantize(quantize<Q>(v, scale), scale), v) << hex(c) << " at scale " << scale;
      EXPECT_EQ(dequantize(quantize<Q>(-v, scale), scale), -v) << hex(c) << " at scale " << scale;
    }
}

TEST(QuantizedTraits, ConceptsNamesAndScaleKinds) {
  static_assert(quantized_type<fp8_e4m3> && quantized_type<fp8_e5m2> && quantized_type<std::int8_t>);
  static_assert(!quantized_type<float> && !quantized_type<bf16> && !quantized_type<std::uint8_t>);
  static_assert(kv_storage_type<float> && kv_storage_type<bf16> && kv_storage_type<fp16>);
  static_assert(kv_storage_type<fp8_e4m3> && kv_storage_type<std::int8_t> && !kv_storage_type<double>);
  static_assert(adaptive_scale<std::int8_t> && !adaptive_scale<fp8_e4m3> && !adaptive_scale<fp8_e5m2>);
  static_assert(sizeof(fp8_e4m3) == 1 && alignof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
  EXPECT_STREQ(kv_type_name<fp8_e4m3>(), "fp8_e4m3");
  EXPECT_STREQ(kv_type_name<fp8_e5m2>(), "fp8_e5m2");
  EXPECT_STREQ(kv_type_name<std::int8_t>(), "int8");
  EXPECT_STREQ(kv_type_name<bf16>(), type_name<bf16>());
  EXPECT_EQ(int8_max, 127.0f);
}

}  // namespace
}  // namespace tileattn
