// tests/paged/quantized_4bit_test.cpp: the 4-bit K/V block types (core/block_quantized_types.hpp):
// q4_0, MXFP4 and NVFP4 codecs (every nibble, scale edge cases, round trips exact, ties to
// even, NaN blocks), their byte layouts against the published formats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tileattn/core/block_quantized_types.hpp"

namespace tileattn::test {
namespace {

template <class B>
class BlockCodec : public ::testing::Test {};
using BlockTypes = ::testing::Types<q4_0_block, mxfp4_block, nvfp4_block>;
TYPED_TEST_SUITE(BlockCodec, BlockTypes);

template <class B>
std::vector<float> dequantized(const B& b, float tensor_scale = 1.0f) {
  std::vector<float> out(B::values);
  dequantize_block(b, out.data(), tensor_scale);
  return out;
}

/// Random block values of magnitude ~`spread` (never all zero), a few large ones.
std::vector<float> random_block(int n, std::mt19937& rng, float spread) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

// Quantizing a block of dequantized values gives the same block values back: the grid is a
// fixed point of the codec (the scale rule recovers the scale from the absmax value).
TYPED_TEST(BlockCodec, RoundTripOfDequantizedValuesIsExact) {
  using B = TypeParam;
  std::mt19937 rng(7);
  for (float spread : {1e-3f, 0.3f, 1.0f, 17.0f, 900.0f}) {
    for (int trial = 0; trial < 50; ++trial) {
      const std::vector<float> x = random_block(B::values, rng, spread);
      const std::vector<float> once = dequantized(quantize_block<B>(x.data()));
      const std::vector<float> twice = dequantized(quantize_block<B>(once.data()));
      for (int i = 0; i < B::values; ++i) ASSERT_EQ(once[i], twice[i]) << "spread " << spread << " value " << i;
    }
  }
}

// Each value lands on the nearest grid point: no other nibble of the block's scale is closer
// (within the grid's range: values past the end saturate).
TYPED_TEST(BlockCodec, RoundsToNearestGridPoint) {
  using B = TypeParam;
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> x = random_block(B::values, rng, 2.5f);
    const B b = quantize_block<B>(x.data());
    const float scale = block_scale(b);
    ASSERT_TRUE(std::isfinite(scale) && scale != 0.0f);  // q4_0: the sign of -m
    for (int i = 0; i < B::values; ++i) {
      const double got = std::fabs(nibble_value<B>(nibble(b, i)) * static_cast<double>(scale) - x[i]);
      for (int q = 0; q < 16; ++q)
        ASSERT_LE(got, std::fabs(nibble_value<B>(static_cast<std::uint8_t>(q)) * static_cast<double>(scale) - x[i]))
            << "value " << i << " = " << x[i] << " nibble " << int{nibble(b, i)} << " vs " << q;
    }
  }
}

TYPED_TEST(BlockCodec, NonFiniteInputMakesTheBlockNaN) {
  using B = TypeParam;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int at : {0, B::values / 2 + 1, B::values - 1}) {
      std::vector<float> x(B::values, 0.25f);
      x[static_cast<std::size_t>(at)] = bad;
      for (float v : dequantized(quantize_block<B>(x.data()))) EXPECT_TRUE(std::isnan(v)) << bad << " at " << at;
    }
  }
}

TYPED_TEST(BlockCodec, ZeroBlockIsZero) {
  using B = TypeParam;
  const std::vector<float> x(B::values, 0.0f);
  for (float v : dequantized(quantize_block<B>(x.data()))) EXPECT_EQ(v, 0.0f);
}

// Extreme magnitudes stay finite: the scale saturates (q4_0, NVFP4) or clamps (MXFP4), and
// the largest value keeps its sign.
TYPED_TEST(BlockCodec, ExtremeMagnitudesStayFinite) {
  using B = TypeParam;
  for (float big : {1e6f, 3e38f, 1e-30f, 1e-44f}) {
    std::vector<float> x(B::values, big / 3);
    x[3] = -big;
    const std::vector<float> d = dequantized(quantize_block<B>(x.data()));
    for (float v : d) EXPECT_TRUE(std::isfinite(v)) << big;
    EXPECT_LE(d[3], 0.0f) << big;
  }
}

TEST(Q4_0, EveryNibbleDequantizesToQMinus8TimesD) {
  q4_0_block b{};
  b.d = fp16(0.375f);
  for (int i = 0; i < 16; ++i) b.qs[i] = static_cast<std::uint8_t>(i | ((15 - i) << 4));
  const std::vector<float> d = dequantized(b);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(d[static_cast<std::size_t>(i)], (i - 8) * 0.375f);            // low nibble of byte i: value i
    EXPECT_EQ(d[static_cast<std::size_t>(i + 16)], (15 - i - 8) * 0.375f);  // high nibble: value i + 16
  }
}

