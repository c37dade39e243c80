// tests/core/half_types_test.cpp: the 16-bit storage types bf16 and fp16 (core/half_types.hpp):
// exhaustive decoding of every bit pattern, float -> 16-bit rounding against a slow reference
// in double (ties, subnormals, overflow, Inf, zeros, NaNs, millions of random floats), the
// F16C / AVX512-BF16 hardware conversions where the compiler has them, reinterpret_view over
// raw std::uint16_t buffers, and constexpr use.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>
#if __has_include(<stdfloat>)
#include <stdfloat>
#endif

#if defined(__F16C__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers.

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t b) { return std::bit_cast<float>(b); }

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, static_cast<unsigned>(v));
  return buf;
}
std::string hexf(float f) { return hex(bits_of(f), 8) + " (" + std::to_string(f) + ")"; }

bool bf16_bits_are_nan(std::uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }
bool fp16_bits_are_nan(std::uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }

std::uint16_t to_bf16_bits(float f) { return bf16(f).bits; }
std::uint16_t to_fp16_bits(float f) { return fp16(f).bits; }

// Counts mismatches in a loop over many inputs; reports the first few in detail and fails the
// test once at the end with the total (so an exhaustive loop cannot flood the output).
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  Mismatches(const Mismatches&) = delete;
  Mismatches& operator=(const Mismatches&) = delete;
  ~Mismatches() { EXPECT_EQ(count_, 0u) << what_ << ": " << count_ << " mismatches in total"; }

  template <class Describe>
  void check(bool ok, Describe&& describe) {
    if (ok) return;
    if (count_ < 8) ADD_FAILURE() << what_ << ": " << describe();
    ++count_;
  }

 private:
  std::string what_;
  unsigned long count_ = 0;
};

// Independent decodings to double, straight from the format definitions (not bit tricks).
// bf16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double decode_bf16(std::uint16_t b) {
  const int sign = b >> 15, exponent = (b >> 7) & 0xff, mantissa = b & 0x7f;
  double magnitude;
  if (exponent == 0xff) magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                                             : std::numeric_limits<double>::infinity();
  else if (exponent == 0) magnitude = std::ldexp(static_cast<double>(mantissa), -133);  // 2^(1-127-7)
  else magnitude = std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);   // 2^(e-127-7)
  return sign ? -magnitude : magnitude;
}

// fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double decode_fp16(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                                             : std::numeric_limits<double>::infinity();
  else if (exponent == 0) magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  else magnitude = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  return sign ? -magnitude : magnitude;
}

// The slow, obviously correct rounding of a float to a 16-bit format: a table of every
// non-negative finite value (index = bit pattern, increasing), a binary search for the two
// neighbours, the nearer one by exact double arithmetic (the distances are exact: both are
// multiples of the float's ulp and smaller than one 16-bit ulp), ties to the even pattern, and
// anything at or past max_finite + half an ulp to Inf.
class ReferenceRounding {
 public:
  ReferenceRounding(double (*decode)(std::uint16_t), std::uint16_t max_finite, std::uint16_t inf)
      : max_finite_(max_finite), inf_(inf) {
    for (unsigned b = 0; b <= max_finite; ++b) values_.push_back(decode(static_cast<std::uint16_t>(b)));
    overflow_ = values_[max_finite] + (values_[max_finite] - values_[max_finite - 1u]) / 2;
  }

  // Not for NaN inputs.
  std::uint16_t round(float f) const {
    const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
    const double a = std::fabs(static_cast<double>(f));
    if (a >= overflow_) return sign | inf_;
    const auto it = std::upper_bound(values_.begin(), values_.end(), a);  // first value > a
    const auto lo = static_cast<std::uint16_t>(it - values_.begin() - 1);
    if (values_[lo] == a || lo == max_finite_) return sign | lo;
    const auto hi = static_cast<std::uint16_t>(lo + 1u);
    const double d_lo = a - values_[lo], d_hi = values_[hi] - a;
    if (d_lo < d_hi) return sign | lo;
    if (d_hi < d_lo) return sign | hi;
    return sign | ((lo & 1u) == 0 ? lo : hi);  // a tie: the even mantissa
  }

