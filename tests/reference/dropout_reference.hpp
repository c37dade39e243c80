// tests/reference/dropout_reference.hpp: attention dropout's decisions, written from the
// definitions alone (Philox 4x32-10 as published by Salmon et al., SC11, and the stream
// layout of DropoutOptions / arch/philox.hpp: the bytes of 8 calls a block of 128 keys),
// independently of the kernels' generator: the
// key schedule is computed per round (seed + r * bump) rather than bumped, and each key's
// counter and bits are found from its index one at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "tileattn/core/params.hpp"

namespace tileattn::reference {

/// Philox 4x32 with `rounds` rounds of counter c under key k.
inline std::array<std::uint32_t, 4> philox(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k,
                                           int rounds = 10) {
  for (int r = 0; r < rounds; ++r) {
    const std::uint32_t rk0 = k[0] + static_cast<std::uint32_t>(r) * 0x9E3779B9u;
    const std::uint32_t rk1 = k[1] + static_cast<std::uint32_t>(r) * 0xBB67AE85u;
    const unsigned __int128 a = static_cast<unsigned __int128>(c[0]) * 0xD2511F53u;
    const unsigned __int128 b = static_cast<unsigned __int128>(c[2]) * 0xCD9E8D57u;
    const auto a_hi = static_cast<std::uint32_t>(a >> 32), a_lo = static_cast<std::uint32_t>(a & 0xFFFFFFFFu);
    const auto b_hi = static_cast<std::uint32_t>(b >> 32), b_lo = static_cast<std::uint32_t>(b & 0xFFFFFFFFu);
    c = {b_hi ^ c[1] ^ rk0, b_lo, a_hi ^ c[3] ^ rk1, a_lo};
  }
  return c;
}

/// The byte of P[i, j] of query head `head` of sequence `sequence` (a call with `heads`
/// query heads): with m = j % 128, byte m % 4 of word 2 (m / 64) + (m / 32) % 2 of call
/// (m / 4) % 8 of its block.
inline std::uint32_t dropout_number(const DropoutOptions& d, std::int64_t sequence, std::int64_t heads,
                                    std::int64_t head, std::int64_t i, std::int64_t j) {
  const std::int64_t block = j / 128, m = j % 128;
  const std::int64_t call = (m / 4) % 8, word = 2 * (m / 64) + (m / 32) % 2, byte = m % 4;
  const std::array<std::uint32_t, 4> counter{static_cast<std::uint32_t>(block * 8 + call), static_cast<std::uint32_t>(i),
                                             static_cast<std::uint32_t>(sequence * heads + head),
                                             static_cast<std::uint32_t>(d.offset)};
  const auto out = philox(counter, {static_cast<std::uint32_t>(d.seed), static_cast<std::uint32_t>(d.seed >> 32)});
  const std::uint32_t x = out[static_cast<std::size_t>(word)];
  return (x >> (8 * byte)) % 256u;
}

/// The threshold: round(256 p), at most 255 (a key is dropped iff its byte is below).
inline double dropout_threshold(const DropoutOptions& d) {
  return std::min(std::round(static_cast<double>(d.p) * 256.0), 255.0);
}

/// Whether dropout keeps P[i, j]: its byte against the threshold.
inline bool dropout_keeps(const DropoutOptions& d, std::int64_t sequence, std::int64_t heads, std::int64_t head,
                          std::int64_t i, std::int64_t j) {
  if (d.p == 0.0f) return true;
  const double threshold = dropout_threshold(d);
  return static_cast<double>(dropout_number(d, sequence, heads, head, i, j)) >= threshold;
}

/// The factor dropout gives P[i, j]: 1 / (1 - p') kept, p' = threshold / 256 the probability
/// dropped (in float, as the kernels), 0 dropped.
inline double dropout_factor(const DropoutOptions& d, std::int64_t sequence, std::int64_t heads, std::int64_t head,
                             std::int64_t i, std::int64_t j) {
  if (d.p == 0.0f) return 1.0;
  if (!dropout_keeps(d, sequence, heads, head, i, j)) return 0.0;
  return static_cast<double>(static_cast<float>(256.0 / (256.0 - dropout_threshold(d))));
}

}  // namespace tileattn::reference