// llama.cpp's scale rule: d = m / -8 with m the value of largest magnitude, which maps to
// nibble 0; the other sign saturates at 7 |d|.
TEST(Q4_0, ScaleFromSignedAbsmax) {
  std::vector<float> x(32, 0.0f);
  x[5] = 4.0f;
  x[9] = -3.0f;
  x[20] = -4.5f;  // never larger in magnitude than x[5] below
  x[20] = 3.9f;
  const q4_0_block b = quantize_q4_0(x.data());
  EXPECT_EQ(block_scale(b), -0.5f);
  EXPECT_EQ(nibble(b, 5), 0);
  EXPECT_EQ(dequantized(b)[9], -3.0f);
  x[9] = -8.0f;  // now m = -8: d = 1, +4 -> 12
  const q4_0_block c = quantize_q4_0(x.data());
  EXPECT_EQ(block_scale(c), 1.0f);
  EXPECT_EQ(dequantized(c)[5], 4.0f);
  EXPECT_EQ(nibble(c, 9), 0);
}

TEST(Q4_0, TiesRoundToEven) {
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;  // d = 1
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 3.5f;
  const std::vector<float> d = dequantized(quantize_q4_0(x.data()));
  EXPECT_EQ(d[1], 2.0f);
  EXPECT_EQ(d[2], -2.0f);
  EXPECT_EQ(d[3], 4.0f);
}

TEST(E2m1, EveryCodeRoundTrips) {
  for (int code = 0; code < 16; ++code) {
    const float v = e2m1_values[static_cast<std::size_t>(code)];
    const std::uint8_t back = detail::float_to_e2m1(v);
    EXPECT_EQ(e2m1_values[back], v) << code;
    EXPECT_EQ(std::signbit(e2m1_values[back]), std::signbit(v)) << code;
  }
}

TEST(E2m1, TiesRoundToEvenAndLargeValuesSaturate) {
  const float ties[][2] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                           {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},  {7.0f, 6.0f}, {1e9f, 6.0f}};
  for (const auto& t : ties) {
    EXPECT_EQ(e2m1_values[detail::float_to_e2m1(t[0])], t[1]) << t[0];
    EXPECT_EQ(e2m1_values[detail::float_to_e2m1(-t[0])], -t[1]) << t[0];
  }
}

// OCP: shared exponent floor(log2(absmax)) - 2, so the absmax lands in [4, 8) units; e8m0
// 0xFF is NaN; value 2i is the low nibble of byte i.
TEST(Mxfp4, SharedExponentAndLayout) {
  std::vector<float> x(32, 0.0f);
  x[0] = 5.0f;  // log2 -> 2, e = 0: X = 1
  x[1] = -0.5f;
  x[31] = 7.5f;  // the absmax: floor(log2 7.5) = 2, X = 1, saturates to 6
  mxfp4_block b = quantize_mxfp4(x.data());
  EXPECT_EQ(b.e, e8m0_bias);
  EXPECT_EQ(b.qs[0] & 0xf, 0x6);   // 4 (5 ties to 4, the even code)
  EXPECT_EQ(b.qs[0] >> 4, 0x9);    // -0.5
  EXPECT_EQ(b.qs[15] >> 4, 0x7);   // 6
  for (float& v : x) v *= 1024.0f;
  b = quantize_mxfp4(x.data());
  EXPECT_EQ(b.e, e8m0_bias + 10);
  EXPECT_EQ(dequantized(b)[1], -512.0f);
  b.e = e8m0_nan;
  EXPECT_TRUE(std::isnan(block_scale(b)));
}

TEST(Nvfp4, E4m3ScaleTimesTensorScale) {
  std::vector<float> x(16, 0.0f);
  x[2] = 12.0f;  // scale = 12 / 6 = 2 (exact e4m3)
  x[3] = -3.0f;
  nvfp4_block b = quantize_nvfp4(x.data());
  EXPECT_EQ(block_scale(b), 2.0f);
  EXPECT_EQ(dequantized(b)[2], 12.0f);
  EXPECT_EQ(dequantized(b)[3], -3.0f);
  EXPECT_EQ(b.qs[1], static_cast<std::uint8_t>(0x7 | (0xb << 4)));  // 6 then -1.5
  b = quantize_nvfp4(x.data(), 0.25f);  // the e4m3 scale is relative to the tensor's
  EXPECT_EQ(block_scale(b), 8.0f);
  EXPECT_EQ(dequantized(b, 0.25f)[2], 12.0f);
}

}  // namespace
}  // namespace tileattn::test
