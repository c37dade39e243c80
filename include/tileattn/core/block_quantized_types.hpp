// tileattn/core/block_quantized_types.hpp: the 4-bit K/V storage types: blocks of 4-bit
// values sharing one scale stored inside the block (int4 q4_0, FP4 e2m1 MXFP4 and NVFP4),
// their codecs (quantize a block of floats, dequantize it exactly), the concept
// block_quantized_type, and hadamard_rotated<B>: a block stored Hadamard-rotated.
//
// Why blocks, not elements with scales beside them (as the 8-bit caches keep them, per page):
// a 4-bit value is half a byte, so "one element per view index" cannot hold; and its scale
// changes every 16 or 32 values along head_dim, so it cannot be folded into a key's score as
// the 8-bit per-key scales are. A block is one standard-layout struct (scale + packed
// nibbles): a cache row of head_dim values is head_dim / values_per_block blocks, views,
// pools and block tables index blocks unchanged, and a tile load turns one block into its
// values with the scale it just read (memory/tile_io.hpp). The formats, byte for byte:
//   q4_0_block   llama.cpp's block_q4_0: fp16 d, then 16 bytes; value j (j < 16) is the low
//                nibble of byte j, value j + 16 its high nibble; value = (q - 8) * d.
//                No NaN code: a non-finite input makes d NaN (the whole block reads NaN).
//   mxfp4_block  OCP Microscaling MXFP4: one e8m0 scale X = 2^(e - 127) (e = 0xFF: NaN), then
//                32 e2m1 values, two a byte, value 2i in the low nibble of byte i.
//   nvfp4_block  NVIDIA NVFP4: one fp8 e4m3 scale, then 16 e2m1 values (low nibble first);
//                value = e2m1 * scale * the tensor's fp32 scale (kept outside the block,
//                passed to the codec; 1 by default).
// e2m1: 1 sign, 2 exponent (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives.
//
// Quantizing a block (32 or 16 floats): the scale comes from the block's absmax, then each
// value rounds to nearest, ties to even, on the scaled 4-bit grid, saturating at its ends:
//   q4_0   d = fp16(m / -8), m the value of largest magnitude (sign kept, llama.cpp's rule:
//          m itself maps to q = 0 exactly, the other sign reaches 7 |d|); d saturates at
//          fp16's largest finite value.
//   mxfp4  e = floor(log2(absmax)) - 2 (OCP: the largest e2m1 exponent is 2), clamped to the
//          e8m0 range; values above 6 X saturate to 6 X (as the spec's conversion does).
//   nvfp4  scale = e4m3(absmax / 6 / tensor_scale) (rounded to nearest; saturating at 448).
// A NaN or Inf anywhere in the block makes the block NaN (its scale's NaN code), never
// silently finite, so the rows that see it become NaN. Every dequantized value is exact in
// float (q4_0: a 4-bit integer times an fp16; FP4: a 2-significant-bit value times a power of
// two or an e4m3), except NVFP4's product with a tensor scale that is not a power of two,
// which dequantize() rounds once (the "dequantized values" the kernels must then reproduce).
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/quantized_types.hpp"

