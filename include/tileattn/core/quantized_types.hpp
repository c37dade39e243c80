// tileattn/core/quantized_types.hpp: the 8-bit K/V storage types of quantized KV caches
// (fp8 e4m3, fp8 e5m2, int8 with scales), their conversions, and the scale rules.
//
// A stored value means stored * scale, the scale kept beside the data (KvScaleView,
// core/params.hpp): one per (page, K/V head) for int8, one per K/V head or per tensor for
// fp8 (docs/precision.md says why those choices keep appends local).
//   fp8_e4m3  OCP "E4M3FN": 1 sign, 4 exponent (bias 7), 3 mantissa bits; no Inf, NaN is
//             S.1111.111; largest finite 448, smallest subnormal 2^-9.
//   fp8_e5m2  OCP E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits: the top byte of an
//             fp16; Inf and NaN as IEEE; largest finite 57344, smallest subnormal 2^-16.
//   int8      std::int8_t, symmetric: values -127..127 mean q * scale; -128 is NaN (an
//             input that was NaN or Inf), so a non-finite input still makes the rows that
//             see it NaN.
// float -> fp8 rounds to nearest, ties to even, subnormals kept; a finite value beyond
// the largest finite one saturates to it (as NVIDIA's __NV_SATFINITE); NaN stays NaN; Inf
// stays Inf in e5m2 and becomes NaN in e4m3, which has no Inf (saturating it to 448 would
// hide it). float -> int8 is round(x / scale) to nearest even, clamped to +-127.
// Every 8-bit value converts to float exactly.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tileattn/core/half_types.hpp"

namespace tileattn {

namespace detail {

/// |x| as float bits in (2^-(bias + mantissa_bits + 1), 2^(1 - bias)) -> an fp8 subnormal
/// in units of its smallest one; shift_right_even rounds.
constexpr std::uint8_t fp8_subnormal(std::uint32_t ax, int units_exponent) {
  const int exponent = static_cast<int>(ax >> 23);
  const std::uint32_t significand = (ax & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint8_t>(shift_right_even(significand, 150 - units_exponent - exponent));
}

constexpr std::uint8_t float_to_e4m3_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7fu;                 // NaN, and Inf (no Inf in e4m3fn)
  if (ax >= 0x43e00000u) return sign | 0x7eu;                 // >= 448: saturate
  if (ax >= 0x3c800000u)                                      // normal (>= 2^-6): rebias, round 20 bits
    return sign | static_cast<std::uint8_t>(shift_right_even(ax - (120u << 23), 20));
  if (ax <= 0x3a800000u) return sign;                         // <= 2^-10: ties to 0
  return sign | fp8_subnormal(ax, 9);                         // units of 2^-9
}

constexpr float e4m3_bits_to_float(std::uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const std::uint32_t exponent = (b >> 3) & 0xfu, mantissa = b & 0x7u;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) magnitude = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0) magnitude = static_cast<float>(mantissa) * 0x1p-9f;
  else magnitude = std::bit_cast<float>(((exponent + 120u) << 23) | (mantissa << 20));
  return negative ? -magnitude : magnitude;
}

constexpr std::uint8_t float_to_e5m2_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7eu;                  // NaN (quiet)
  if (ax == 0x7f800000u) return sign | 0x7cu;                 // Inf
  if (ax >= 0x47600000u) return sign | 0x7bu;                 // >= 57344: saturate
  if (ax >= 0x38800000u)                                      // normal (>= 2^-14)
    return sign | static_cast<std::uint8_t>(shift_right_even(ax - (112u << 23), 21));
  if (ax <= 0x37000000u) return sign;                         // <= 2^-17: ties to 0
  return sign | fp8_subnormal(ax, 16);                        // units of 2^-16
}

constexpr float e5m2_bits_to_float(std::uint8_t b) {
  return fp16_bits_to_float(static_cast<std::uint16_t>(b << 8));
}

}  // namespace detail

/// fp8 E4M3FN (OCP): range +-448, 3 mantissa bits, no Inf.
struct fp8_e4m3 : float_code<fp8_e4m3, std::uint8_t, detail::float_to_e4m3_bits, detail::e4m3_bits_to_float> {
  using float_code::float_code;
  static constexpr float max_finite = 448.0f;
};

/// fp8 E5M2 (OCP): range +-57344, 2 mantissa bits, Inf and NaN as IEEE.
struct fp8_e5m2 : float_code<fp8_e5m2, std::uint8_t, detail::float_to_e5m2_bits, detail::e5m2_bits_to_float> {
  using float_code::float_code;
  static constexpr float max_finite = 57344.0f;
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<fp8_e4m3> && std::is_trivially_copyable_v<fp8_e5m2>);

/// int8's NaN: what a NaN or Inf input is stored as.
inline constexpr std::int8_t int8_nan = -128;
/// The largest magnitude an int8 value holds: scale = absmax / int8_max.
inline constexpr float int8_max = 127.0f;

constexpr float to_float(fp8_e4m3 x) { return static_cast<float>(x); }
constexpr float to_float(fp8_e5m2 x) { return static_cast<float>(x); }
/// An int8 value unscaled (q, or NaN for int8_nan): the kernel multiplies by the scale.
constexpr float to_float(std::int8_t x) {
  return x == int8_nan ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(x);
}

/// The 8-bit K/V storage types: stored values times a scale.
template <class T>
concept quantized_type =
    std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2> || std::is_same_v<T, std::int8_t>;

/// The element types K and V may be stored in (Q and O: storage_type).
template <class T>
concept kv_storage_type = storage_type<T> || quantized_type<T>;

/// Whether T's scales change as values are written (int8, per page) or are fixed (fp8).
template <class T>
inline constexpr bool adaptive_scale = std::is_same_v<T, std::int8_t>;

/// The int8 value of x at `scale` (> 0): round(x / scale) to nearest even, clamped to
/// +-127; NaN and Inf become int8_nan. A zero scale (a block that holds only zeros so far)
/// stores 0.
inline std::int8_t quantize_int8(float x, float scale) {
  if (!std::isfinite(x)) return int8_nan;
  if (scale == 0.0f) return 0;
  const float r = std::nearbyint(x / scale);  // the default rounding mode: to nearest even
  return static_cast<std::int8_t>(std::fmax(-int8_max, std::fmin(int8_max, r)));
}

/// x as 8-bit type Q at `scale`: fp8 is x / scale rounded (saturating), int8 quantize_int8.
/// `scale` must be finite and > 0 (int8: or 0); write_kv_slots and KvCache check that.
template <quantized_type Q>
Q quantize(float x, float scale) {
  if constexpr (std::is_same_v<Q, std::int8_t>) return quantize_int8(x, scale);
  else return Q(x / scale);
}

/// The stored value q read back: to_float(q) * scale (exact for fp8 at a power-of-two scale).
template <quantized_type Q>
float dequantize(Q q, float scale) {
  return to_float(q) * scale;
}

template <kv_storage_type T>
constexpr const char* kv_type_name() {
  if constexpr (std::is_same_v<T, fp8_e4m3>) return "fp8_e4m3";
  else if constexpr (std::is_same_v<T, fp8_e5m2>) return "fp8_e5m2";
  else if constexpr (std::is_same_v<T, std::int8_t>) return "int8";
  else return type_name<T>();
}

}  // namespace tileattn