  double value(std::uint16_t b) const { return values_[b]; }
  double overflow_threshold() const { return overflow_; }
  std::uint16_t max_finite() const { return max_finite_; }
  std::uint16_t inf() const { return inf_; }

 private:
  std::vector<double> values_;
  double overflow_ = 0;
  std::uint16_t max_finite_, inf_;
};

const ReferenceRounding& bf16_reference() {
  static const ReferenceRounding r(decode_bf16, 0x7f7f, 0x7f80);
  return r;
}
const ReferenceRounding& fp16_reference() {
  static const ReferenceRounding r(decode_fp16, 0x7bff, 0x7c00);
  return r;
}

// Random float bit patterns (fixed seed): 3M uniform over all 2^32 patterns (mostly huge or tiny
// magnitudes, NaNs and Infs included), then 2M with exponents near fp16's range [2^-27, 2^18).
const std::vector<std::uint32_t>& random_float_bits() {
  static const std::vector<std::uint32_t> v = [] {
    std::mt19937 gen(20240611u);
    std::vector<std::uint32_t> out;
    out.reserve(5'000'000);
    for (int i = 0; i < 3'000'000; ++i) out.push_back(static_cast<std::uint32_t>(gen()));
    std::uniform_int_distribution<std::uint32_t> exponent(127 - 27, 127 + 17);
    for (int i = 0; i < 2'000'000; ++i) {
      const std::uint32_t r = static_cast<std::uint32_t>(gen());
      out.push_back((r & 0x807fffffu) | (exponent(gen) << 23));
    }
    return out;
  }();
  return v;
}

// Checks a conversion of f against the reference (or, for NaN, that the result is a quiet NaN
// of the same sign).
void check_rounding(Mismatches& m, const char* type, float f, std::uint16_t got,
                    const ReferenceRounding& ref, bool (*is_nan)(std::uint16_t), std::uint16_t quiet_bit) {
  if (std::isnan(f)) {
    const bool ok = is_nan(got) && (got & quiet_bit) && ((got & 0x8000u) != 0) == std::signbit(f);
    m.check(ok, [&] { return std::string(type) + "(NaN " + hexf(f) + ") = " + hex(got, 4) + ", want a quiet NaN of the same sign"; });
    return;
  }
  const std::uint16_t want = ref.round(f);
  m.check(got == want, [&] { return std::string(type) + "(" + hexf(f) + ") = " + hex(got, 4) + ", want " + hex(want, 4); });
}

// ---------------------------------------------------------------------------------------------
// 1. bf16: every bit pattern.