namespace tileattn {

/// llama.cpp block_q4_0: 32 int4 values (q - 8) * d.
struct q4_0_block {
  static constexpr int values = 32;
  fp16 d;
  std::uint8_t qs[values / 2];
};

/// OCP MXFP4: 32 e2m1 values times 2^(e - 127).
struct mxfp4_block {
  static constexpr int values = 32;
  std::uint8_t e;
  std::uint8_t qs[values / 2];
};

/// NVIDIA NVFP4: 16 e2m1 values times an e4m3 scale (times the tensor's scale).
struct nvfp4_block {
  static constexpr int values = 16;
  fp8_e4m3 scale;
  std::uint8_t qs[values / 2];
};

static_assert(sizeof(q4_0_block) == 18 && sizeof(mxfp4_block) == 17 && sizeof(nvfp4_block) == 9);
static_assert(std::is_standard_layout_v<q4_0_block> && std::is_trivially_copyable_v<q4_0_block>);
static_assert(std::is_standard_layout_v<mxfp4_block> && std::is_trivially_copyable_v<mxfp4_block>);
static_assert(std::is_standard_layout_v<nvfp4_block> && std::is_trivially_copyable_v<nvfp4_block>);

/// The 4-bit K/V storage types: blocks of values_per_block values and their scale.
template <class T>
concept block_quantized_type =
    std::is_same_v<T, q4_0_block> || std::is_same_v<T, mxfp4_block> || std::is_same_v<T, nvfp4_block>;

/// A 4-bit block whose values were turned by the normalised Walsh-Hadamard transform before
/// they were quantized (ops/hadamard.hpp: each K row after rotary, each V row, head_dim a
/// power of two): the element type of a pool written that way. Byte for byte a B, but a
/// distinct type, so that whether a pool is rotated is known from its view's type: a
/// KvCache<hadamard_rotated<B>> and write_kv_slots into its pools rotate, and forward_paged
/// over them rotates Q as it loads and O back as it stores. A pool of plain B is never
/// rotated, so the two cannot be mixed up (the flag they replace could be set on one side
/// and not the other, issue #42). No conversion to or from B: reinterpret_view only.
template <class B>
struct hadamard_rotated {
  static_assert(block_quantized_type<B>,
                "tileattn: hadamard_rotated<B> takes a 4-bit block type: q4_0_block, mxfp4_block or nvfp4_block");
  using block_type = B;
  static constexpr int values = B::values;
  B block;
};

/// Whether T is hadamard_rotated<B> for some block type B.
template <class T>
inline constexpr bool is_hadamard_rotated = false;
template <class B>
inline constexpr bool is_hadamard_rotated<hadamard_rotated<B>> = true;

/// What a 4-bit pool may hold: a block type, plain or hadamard_rotated.
template <class T>
concept block_pool_type = block_quantized_type<T> || is_hadamard_rotated<T>;

/// The block type a pool of T stores (hadamard_rotated<B>: B; any other T: T), which the
/// kernels and codecs read.
template <class T>
struct stored_block {
  using type = T;
};
template <class B>
struct stored_block<hadamard_rotated<B>> {
  using type = B;
};
template <class T>
using stored_block_t = typename stored_block<T>::type;

#define TILEATTN_SAME_BYTES_AS_BLOCK(B)                                                                   \
  static_assert(sizeof(hadamard_rotated<B>) == sizeof(B) && alignof(hadamard_rotated<B>) == alignof(B) && \
                std::is_standard_layout_v<hadamard_rotated<B>> && std::is_trivially_copyable_v<hadamard_rotated<B>>);
TILEATTN_SAME_BYTES_AS_BLOCK(q4_0_block)
TILEATTN_SAME_BYTES_AS_BLOCK(mxfp4_block)
TILEATTN_SAME_BYTES_AS_BLOCK(nvfp4_block)
#undef TILEATTN_SAME_BYTES_AS_BLOCK

/// Values one element of T holds: a block's count (rotated or not), 1 for the element types.
template <class T>
inline constexpr int values_per_element = 1;
template <block_pool_type T>
inline constexpr int values_per_element<T> = T::values;

/// e2m1 code (sign in bit 3) -> its value.
inline constexpr std::array<float, 16> e2m1_values{0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
/// e2m1's largest magnitude, and the e8m0 code of NaN and of 2^0.
inline constexpr float e2m1_max = 6.0f;
inline constexpr std::uint8_t e8m0_nan = 0xff, e8m0_bias = 127;

namespace detail {

/// |v| rounded to nearest on the e2m1 grid, ties to the even code, saturating at 6.
constexpr std::uint8_t e2m1_magnitude_code(float v) {
  constexpr float midpoints[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  std::uint8_t code = 0;
  while (code < 7 && v > midpoints[code]) ++code;
  if (code < 7 && v == midpoints[code] && code % 2 == 1) ++code;  // a tie: the even neighbour
  return code;
}

/// x (finite) as an e2m1 code.
constexpr std::uint8_t float_to_e2m1(float x) {
  const auto sign = static_cast<std::uint8_t>(std::signbit(x) ? 8 : 0);
  return sign | e2m1_magnitude_code(std::fabs(x));
}

/// Packs codes[i] (4 bits each) two a byte, value 2i in the low nibble of byte i.
template <int N>
constexpr void pack_pairs(const std::uint8_t* codes, std::uint8_t* qs) {
  for (int i = 0; i < N / 2; ++i) qs[i] = static_cast<std::uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
}

inline bool all_finite(const float* x, int n) {
  for (int i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

inline float absmax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

/// floor(log2(a)) for finite a > 0, subnormals included (exact: read from the bits).
inline int floor_log2(float a) {
  int e = 0;
  (void)std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  return e - 1;
}

}  // namespace detail

/// How a block packs its values two a byte: q4_0 puts its first half in the low nibbles
/// (value j in byte j's low nibble, value j + 16 in its high one), FP4 interleaves them
/// (value 2i in byte i's low nibble, 2i + 1 in its high one).
template <block_quantized_type B>
inline constexpr bool halves_in_nibbles = std::is_same_v<B, q4_0_block>;

/// The 4-bit nibble of value i of a block (q4_0: q; FP4: the e2m1 code).
template <block_quantized_type B>
constexpr std::uint8_t nibble(const B& b, int i) {
  if constexpr (halves_in_nibbles<B>) {
    const std::uint8_t byte = b.qs[i % 16];
    return i < 16 ? byte & 0xf : byte >> 4;
  } else {
    const std::uint8_t byte = b.qs[i / 2];
    return i % 2 == 0 ? byte & 0xf : byte >> 4;
  }
}

/// A block's scale as a float (NaN for its NaN code), the tensor scale not included.
inline float block_scale(const q4_0_block& b) { return static_cast<float>(b.d); }
inline float block_scale(const mxfp4_block& b) {
  if (b.e == e8m0_nan) return std::numeric_limits<float>::quiet_NaN();
  return std::bit_cast<float>(b.e == 0 ? 0x400000u : std::uint32_t{b.e} << 23);  // 2^(e - 127); e = 0: subnormal
}
inline float block_scale(const nvfp4_block& b) { return static_cast<float>(b.scale); }

/// The value a nibble stands for before scaling: q - 8 (q4_0) or the e2m1 value.
template <block_quantized_type B>
constexpr float nibble_value(std::uint8_t q) {
  if constexpr (std::is_same_v<B, q4_0_block>) return static_cast<float>(int{q} - 8);
  else return e2m1_values[q & 0xf];
}

/// Every nibble's value before scaling, by code: the one table the decoders scale per block
/// (arch/generic.hpp and the vector sets' dequantize_blocks).
template <block_quantized_type B>
inline constexpr std::array<float, 16> nibble_values = [] {
  std::array<float, 16> table{};
  for (int q = 0; q < 16; ++q) table[static_cast<std::size_t>(q)] = nibble_value<B>(static_cast<std::uint8_t>(q));
  return table;
}();

/// out[i] = value i of the block, i in [0, B::values): nibble_value * scale (NVFP4: times
/// tensor_scale, rounded once). Exact in float except as the header says for NVFP4.
template <block_quantized_type B>
void dequantize_block(const B& b, float* out, float tensor_scale = 1.0f) {
  float scale = block_scale(b);
  if constexpr (std::is_same_v<B, nvfp4_block>) {
    for (int i = 0; i < B::values; ++i) out[i] = nibble_value<B>(nibble(b, i)) * scale * tensor_scale;
  } else {
    for (int i = 0; i < B::values; ++i) out[i] = nibble_value<B>(nibble(b, i)) * scale;
  }
}

/// The block of B::values floats x, quantized as the header says (NVFP4: values mean
/// e2m1 * scale * tensor_scale; tensor_scale finite and > 0).
inline q4_0_block quantize_q4_0(const float* x) {
  q4_0_block b{};
  if (!detail::all_finite(x, q4_0_block::values)) {
    b.d = fp16::from_bits(0x7e00);  // NaN
    return b;
  }
  float m = 0.0f;  // the value of largest magnitude, sign kept (the first one on a tie)
  for (int i = 0; i < q4_0_block::values; ++i)
    if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
  constexpr float fp16_max = 65504.0f;
  const float d = static_cast<float>(fp16(std::fmax(-fp16_max, std::fmin(fp16_max, m / -8.0f))));
  b.d = fp16(d);
  std::uint8_t q[q4_0_block::values];
  for (int i = 0; i < q4_0_block::values; ++i)
    q[i] = d == 0.0f ? 8 : static_cast<std::uint8_t>(std::fmax(0.0f, std::fmin(15.0f, std::nearbyint(x[i] / d) + 8.0f)));
  for (int i = 0; i < 16; ++i) b.qs[i] = static_cast<std::uint8_t>(q[i] | (q[i + 16] << 4));
  return b;
}

inline mxfp4_block quantize_mxfp4(const float* x) {
  mxfp4_block b{};
  if (!detail::all_finite(x, mxfp4_block::values)) {
    b.e = e8m0_nan;
    return b;
  }
  const float a = detail::absmax(x, mxfp4_block::values);
  constexpr int e2m1_emax = 2, e8m0_min = -127, e8m0_max = 127;
  const int e = a == 0.0f ? e8m0_min : std::max(e8m0_min, std::min(e8m0_max, detail::floor_log2(a) - e2m1_emax));
  b.e = static_cast<std::uint8_t>(e + e8m0_bias);
  std::uint8_t codes[mxfp4_block::values];
  for (int i = 0; i < mxfp4_block::values; ++i) codes[i] = detail::float_to_e2m1(std::ldexp(x[i], -e));
  detail::pack_pairs<mxfp4_block::values>(codes, b.qs);
  return b;
}

inline nvfp4_block quantize_nvfp4(const float* x, float tensor_scale = 1.0f) {
  nvfp4_block b{};
  if (!detail::all_finite(x, nvfp4_block::values)) {
    b.scale = fp8_e4m3::from_bits(0x7f);  // NaN
    return b;
  }
  b.scale = fp8_e4m3(detail::absmax(x, nvfp4_block::values) / e2m1_max / tensor_scale);
  const float s = static_cast<float>(b.scale) * tensor_scale;
  std::uint8_t codes[nvfp4_block::values];
  for (int i = 0; i < nvfp4_block::values; ++i) codes[i] = s == 0.0f ? 0 : detail::float_to_e2m1(x[i] / s);
  detail::pack_pairs<nvfp4_block::values>(codes, b.qs);
  return b;
}

/// quantize_q4_0 / _mxfp4 / _nvfp4 by type.
template <block_quantized_type B>
B quantize_block(const float* x, float tensor_scale = 1.0f) {
  if constexpr (std::is_same_v<B, q4_0_block>) return quantize_q4_0(x);
  else if constexpr (std::is_same_v<B, mxfp4_block>) return quantize_mxfp4(x);
  else return quantize_nvfp4(x, tensor_scale);
}

/// The block type's name (kv_type_name of core/quantized_types.hpp, for 4-bit blocks).
template <block_pool_type B>
constexpr const char* kv_type_name() {
  if constexpr (std::is_same_v<B, q4_0_block>) return "q4_0";
  else if constexpr (std::is_same_v<B, mxfp4_block>) return "mxfp4";
  else if constexpr (std::is_same_v<B, nvfp4_block>) return "nvfp4";
  else if constexpr (std::is_same_v<B, hadamard_rotated<q4_0_block>>) return "hadamard_rotated<q4_0>";
  else if constexpr (std::is_same_v<B, hadamard_rotated<mxfp4_block>>) return "hadamard_rotated<mxfp4>";
  else return "hadamard_rotated<nvfp4>";
}

}  // namespace tileattn
