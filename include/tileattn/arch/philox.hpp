// tileattn/arch/philox.hpp: Philox 4x32-10, the counter-based generator behind attention
// dropout, and where each key's keep-or-drop decision comes from in its output.
//
// Philox 4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2,
// 3", SC11) maps a 128-bit counter and a 64-bit key to 128 random bits, a pure function: a
// decision can be made again anywhere (the backward regenerates the forward's) and depends
// on nothing but its coordinates, never on the tiling, the thread count or the ISA.
//
// Dropout's stream (DropoutRow). The key is the seed (low word, high word). For a query row
// the counter's words 1-3 are (query position, sequence * heads_q + head, offset); word 0
// numbers 8 calls per block of 128 keys (16 bytes each), laid out so that 8 calls side by
// side (one per 64-bit vector lane) give 64 decisions in key order from one permute and one
// byte compare:
//   key j of the row: block b = j / 128, m = j % 128, call l = (m / 4) % 8 (counter word
//   0 = 8 b + l), output word w = 2 (m / 64) + (m / 32) % 2, byte m % 4 of it (0: the low 8
//   bits); key j is dropped iff that byte u < threshold = min(round(p * 256), 255).
// So p takes effect in steps of 1/256, as in FlashAttention's CUDA kernels, which compare
// bytes too: the probability dropped is p' = threshold / 256, and the kept ones are scaled
// by 1 / (1 - p') (ops/dropout.hpp), so dropout leaves every output's expectation unchanged.
// Bytes rather than 16-bit numbers halve the Philox calls, the multiplies that bound the
// vector generator: at head_dim 64 the forward with dropout took 1.18-1.20x the one
// without on 16-bit numbers, over the 1.15x (docs/performance.md, "Dropout").
//
// dropout_keep_bits (generic below, the vector sets' own in arch/avx512/dropout_bits.hpp)
// writes each block's 128 decisions as two 64-bit words, bit m set where key 128 b + m is
// kept (blocks of 128 keys, not 256: a key tile of 128 keys wastes none of it);
// apply_keep_bits applies them to a row of probabilities (floats, or bf16 pairs).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "tileattn/core/half_types.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::arch {

inline constexpr std::uint32_t philox_m0 = 0xD2511F53u, philox_m1 = 0xCD9E8D57u;  // multipliers
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u, philox_w1 = 0xBB67AE85u;  // key bumps
inline constexpr int philox_rounds = 10;

/// One Philox 4x32 round: two 32 x 32 -> 64-bit products, their halves crossed and xored.
inline std::array<std::uint32_t, 4> philox_round(const std::array<std::uint32_t, 4>& c, std::uint32_t k0,
                                                 std::uint32_t k1) {
  const std::uint64_t p0 = std::uint64_t{philox_m0} * c[0], p1 = std::uint64_t{philox_m1} * c[2];
  return {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<std::uint32_t>(p1),
          static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<std::uint32_t>(p0)};
}

/// Philox 4x32-10 of counter c under key (k0, k1).
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c, std::uint32_t k0,
                                                  std::uint32_t k1) {
  for (int r = 0; r < philox_rounds; ++r) {
    if (r > 0) {
      k0 += philox_w0;
      k1 += philox_w1;
    }
    c = philox_round(c, k0, k1);
  }
  return c;
}

/// Keys per block of dropout's stream: 8 Philox calls, 4 words of 4 bytes each.
inline constexpr index_t dropout_block_keys = 128;
/// The 64-bit words of a block's keep bits.
inline constexpr index_t dropout_block_words = dropout_block_keys / 64;

/// One query row's dropout stream: the key (the seed) and counter words 1-3 every key of the
/// row shares, and the byte threshold below which a key is dropped.
struct DropoutRow {
  std::uint32_t key0 = 0, key1 = 0;
  std::uint32_t query = 0, stream = 0, offset = 0;
  std::uint32_t threshold = 0;  // 0..255
};

namespace generic {

/// The keep bits of `blocks` blocks of keys from block first_block on, for each of the `n`
/// rows streams[0..n) (one call's: the same key): row r's block b has its 128 decisions in
/// bits[r ld + 2 b + q] (keys 64 q .. 64 q + 63 of the block), bit set: kept.
inline void dropout_keep_bits(const DropoutRow* streams, index_t n, index_t first_block, index_t blocks,
                              std::uint64_t* bits, index_t ld) {
  for (index_t r = 0; r < n; ++r) {
    const DropoutRow& row = streams[r];
    for (index_t b = 0; b < blocks; ++b) {
      std::uint64_t word[2] = {0, 0};
      for (std::uint32_t call = 0; call < 8; ++call) {
        const auto c0 = static_cast<std::uint32_t>((first_block + b) * 8) + call;
        const auto out = philox4x32_10({c0, row.query, row.stream, row.offset}, row.key0, row.key1);
        for (std::uint32_t w = 0; w < 4; ++w)
          for (std::uint32_t h = 0; h < 4; ++h) {
            const std::uint32_t u = (out[w] >> (8 * h)) & 0xFFu;
            const std::uint32_t m = 64 * (w / 2) + 32 * (w % 2) + 4 * call + h;  // key of the block
            if (u >= row.threshold) word[m / 64] |= std::uint64_t{1} << (m % 64);
          }
      }
      for (int q = 0; q < 2; ++q) bits[r * ld + dropout_block_words * b + q] = word[q];
    }
  }
}

/// Whether bit `i` of `bits` is set.
inline bool keep_bit(const std::uint64_t* bits, index_t i) { return (bits[i >> 6] >> (i & 63)) & 1u; }

/// x[j] = x[j] * kept_scale where bit bit0 + j of `bits` is set (kept), else x[j] * 0, j < n:
/// dropout multiplies, as PyTorch's does, so a dropped NaN or Inf is NaN, as the references
/// have it (a row that sees a NaN makes the dV of every key it sees NaN, dropped or not).
inline void apply_keep_bits(float* x, index_t n, const std::uint64_t* bits, index_t bit0, float kept_scale) {
  for (index_t j = 0; j < n; ++j) x[j] *= keep_bit(bits, bit0 + j) ? kept_scale : 0.0f;
}

/// A dropped bf16 probability, x * 0 (x >= 0 or NaN): +0, or a quiet NaN for a NaN or Inf.
inline bf16 dropped(bf16 x) {
  return (x.bits & 0x7FFFu) >= 0x7F80u ? bf16::from_bits(static_cast<std::uint16_t>(x.bits | 0x0040u)) : bf16{};
}

/// The same for n keys of a row of bf16 pairs (key j: pair j / 2, low half for even j) of
/// probabilities, kept ones left as they are; halves past n untouched.
inline void apply_keep_bits(bf16x2* x, index_t n, const std::uint64_t* bits, index_t bit0) {
  for (index_t j = 0; j < n; ++j)
    if (!keep_bit(bits, bit0 + j)) {
      bf16& h = j % 2 ? x[j / 2].hi : x[j / 2].lo;
      h = dropped(h);
    }
}

}  // namespace generic
}  // namespace tileattn::arch