// float(x) is exactly bits << 16 and equals the format's definition; converting back gives the
// same bits for every non-NaN pattern; NaN patterns stay NaN, same sign, and come back quiet.
TEST(Bf16, EveryBitPatternDecodesExactlyAndRoundTrips) {
  Mismatches m("bf16 exhaustive");
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(bf16::from_bits(bits));
    m.check(bits_of(f) == b << 16, [&] { return "float(bf16 " + hex(b, 4) + ") = " + hexf(f) + ", want " + hex(b << 16, 8); });
    const std::uint16_t back = bf16(f).bits;
    if (bf16_bits_are_nan(bits)) {
      m.check(std::isnan(f), [&] { return "float(bf16 " + hex(b, 4) + ") is not NaN"; });
      m.check(bf16_bits_are_nan(back) && (back & 0x8000u) == (bits & 0x8000u) && (back & 0x0040u),
              [&] { return "bf16(float(" + hex(b, 4) + ")) = " + hex(back, 4) + ", want a quiet NaN of the same sign"; });
      m.check((back & 0xffbfu) == (bits & 0xffbfu),  // the header promises the payload's other bits too
              [&] { return "bf16(float(" + hex(b, 4) + ")) = " + hex(back, 4) + " lost payload bits"; });
    } else {
      m.check(static_cast<double>(f) == decode_bf16(bits),
              [&] { return "float(bf16 " + hex(b, 4) + ") = " + hexf(f) + " disagrees with the format's definition"; });
      m.check(back == bits, [&] { return "bf16(float(" + hex(b, 4) + ")) = " + hex(back, 4); });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 2. fp16: every bit pattern.

// float(x) equals an independent decoding (normals, subnormals, Inf; NaN payload kept in the top
// mantissa bits); round-trips bitwise for non-NaN; NaN stays NaN, same sign, quiet (0x0200).
TEST(Fp16, EveryBitPatternDecodesExactlyAndRoundTrips) {
  Mismatches m("fp16 exhaustive");
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(fp16::from_bits(bits));
    const std::uint16_t back = fp16(f).bits;
    if (fp16_bits_are_nan(bits)) {
      // A NaN widens to the float NaN with the same sign and the 10 mantissa bits on top.
      const std::uint32_t want = ((b & 0x8000u) << 16) | 0x7f800000u | ((b & 0x3ffu) << 13);
      m.check(std::isnan(f) && bits_of(f) == want,
              [&] { return "float(fp16 " + hex(b, 4) + ") = " + hexf(f) + ", want " + hex(want, 8); });
      m.check(fp16_bits_are_nan(back) && (back & 0x8000u) == (bits & 0x8000u) && (back & 0x0200u),
              [&] { return "fp16(float(" + hex(b, 4) + ")) = " + hex(back, 4) + ", want a quiet NaN of the same sign"; });
      m.check((back & 0xfdffu) == (bits & 0xfdffu),  // the header promises the payload's other bits too
              [&] { return "fp16(float(" + hex(b, 4) + ")) = " + hex(back, 4) + " lost payload bits"; });
    } else {
      const double want = decode_fp16(bits);
      m.check(static_cast<double>(f) == want && std::signbit(f) == std::signbit(want),
              [&] { return "float(fp16 " + hex(b, 4) + ") = " + hexf(f) + ", want " + std::to_string(want); });
      m.check(back == bits, [&] { return "fp16(float(" + hex(b, 4) + ")) = " + hex(back, 4); });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 3. float -> 16-bit rounding against the slow reference.

// The reference itself: its table is the exact decoding (checked against the header's float(x)
// above) and it agrees with hand-computed answers, so it is not wrong in the same way.
TEST(ReferenceRounding, SanityOfTheReference) {
  const auto& h = fp16_reference();
  EXPECT_EQ(h.value(0x7bff), 65504.0);
  EXPECT_EQ(h.overflow_threshold(), 65520.0);
  EXPECT_EQ(h.round(65519.99f), 0x7bffu);
  EXPECT_EQ(h.round(65520.0f), 0x7c00u);
  EXPECT_EQ(h.round(0x1p-25f), 0x0000u);
  EXPECT_EQ(h.round(std::nextafter(0x1p-25f, 1.0f)), 0x0001u);
  EXPECT_EQ(h.round(3 * 0x1p-25f), 0x0002u);
  EXPECT_EQ(h.round(-1.0f), 0xbc00u);
  const auto& b = bf16_reference();
  EXPECT_EQ(b.value(0x3f80), 1.0);
  EXPECT_EQ(b.round(1.0f + 0x1p-8f), 0x3f80u);
  EXPECT_EQ(b.round(1.0f + 3 * 0x1p-8f), 0x3f82u);
  EXPECT_EQ(b.round(std::numeric_limits<float>::max()), 0x7f80u);
}

// Every pair of neighbouring finite values (both signs, subnormals included): the exact midpoint
// goes to the even pattern, one float ulp above it to the upper, one below it to the lower; the
// last pair is (max finite, Inf), whose midpoint is the overflow threshold.
void check_all_ties(const char* type, const ReferenceRounding& ref, std::uint16_t (*convert)(float)) {
  Mismatches m(std::string(type) + " ties");
  for (unsigned lo = 0; lo <= ref.max_finite(); ++lo) {
    const auto lo_bits = static_cast<std::uint16_t>(lo), hi_bits = static_cast<std::uint16_t>(lo + 1);
    const double mid = lo == ref.max_finite() ? ref.overflow_threshold() : (ref.value(lo_bits) + ref.value(hi_bits)) / 2;
    const auto even = static_cast<std::uint16_t>((lo & 1u) == 0 ? lo_bits : hi_bits);
    for (const double sign : {1.0, -1.0}) {
      const std::uint16_t s = sign < 0 ? 0x8000u : 0u;
      const float tie = static_cast<float>(sign * mid);
      m.check(static_cast<double>(tie) == sign * mid, [&] { return "midpoint above " + hex(lo, 4) + " is not a float"; });
      const float above = std::nextafter(tie, static_cast<float>(sign) * std::numeric_limits<float>::infinity());
      const float below = std::nextafter(tie, 0.0f);
      const struct {
        float f;
        std::uint16_t want;
      } cases[] = {{tie, static_cast<std::uint16_t>(s | even)},
                   {above, static_cast<std::uint16_t>(s | hi_bits)},
                   {below, static_cast<std::uint16_t>(s | lo_bits)}};
      for (const auto& c : cases) {
        const std::uint16_t got = convert(c.f);
        m.check(got == c.want, [&] { return std::string(type) + "(" + hexf(c.f) + ") = " + hex(got, 4) + ", want " + hex(c.want, 4); });
        m.check(ref.round(c.f) == c.want, [&] { return "reference disagrees at " + hexf(c.f); });
      }
    }
  }
}

// Ties, one float ulp above and below each tie, for every neighbouring pair of bf16 values.
TEST(Bf16, RoundsEveryTieToEvenAndItsNeighboursToNearest) { check_all_ties("bf16", bf16_reference(), to_bf16_bits); }

// Ties, one float ulp above and below each tie, for every neighbouring pair of fp16 values.
TEST(Fp16, RoundsEveryTieToEvenAndItsNeighboursToNearest) { check_all_ties("fp16", fp16_reference(), to_fp16_bits); }

// Hand-picked bf16 cases: ties both ways, max finite, overflow, float subnormals, zeros, Inf.
TEST(Bf16, NamedCases) {
  EXPECT_EQ(bf16(1.0f + 0x1p-8f).bits, 0x3f80u);      // tie between 0x3F80 (even) and 0x3F81: down
  EXPECT_EQ(bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82u);  // tie between 0x3F81 and 0x3F82 (even): up
  EXPECT_EQ(bf16(float_of(0x3fffffffu)).bits, 0x4000u);  // rounding carries into the exponent
  EXPECT_EQ(bf16(static_cast<float>(bf16::from_bits(0x7f7f))).bits, 0x7f7fu);  // max finite
  EXPECT_EQ(bf16(float_of(0x7f7f7fffu)).bits, 0x7f7fu);  // just under max + half ulp
  EXPECT_EQ(bf16(float_of(0x7f7f8000u)).bits, 0x7f80u);  // max + half ulp: Inf
  EXPECT_EQ(bf16(float_of(0xff7f8000u)).bits, 0xff80u);  // and -Inf
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()).bits, 0x7f80u);
  EXPECT_EQ(bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80u);
  EXPECT_EQ(bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80u);
  EXPECT_EQ(bf16(0.0f).bits, 0x0000u);
  EXPECT_EQ(bf16(-0.0f).bits, 0x8000u);  // sign kept
  // float subnormals are kept (no flush to zero), rounded like everything else:
  EXPECT_EQ(bf16(float_of(0x00000001u)).bits, 0x0000u);  // smallest float subnormal: 0
  EXPECT_EQ(bf16(float_of(0x80000001u)).bits, 0x8000u);  // -0
  EXPECT_EQ(bf16(float_of(0x00008000u)).bits, 0x0000u);  // tie: down to even 0
  EXPECT_EQ(bf16(float_of(0x00008001u)).bits, 0x0001u);  // just above: the smallest bf16 subnormal
  EXPECT_EQ(bf16(float_of(0x00018000u)).bits, 0x0002u);  // tie: up to even
  EXPECT_EQ(bf16(float_of(0x00420000u)).bits, 0x0042u);  // exact
  EXPECT_EQ(bf16(float_of(0x807fffffu)).bits, 0x8080u);  // largest subnormal rounds to -smallest normal
}

// Every positive float subnormal (2^23 patterns) and a stride of negative ones, against the
// reference: bf16 keeps subnormals, so they must be rounded exactly, not flushed.
TEST(Bf16, FloatSubnormalsRoundExactly) {
  const auto& ref = bf16_reference();
  Mismatches m("bf16 float subnormals");
  for (std::uint32_t x = 1; x < 0x00800000u; ++x) check_rounding(m, "bf16", float_of(x), bf16(float_of(x)).bits, ref, bf16_bits_are_nan, 0x40);
  for (std::uint32_t x = 0x80000001u; x < 0x80800000u; x += 97)
    check_rounding(m, "bf16", float_of(x), bf16(float_of(x)).bits, ref, bf16_bits_are_nan, 0x40);
}

// Hand-picked fp16 cases: ties both ways, subnormals, max finite, overflow, zeros, Inf.
TEST(Fp16, NamedCases) {
  EXPECT_EQ(fp16(1.0f + 0x1p-11f).bits, 0x3c00u);      // tie: down to even 0x3C00
  EXPECT_EQ(fp16(1.0f + 3 * 0x1p-11f).bits, 0x3c02u);  // tie: up to even 0x3C02
  EXPECT_EQ(fp16(2047.5f).bits, 0x6800u);              // 2047.5 ties 2047 (odd) and 2048: up, into the exponent
  EXPECT_EQ(fp16(0x1p-24f).bits, 0x0001u);             // smallest subnormal
  EXPECT_EQ(fp16(0x1p-25f).bits, 0x0000u);             // half of it: a tie, to 0
  EXPECT_EQ(fp16(-0x1p-25f).bits, 0x8000u);            // -0
  EXPECT_EQ(fp16(std::nextafter(0x1p-25f, 1.0f)).bits, 0x0001u);  // just above: smallest subnormal
  EXPECT_EQ(fp16(std::nextafter(0x1p-25f, 0.0f)).bits, 0x0000u);
  EXPECT_EQ(fp16(3 * 0x1p-25f).bits, 0x0002u);         // tie between 1 and 2: even 2
  EXPECT_EQ(fp16(5 * 0x1p-25f).bits, 0x0002u);         // tie between 2 and 3: even 2
  EXPECT_EQ(fp16(1023 * 0x1p-24f).bits, 0x03ffu);      // largest subnormal
  EXPECT_EQ(fp16(2047 * 0x1p-25f).bits, 0x0400u);      // tie between largest subnormal and 2^-14: even
  EXPECT_EQ(fp16(0x1p-14f).bits, 0x0400u);             // smallest normal
  EXPECT_EQ(fp16(float_of(0x00000001u)).bits, 0x0000u);  // float subnormals are far below: 0
  EXPECT_EQ(fp16(float_of(0x807fffffu)).bits, 0x8000u);
  EXPECT_EQ(fp16(65504.0f).bits, 0x7bffu);             // max finite
  EXPECT_EQ(fp16(65519.99f).bits, 0x7bffu);            // just under max + half ulp
  EXPECT_EQ(fp16(65520.0f).bits, 0x7c00u);             // max + half ulp: Inf
  EXPECT_EQ(fp16(-65519.99f).bits, 0xfbffu);
  EXPECT_EQ(fp16(-65520.0f).bits, 0xfc00u);
  EXPECT_EQ(fp16(1e10f).bits, 0x7c00u);
  EXPECT_EQ(fp16(std::numeric_limits<float>::infinity()).bits, 0x7c00u);
  EXPECT_EQ(fp16(-std::numeric_limits<float>::infinity()).bits, 0xfc00u);
  EXPECT_EQ(fp16(0.0f).bits, 0x0000u);
  EXPECT_EQ(fp16(-0.0f).bits, 0x8000u);  // sign kept
}

// The fp16 subnormal range [2^-26, 2^-14] on a grid 2^-34 apart (1,024 points per fp16
// subnormal step, both signs), against the reference; the ties themselves are checked above.
TEST(Fp16, SubnormalRangeOnAFineGrid) {
  const auto& ref = fp16_reference();
  Mismatches m("fp16 subnormals");
  for (double v = 0x1p-26; v <= 0x1p-14; v += 0x1p-34)
    for (const float f : {static_cast<float>(v), static_cast<float>(-v)})
      check_rounding(m, "fp16", f, fp16(f).bits, ref, fp16_bits_are_nan, 0x200);
}

// NaNs with various payloads (quiet, signalling, only low bits set, both signs) stay NaN with
// their sign, come back quiet, and keep the payload's leading bits, as the header promises.
TEST(HalfTypes, NaNsStayNaN) {
  for (const std::uint32_t x : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u,
                                0x7fbfffffu, 0x7fffffffu, 0xffffffffu, 0x7f80ffffu, 0x7f802000u,
                                0x7fd55555u, 0xff8aaaaau}) {
    const float f = float_of(x);
    ASSERT_TRUE(std::isnan(f));
    const std::uint16_t b = bf16(f).bits, h = fp16(f).bits;
    EXPECT_TRUE(bf16_bits_are_nan(b)) << hex(x, 8) << " -> bf16 " << hex(b, 4);
    EXPECT_EQ(b & 0x8000u, (x >> 16) & 0x8000u) << hex(x, 8);
    EXPECT_EQ(b & 0x0040u, 0x0040u) << hex(x, 8) << ": bf16 NaN not quiet";
    EXPECT_EQ(b, static_cast<std::uint16_t>((x >> 16) | 0x0040u)) << hex(x, 8) << ": bf16 payload";
    EXPECT_TRUE(fp16_bits_are_nan(h)) << hex(x, 8) << " -> fp16 " << hex(h, 4);
    EXPECT_EQ(h & 0x8000u, (x >> 16) & 0x8000u) << hex(x, 8);
    EXPECT_EQ(h & 0x0200u, 0x0200u) << hex(x, 8) << ": fp16 NaN not quiet";
    EXPECT_EQ(h & 0x01ffu, (x >> 13) & 0x01ffu) << hex(x, 8) << ": fp16 payload";
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(static_cast<float>(fp16(std::numeric_limits<float>::signaling_NaN()))));
}

// Millions of random float bit patterns (fixed seed) against the reference, for both types.
TEST(HalfTypes, RandomFloatsMatchTheReference) {
  const auto& bref = bf16_reference();
  const auto& href = fp16_reference();
  Mismatches mb("bf16 random"), mh("fp16 random");
  for (const std::uint32_t x : random_float_bits()) {
    const float f = float_of(x);
    check_rounding(mb, "bf16", f, bf16(f).bits, bref, bf16_bits_are_nan, 0x40);
    check_rounding(mh, "fp16", f, fp16(f).bits, href, fp16_bits_are_nan, 0x200);
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Hardware conversions, where the compiler targets them.

#if defined(__F16C__)
// F16C's vcvtps2ph (round to nearest even) agrees bitwise with fp16(float), NaNs included, on
// every fp16 value widened back and on the random floats.
TEST(Fp16, MatchesF16CNarrowing) {
  Mismatches m("fp16 vs _cvtss_sh");
  auto compare = [&](float f) {
    const std::uint16_t got = fp16(f).bits;
    const auto want = static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    m.check(got == want, [&] { return "fp16(" + hexf(f) + ") = " + hex(got, 4) + ", F16C gives " + hex(want, 4); });
  };
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) compare(static_cast<float>(fp16::from_bits(static_cast<std::uint16_t>(b))));
  for (const std::uint32_t x : random_float_bits()) compare(float_of(x));
  for (double v = 0x1p-26; v <= 0x1p-14; v += 0x1p-34) compare(static_cast<float>(v));  // subnormal range
}

// F16C's vcvtph2ps agrees bitwise with float(fp16) on all 65,536 patterns, except that the
// hardware quiets a signalling NaN (sets float bit 22) while the header copies the payload as is
// (as bf16's widening does); for those, the two differ by exactly that bit.
TEST(Fp16, MatchesF16CWidening) {
  Mismatches m("float(fp16) vs _cvtsh_ss");
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint32_t got = bits_of(static_cast<float>(fp16::from_bits(bits)));
    const std::uint32_t hw = bits_of(_cvtsh_ss(bits));
    const std::uint32_t want = fp16_bits_are_nan(bits) ? (hw & ~0x00400000u) | (got & 0x00400000u) : hw;
    m.check(got == want, [&] { return "float(fp16 " + hex(b, 4) + ") = " + hex(got, 8) + ", F16C gives " + hex(hw, 8); });
    if (fp16_bits_are_nan(bits)) m.check((hw & 0x00400000u) != 0, [&] { return "F16C left " + hex(b, 4) + " signalling"; });
  }
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// vcvtneps2bf16 (round to nearest even) agrees bitwise with bf16(float) on the random floats and
// every tie, NaNs included. Inputs that are float subnormals are skipped: the instruction treats
// them as zero (DAZ regardless of MXCSR), while the header rounds them exactly.
TEST(Bf16, MatchesAvx512Bf16OnNormalInputs) {
  std::vector<float> inputs;
  for (const std::uint32_t x : random_float_bits()) inputs.push_back(float_of(x));
  const auto& ref = bf16_reference();
  for (unsigned lo = 0; lo < ref.max_finite(); ++lo) {
    const float tie = static_cast<float>((ref.value(static_cast<std::uint16_t>(lo)) + ref.value(static_cast<std::uint16_t>(lo + 1))) / 2);
    for (const float f : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e38f), -tie}) inputs.push_back(f);
  }
  std::erase_if(inputs, [](float f) { return std::fpclassify(f) == FP_SUBNORMAL; });
  while (inputs.size() % 16) inputs.push_back(1.0f);
  Mismatches m("bf16 vs _mm512_cvtneps_pbh");
  for (std::size_t i = 0; i < inputs.size(); i += 16) {
    const __m256bh packed = _mm512_cvtneps_pbh(_mm512_loadu_ps(&inputs[i]));
    std::uint16_t hw[16];
    static_assert(sizeof packed == sizeof hw);
    std::memcpy(hw, &packed, sizeof hw);
    for (int j = 0; j < 16; ++j) {
      const float f = inputs[i + j];
      const std::uint16_t got = bf16(f).bits;
      m.check(got == hw[j], [&] { return "bf16(" + hexf(f) + ") = " + hex(got, 4) + ", AVX512-BF16 gives " + hex(hw[j], 4); });
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// 5. reinterpret_view.

// Over a padded, non-contiguous [2,3,4,5] buffer of raw std::uint16_t: the bf16/fp16 views (and
// their const versions) keep the data pointer, shape, stride and constness, read the same bits
// at every (b,s,h,d), and a write through the mutable view lands in the raw buffer.
template <class To>
void check_reinterpret_view() {
  constexpr index_t B = 2, S = 3, H = 4, D = 5;
  const std::array<index_t, 4> shape{B, S, H, D};
  const std::array<index_t, 4> stride{S * H * 8 * 2 + 3, H * 8 * 2, 8, 2};  // padded, every other element
  std::vector<std::uint16_t> buf(static_cast<std::size_t>(B * stride[0]));
  std::mt19937 gen(7);
  for (auto& x : buf) x = static_cast<std::uint16_t>(gen());

  const StridedView<std::uint16_t, 4> raw{buf.data(), shape, stride};
  const StridedView<const std::uint16_t, 4> craw = raw;
  const auto v = reinterpret_view<To>(raw);
  const auto cv = reinterpret_view<To>(craw);
  static_assert(std::is_same_v<decltype(v), const StridedView<To, 4>>);
  static_assert(std::is_same_v<decltype(cv), const StridedView<const To, 4>>);
  static_assert(std::is_same_v<decltype(cv(0, 0, 0, 0)), const To&>);

  EXPECT_EQ(static_cast<const void*>(v.data), static_cast<const void*>(buf.data()));
  EXPECT_EQ(static_cast<const void*>(cv.data), static_cast<const void*>(buf.data()));
  EXPECT_EQ(v.shape, shape);
  EXPECT_EQ(v.stride, stride);
  EXPECT_EQ(cv.shape, shape);
  EXPECT_EQ(cv.stride, stride);
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d) {
          ASSERT_EQ(v(b, s, h, d).bits, raw(b, s, h, d)) << b << "," << s << "," << h << "," << d;
          ASSERT_EQ(cv(b, s, h, d).bits, craw(b, s, h, d)) << b << "," << s << "," << h << "," << d;
          ASSERT_EQ(&cv(b, s, h, d).bits, &craw(b, s, h, d));
        }
  v(1, 2, 3, 4) = To(2.0f);
  EXPECT_EQ(raw(1, 2, 3, 4), To(2.0f).bits);
}

// reinterpret_view<bf16> of mutable and const std::uint16_t views.
TEST(ReinterpretView, Uint16AsBf16) { check_reinterpret_view<bf16>(); }

// reinterpret_view<fp16> of mutable and const std::uint16_t views.
TEST(ReinterpretView, Uint16AsFp16) { check_reinterpret_view<fp16>(); }

// ---------------------------------------------------------------------------------------------
// 6. constexpr.

// The conversions are usable at compile time (these would fail to compile otherwise).
TEST(HalfTypes, ConversionsAreConstexpr) {
  static_assert(bf16(1.0f).bits == 0x3f80);
  static_assert(bf16(-2.0f).bits == 0xc000);
  static_assert(bf16(1.0f + 0x1p-8f).bits == 0x3f80);  // a tie, to even
  static_assert(static_cast<float>(bf16::from_bits(0x4049)) == 3.140625f);
  static_assert(fp16(1.0f).bits == 0x3c00);
  static_assert(fp16(65520.0f).bits == 0x7c00);
  static_assert(fp16(0x1p-24f).bits == 0x0001);
  static_assert(static_cast<float>(fp16::from_bits(0x7bff)) == 65504.0f);
  static_assert(static_cast<float>(fp16::from_bits(0x0001)) == 0x1p-24f);
  static_assert(bf16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7fc0);
  static_assert(from_float<fp16>(to_float(fp16::from_bits(0x3555))) == fp16::from_bits(0x3555));
  constexpr bf16 x(0.5f);
  EXPECT_EQ(x.bits, 0x3f00u);
}

// The compiler's own 16-bit types hold the same bits: a view over them reinterprets as
// ours (checked where the compiler has them: _Float16 in GCC 12 and clang on x86-64;
// std::bfloat16_t and std::float16_t with <stdfloat>, GCC 13 and later).
template <class Native, class Ours>
void expect_same_bits_through_a_view(const std::vector<float>& values) {
  std::vector<Native> native(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) native[i] = static_cast<Native>(values[i]);
  const StridedView<const Native, 4> view{native.data(), {1, 1, 1, static_cast<index_t>(values.size())},
                                          {0, 0, 0, 1}};
  const auto ours = reinterpret_view<Ours>(view);
  static_assert(std::is_same_v<decltype(ours), const StridedView<const Ours, 4>>);
  for (std::size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(ours(0, 0, 0, static_cast<index_t>(i)).bits, Ours(values[i]).bits) << values[i];
}

TEST(ReinterpretView, CompilerHalfTypesHaveOurBits) {
  const std::vector<float> values{0.0f, -0.0f, 1.0f, -1.5f, 3.14159f, 65504.0f, 1e-7f, 0x1p-24f, 1e30f};
  int checked = 0;
#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__clang__) || __GNUC__ >= 13)
  expect_same_bits_through_a_view<_Float16, fp16>(values);
  ++checked;
#elif defined(__aarch64__)  // GCC 12's C++ has no _Float16 there; __fp16 is the same format
  expect_same_bits_through_a_view<__fp16, fp16>(values);
  ++checked;
#endif
#if defined(__STDCPP_BFLOAT16_T__)
  expect_same_bits_through_a_view<std::bfloat16_t, bf16>(values);
  ++checked;
#endif
#if defined(__STDCPP_FLOAT16_T__)
  expect_same_bits_through_a_view<std::float16_t, fp16>(values);
  ++checked;
#endif
  if (checked == 0) GTEST_SKIP() << "this compiler has no native 16-bit floating-point type";
}

}  // namespace
}  // namespace tileattn
