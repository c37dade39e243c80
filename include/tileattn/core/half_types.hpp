// tileattn/core/half_types.hpp: the 16-bit storage types bf16 and fp16, their exact
// conversions to and from float, and how views over other libraries' 16-bit types are made.
//
// Both are plain 16-bit patterns (IEEE binary16 for fp16; the upper half of a binary32 for
// bf16), so a buffer of Eigen::bfloat16, Eigen::half, std::bfloat16_t, std::float16_t,
// __bf16, _Float16 or raw std::uint16_t holding the same bits is a buffer of these:
// reinterpret_view<bf16>(view) makes a tileattn view of it (checked at compile time to have
// the same size and alignment). Conversions:
//   float(x)  exact (every 16-bit value is a float);
//   bf16(f), fp16(f)  round to nearest, ties to even, subnormals kept; a value past the
//   largest finite one (by half an ulp or more) becomes Inf; NaN stays NaN (quiet, sign and
//   leading payload bits kept).
// Arithmetic is never done in 16 bits: kernels convert to float (or multiply bf16 pairs into
// float accumulators) and round once when they store.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace tileattn {

namespace detail {

constexpr std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign and payload's top bits, make it quiet
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);  // ties to even; carries into the exponent
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// m >> shift, rounded to nearest with ties to even (shift in 1..31).
constexpr std::uint32_t shift_right_even(std::uint32_t m, int shift) {
  const std::uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return q + (rest > half || (rest == half && (q & 1u)) ? 1u : 0u);
}

constexpr std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u)  // NaN: quiet, with the payload's top 9 bits
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (ax >= 0x38800000u) {  // a normal fp16 (>= 2^-14): rebias the exponent, round 13 bits off
    const std::uint32_t rebiased = ax - 0x38000000u;  // (127 - 15) << 23
    return static_cast<std::uint16_t>(sign | shift_right_even(rebiased, 13));
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25, half the smallest subnormal: ties to 0
  // A subnormal fp16 (units of 2^-24): the 24-bit significand shifted by 126 - exponent.
  const int exponent = static_cast<int>(ax >> 23);
  const std::uint32_t significand = (ax & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_right_even(significand, 126 - exponent));
}

constexpr float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace detail

/// A number kept as the bits of its code, Bits wide: constructed from a float by Encode,
/// converted back by Decode, compared bitwise. The storage types (bf16, fp16 and the fp8
/// types of core/quantized_types.hpp) derive from it, Self naming the derived type.
template <class Self, class Bits, Bits (*Encode)(float), float (*Decode)(Bits)>
struct float_code {
  Bits bits = 0;

  float_code() = default;
  constexpr explicit float_code(float f) : bits(Encode(f)) {}
  constexpr explicit operator float() const { return Decode(bits); }
  static constexpr Self from_bits(Bits b) {
    Self x;
    x.bits = b;
    return x;
  }
  friend constexpr bool operator==(Self a, Self b) { return a.bits == b.bits; }  // bitwise
};

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (float's range, 3 significant digits).
struct bf16 : float_code<bf16, std::uint16_t, detail::float_to_bf16_bits, detail::bf16_bits_to_float> {
  using float_code::float_code;
};

/// IEEE half precision (binary16): 1 sign, 5 exponent, 10 mantissa bits (max 65504).
struct fp16 : float_code<fp16, std::uint16_t, detail::float_to_fp16_bits, detail::fp16_bits_to_float> {
  using float_code::float_code;
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2 && std::is_trivially_copyable_v<fp16>);

/// Two bf16 values multiplied as one 32-bit element: the SRAM operand of the bf16 dot-product
/// micro-kernels (a product of pairs is lo * lo' + hi * hi', accumulated in float).
struct bf16x2 {
  bf16 lo, hi;
};
static_assert(sizeof(bf16x2) == 4);

/// The element types Q, K, V and O may be stored in.
template <class T>
concept storage_type = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// x as float, for any storage type.
constexpr float to_float(float x) { return x; }
constexpr float to_float(bf16 x) { return static_cast<float>(x); }
constexpr float to_float(fp16 x) { return static_cast<float>(x); }

/// float rounded to storage type T (round to nearest even).
template <storage_type T>
constexpr T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

/// The name users see in messages and benchmarks.
template <storage_type T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "fp16";
}

}  // namespace tileattn
